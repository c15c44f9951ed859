"""The change feed (migration 0012, watchdog.store.changes) on both backends, for real.

Every change of a run row and every new event of a run gives the run a new number, written by
the database; the feed reads the runs numbered above its cursor and nothing else. On
PostgreSQL, the agents' role (the shipped roles script) can neither set nor rewind the number,
and a number committed after a later one is still read.
"""

from __future__ import annotations

import importlib.util
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, event, func, select, text
from sqlalchemy.engine import Engine, make_url

from watchdog import Watchdog
from watchdog.core import lifecycle as lc
from watchdog.store import access
from watchdog.store.changes import ChangeFeed, high_water
from watchdog.store.engine import make_engine, read_connection
from watchdog.store.schema import runs, utcnow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "sql" / "postgres-roles.sql"
MIGRATION = ROOT / "migrations" / "versions" / "0012_change_feed.py"


def _read(engine: Engine, feed: ChangeFeed) -> list[str]:
    with read_connection(engine) as conn:
        return [c.id for c in feed.read(conn).changed]


def _start(wd: Watchdog, n: int = 1) -> list[str]:
    ids = []
    for _ in range(n):
        run = wd.run(agent="bot", guards=False)
        run.__enter__()
        ids.append(run.id)
    return ids


def _raw(engine: Engine):
    """A DBAPI connection of the store, in autocommit (SQLite: isolation_level None)."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        import sqlite3

        return sqlite3.connect(url.database, isolation_level=None, timeout=30)
    return psycopg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False), autocommit=True)


def test_the_migrations_active_statuses_are_the_lifecycles():
    spec = importlib.util.spec_from_file_location("_aw_0012", MIGRATION)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert set(m.ACTIVE) == set(lc.ACTIVE_STATUSES)


def test_only_the_runs_that_changed_are_read_and_an_idle_read_reads_nothing(wd, engine):
    ids = _start(wd, 20)
    feed = ChangeFeed()
    assert sorted(_read(engine, feed)) == sorted(ids)  # from 0: every run that changed
    cursor = feed.cursor
    assert _read(engine, feed) == [] and feed.cursor == cursor  # nothing new: nothing read, cursor kept
    touched = ids[3], ids[11], ids[17]
    with wd.run(agent="bot", guards=False) as other:  # a new run, stepped and ended
        other.step(model="m", tokens_in=1, tokens_out=1, cost_eur=0.001)
    raw = _raw(engine)
    try:
        ph = "?" if engine.dialect.name == "sqlite" else "%s"
        for rid in touched:
            raw.execute(f"UPDATE runs SET progress = 'half way' WHERE id = {ph}", (rid,))
    finally:
        raw.close()
    with read_connection(engine) as conn:
        batch = feed.read(conn)
    assert sorted(c.id for c in batch.changed) == sorted([*touched, other.id])
    assert batch.cursor == feed.cursor > cursor
    with engine.connect() as conn:
        assert batch.cursor == high_water(conn)
    ended = next(c for c in batch.changed if c.id == other.id)
    assert ended.status == lc.COMPLETED and not ended.active
    assert [c.change_seq for c in batch.changed] == sorted(c.change_seq for c in batch.changed)
    assert _read(engine, feed) == []


def test_an_event_alone_numbers_its_run(wd, engine):
    """A plain-SQL writer that appends an event and leaves its run row alone: the run changed."""
    [rid] = _start(wd)
    feed = ChangeFeed()
    _read(engine, feed)
    raw = _raw(engine)
    try:
        ph = "?" if engine.dialect.name == "sqlite" else "%s"
        raw.execute(f"INSERT INTO events (run_id, seq, at, kind) VALUES ({ph}, 99, '2026-01-01 00:00:00', 'heartbeat')",
                    (rid,))
    finally:
        raw.close()
    assert _read(engine, feed) == [rid]


def test_the_light_row_carries_what_the_deadlines_need(wd, engine):
    run = wd.run(agent="bot", guards=False, max_wall_s=60.0, heartbeat_timeout_s=30.0)
    run.__enter__()
    run.step(model="m", tokens_in=1, tokens_out=1, cost_eur=0.001)
    with read_connection(engine) as conn:
        [c] = ChangeFeed().read(conn).changed
        row = conn.execute(select(runs).where(runs.c.id == run.id)).one()
    assert (c.id, c.agent, c.status, c.host, c.pid, c.kill_mode) == (run.id, "bot", lc.RUNNING, row.host, row.pid,
                                                                     row.kill_mode)
    assert c.asked == {"max_wall_s": 60.0, "heartbeat_timeout_s": 30.0}
    assert c.started_s == pytest.approx(row.started_at.timestamp(), abs=1e-3)
    assert c.seen_s == pytest.approx(row.last_seen_at.timestamp(), abs=1e-3)
    assert c.stop_requested_s is None and c.paused_s is None and c.signal_stage is None and c.resumes == 0
    run.__exit__(None, None, None)


def test_a_restart_reads_from_zero_or_starts_from_one_snapshot(wd, engine):
    live = _start(wd, 3)
    with wd.run(agent="bot", guards=False) as done:
        pass
    first = ChangeFeed()
    seen = _read(engine, first)
    assert set(seen) == {*live, done.id}
    # A restarted daemon keeps nothing of the feed: a new one from 0 reads the same runs and
    # reaches the same cursor; `start` gives the active runs and the same high-water mark.
    again = ChangeFeed()
    assert set(_read(engine, again)) == set(seen) and again.cursor == first.cursor
    with read_connection(engine) as conn:
        batch = ChangeFeed().start(conn)
    assert sorted(c.id for c in batch.changed) == sorted(live) and batch.cursor == first.cursor
    # `since` starts a feed over from any cursor.
    with read_connection(engine) as conn:
        assert {c.id for c in first.read(conn, since=0).changed} == set(seen)


def test_a_number_committed_after_a_later_one_is_still_read(wd, engine):
    """PostgreSQL commits in any order: the feed re-reads the window below its cursor. (SQLite
    commits one writer at a time: the same story, in order.)"""
    a, b = _start(wd, 2)
    feed = ChangeFeed()
    _read(engine, feed)
    slow, fast = _raw(engine), _raw(engine)
    ph = "?" if engine.dialect.name == "sqlite" else "%s"
    try:
        if engine.dialect.name == "sqlite":
            slow.execute("BEGIN IMMEDIATE")
            slow.execute(f"UPDATE runs SET progress = 'slow' WHERE id = {ph}", (a,))
            slow.execute("COMMIT")
            fast.execute(f"UPDATE runs SET progress = 'fast' WHERE id = {ph}", (b,))
            assert sorted(_read(engine, feed)) == sorted([a, b])
            return
        slow.execute("BEGIN")
        slow.execute(f"UPDATE runs SET progress = 'slow' WHERE id = {ph}", (a,))  # takes its number now
        fast.execute(f"UPDATE runs SET progress = 'fast' WHERE id = {ph}", (b,))  # a later one, committed
        assert _read(engine, feed) == [b]
        slow.execute("COMMIT")
        assert _read(engine, feed) == [a]  # below the cursor, read once
        assert _read(engine, feed) == []
    finally:
        slow.close()
        fast.close()


def test_an_event_committed_after_a_later_one_is_still_folded(wd, engine):
    """The fold reads the events above its high-water mark; on PostgreSQL an event that took a
    lower id commits after a higher one it already folded: the window below the mark is checked
    (its count and id sum against the ids read there) and the late event is folded once. Two runs:
    one run's inserts are serialised on its row (the seq-once trigger, revision 0015), so the late
    commit is another run's."""
    from watchdog.daemon.trust.scan import Scanner

    a, b = _start(wd, 2)
    scanner = Scanner()
    with read_connection(engine) as conn:
        scanner.fold(conn, {a, b})
    slow, fast = _raw(engine), _raw(engine)
    ph = "?" if engine.dialect.name == "sqlite" else "%s"
    now = "strftime('%Y-%m-%d %H:%M:%f', 'now')" if engine.dialect.name == "sqlite" else "now()"
    insert = (f"INSERT INTO events (run_id, seq, at, kind, tool, args_hash, ok) "
              f"VALUES ({ph}, {ph}, {now}, 'tool', {ph}, 'h', true)")

    def fold() -> list[str]:
        with read_connection(engine) as conn:
            return [e.tool for e in scanner.fold(conn, {a, b})]

    try:
        if engine.dialect.name == "sqlite":  # one writer at a time: in order
            slow.execute(insert, (a, 101, "slow_tool"))
            fast.execute(insert, (b, 102, "fast_tool"))
            assert fold() == ["slow_tool", "fast_tool"]
            assert fold() == []
            return
        slow.execute("BEGIN")
        slow.execute(insert, (a, 101, "slow_tool"))  # takes its id now
        fast.execute(insert, (b, 102, "fast_tool"))  # a higher one, committed first
        assert fold() == ["fast_tool"]
        ids_reads: list[str] = []

        def spy(conn, cursor, statement, *args):
            if statement.lstrip().startswith("SELECT events.id") and "events.id <=" in statement:
                ids_reads.append(statement)

        event.listen(engine, "before_cursor_execute", spy)
        try:
            assert fold() == []  # the window's count and sum match what was read: its ids are not read
            assert ids_reads == []
        finally:
            event.remove(engine, "before_cursor_execute", spy)
        slow.execute("COMMIT")
        assert fold() == ["slow_tool"]  # below the mark, folded once
        assert fold() == []
        assert scanner.stats[a].tools == {"slow_tool": 1} and scanner.stats[b].tools == {"fast_tool": 1}  # once each
    finally:
        slow.close()
        fast.close()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_late_events_are_folded_after_the_fold_reads_fewer_hosts(engine):
    """A daemon that led (it folded every host's events) and now follows (its own host's only):
    the window's count and id sum must not be compared with ids it read of other hosts; two late
    events of its host whose ids sum like two of those are folded all the same."""
    from watchdog.daemon.trust.scan import Scanner
    from watchdog.store.schema import events as ev

    def run_on(conn, host: str) -> str:
        rid = uuid.uuid4().hex
        now = utcnow()
        conn.execute(runs.insert().values(id=rid, agent="bot", status="running", kill_mode="cooperative", host=host,
                                          started_at=now, last_seen_at=now))
        return rid

    def tool(conn, rid: str, eid: int, seq: int, name: str) -> None:
        conn.execute(ev.insert().values(id=eid, run_id=rid, seq=seq, at=utcnow(), kind=lc.EV_TOOL, tool=name,
                                        args_hash=name, ok=True))

    with engine.begin() as conn:
        mine, other = run_on(conn, "h1"), run_on(conn, "h2")
        base = (conn.execute(select(func.max(ev.c.id))).scalar() or 0) + 5000
        tool(conn, other, base, 1, "other_a")
        tool(conn, other, base + 3, 2, "other_b")
        tool(conn, mine, base + 10, 1, "first")
    scanner = Scanner()
    with read_connection(engine) as conn:
        scanner.fold(conn, {mine, other}, hosts=None)  # the leader: every host's events
    with engine.begin() as conn:  # ids taken before base + 10, committed after it was folded
        tool(conn, mine, base + 1, 2, "late_1")
        tool(conn, mine, base + 2, 3, "late_2")
    for _ in range(2):
        with read_connection(engine) as conn:
            scanner.fold(conn, {mine}, hosts={"h1"})  # a follower now: its own host's events
    assert scanner.stats[mine].tools == {"first": 1, "late_1": 1, "late_2": 1}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_no_writer_chooses_an_event_id_that_hides_the_later_ones(wd, engine):
    """The fold reads the events above the newest id it read. On SQLite an event at the largest
    id makes later rows take random ids, below that mark, for ever: the store refuses an id far
    above the newest (migration 0013; on PostgreSQL the roles have no grant on the id, see
    test_owners_pg) and an id's change; the daemon goes on folding what comes next."""
    from watchdog.daemon.trust.scan import Scanner

    (a,) = _start(wd, 1)
    scanner = Scanner()
    with read_connection(engine) as conn:
        scanner.fold(conn, {a})
    raw = _raw(engine)
    insert = ("INSERT INTO events (id, run_id, seq, at, kind, tool, args_hash, ok) "
              "VALUES (?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now'), 'tool', 'x', 'h', 1)")
    try:
        for big in (2**63 - 1, 2**62):
            with pytest.raises(Exception, match="the store's to give"):
                raw.execute(insert, (big, a, 50))
        raw.execute(insert, (None, a, 51))  # the store's id
        for column in ("id", "rowid", "oid", "_rowid_"):  # one column, four names
            with pytest.raises(Exception, match="never changes"):
                raw.execute(f"UPDATE events SET {column} = ? WHERE run_id = ?", (2**63 - 1, a))
        with pytest.raises(Exception, match="never changes"):  # an upsert that lands on the same row
            raw.execute(insert + " ON CONFLICT (run_id, seq) DO UPDATE SET rowid = 9223372036854775807",
                        (None, a, 51))
    finally:
        raw.close()
    run = wd.run("bot", guards=False).start()
    run.record_tool("search", {"q": 1})
    with read_connection(engine) as conn:
        assert sorted(e.tool for e in scanner.fold(conn, {a, run.id})) == ["search", "x"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_an_event_in_flight_is_folded_however_far_the_ids_moved_meanwhile(wd, engine, caplog):
    """A transaction took an event's id and has not committed; meanwhile writers moved the
    sequence on by more than the window's least width (nextval, or many inserts) and the fold
    passed far beyond it. The window stays open down to it until every transaction in flight
    then has ended: the event is folded when it commits. A transaction held open while more
    events than the window keeps were written is logged, and the window closes behind it."""
    import logging

    from watchdog.daemon.trust import latewindow
    from watchdog.daemon.trust.scan import Scanner

    a, b = _start(wd, 2)
    scanner = Scanner()

    def fold() -> list[str]:
        with read_connection(engine) as conn:
            return [e.tool for e in scanner.fold(conn, {a, b})]

    fold()
    slow, other = _raw(engine), _raw(engine)
    insert = ("INSERT INTO events (run_id, seq, at, kind, tool, args_hash, ok) "
              "VALUES (%s, %s, now(), 'tool', %s, 'h', true)")
    push = f"SELECT max(nextval(pg_get_serial_sequence('events', 'id'))) FROM generate_series(1, {latewindow.ID_OVERLAP + 1000})"
    try:
        slow.execute("BEGIN")
        slow.execute(insert, (a, 101, "in_flight"))  # its id is taken now
        other.execute(push)
        other.execute(insert, (b, 101, "later"))
        assert fold() == ["later"]
        other.execute(push)
        other.execute(insert, (b, 102, "later_still"))
        assert fold() == ["later_still"]
        slow.execute("COMMIT")
        assert fold() == ["in_flight"]
        assert fold() == [] and scanner.stats[a].tools == {"in_flight": 1}
        # Held open while more events than the window keeps were written: logged, then given up.
        caplog.set_level(logging.WARNING, logger="watchdog.tick")
        real = latewindow.MAX_WINDOW_EVENTS
        latewindow.MAX_WINDOW_EVENTS = 3
        try:
            slow.execute("BEGIN")
            slow.execute(insert, (a, 102, "held_open"))
            for seq in range(103, 109):
                other.execute(insert, (b, seq, "busy"))
                fold()
            assert any("stayed open" in r.getMessage() for r in caplog.records)
        finally:
            latewindow.MAX_WINDOW_EVENTS = real
            slow.execute("ROLLBACK")
    finally:
        slow.close()
        other.close()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_gateways_event_waiting_on_an_agents_lock_is_folded_when_it_commits(wd, engine):
    """The snapshot's xmax is the newest ended transaction + 1, not a bound on those running: an
    agent holds its run row FOR UPDATE, the MCP proxy's event for that run has taken its id and
    its transaction id and waits on the foreign key's lock; a newer transaction commits an event
    above it, an older one ends, the ids move 3,000 on. The proxy's event is folded when it commits."""
    import threading
    import time

    from watchdog.daemon.trust import latewindow
    from watchdog.daemon.trust.scan import Scanner

    r, r2, r3 = _start(wd, 3)
    scanner = Scanner()

    def fold() -> list[str]:
        with read_connection(engine) as conn:
            return [e.tool for e in scanner.fold(conn, {r, r2, r3})]

    insert = ("INSERT INTO events (run_id, seq, at, kind, tool, args_hash, ok) "
              "VALUES (%s, %s, now(), 'tool', %s, 'h', true)")
    push = f"SELECT max(nextval(pg_get_serial_sequence('events', 'id'))) FROM generate_series(1, {latewindow.ID_OVERLAP + 1000})"
    fold()
    older, newer, agent, proxy, other = (_raw(engine) for _ in range(5))
    try:
        older.execute("BEGIN")
        older.execute("SELECT pg_current_xact_id()")
        newer.execute("BEGIN")
        newer.execute("SELECT pg_current_xact_id()")
        agent.execute("BEGIN")
        agent.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (r,))
        committed = threading.Event()

        def gateway() -> None:  # its id and its transaction id now, then a wait on the agent's lock
            proxy.execute("BEGIN")
            proxy.execute(insert, (r, 1001, "proxied_call"))
            proxy.execute("COMMIT")
            committed.set()

        thread = threading.Thread(target=gateway)
        thread.start()
        time.sleep(0.5)
        assert not committed.is_set()
        newer.execute(insert, (r2, 1001, "newer"))
        newer.execute("COMMIT")
        assert fold() == ["newer"]
        older.execute("COMMIT")
        assert fold() == []
        other.execute(push)
        other.execute(insert, (r3, 1001, "later"))
        assert fold() == ["later"]
        agent.execute("COMMIT")
        thread.join(10)
        assert committed.is_set()
        assert fold() + fold() == ["proxied_call"]
    finally:
        for c in (older, newer, agent, proxy, other):
            c.close()


def test_the_sqlite_counter_only_grows(sqlite_url):
    engine = make_engine(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE change_counter SET seq = seq + 5"))
        for bad in ("UPDATE change_counter SET seq = 0", "DELETE FROM change_counter"):
            with pytest.raises(Exception, match="change counter"):
                with engine.begin() as conn:
                    conn.execute(text(bad))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT seq FROM change_counter")).scalar() == 5
    finally:
        engine.dispose()


def test_a_writer_cannot_rewind_its_runs_number_on_sqlite(sqlite_url):
    """(PostgreSQL: test_an_agent_role_can_neither_set_nor_rewind_the_number.)"""
    wd, engine = Watchdog(sqlite_url), make_engine(sqlite_url)
    try:
        [rid] = _start(wd)
        feed = ChangeFeed()
        _read(engine, feed)
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET change_seq = 0, progress = 'hidden' WHERE id = :r"), {"r": rid})
        assert _read(engine, feed) == [rid]
        with engine.begin() as conn:  # the counter's own number, forged onto another row: renumbered
            top = conn.execute(text("SELECT seq FROM change_counter")).scalar()
            conn.execute(text("UPDATE runs SET change_seq = :n, progress = 'again' WHERE id = :r"), {"n": top, "r": rid})
        assert _read(engine, feed) == [rid]
    finally:
        wd.close()
        engine.dispose()


# --- PostgreSQL: the shipped roles, real logins ------------------------------------------------


class _Roles:
    def __init__(self, server: str, tag: str):
        self.base = make_url(server)
        self.db, self.daemon, self.agents, self.gateway, self.viewer = (
            f"aw_feed_{tag}", f"aw_fd_{tag}", f"aw_fag_{tag}", f"aw_fgw_{tag}", f"aw_fvw_{tag}")
        self.login = f"aw_fa_{tag}"

    def url(self, user: str) -> str:
        return self.base.set(username=user, database=self.db).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def roles(pg_server_url: str) -> Iterator[_Roles]:
    r = _Roles(pg_server_url, uuid.uuid4().hex[:8])
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{r.daemon}" LOGIN'))
        conn.execute(text(f'CREATE DATABASE "{r.db}" OWNER "{r.daemon}"'))
    try:
        engine = make_engine(r.url(r.daemon))
        access.upgrade(engine)  # as the daemon's role: it owns the tables, the sequence, the functions
        engine.dispose()
        u = r.base
        done = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={r.agents}",
                               "-v", f"gateway_role={r.gateway}", "-v", f"viewer_role={r.viewer}",
                               "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432), "-U", u.username or "postgres",
                               "-d", r.db, "-f", str(SCRIPT)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        with admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{r.login}" LOGIN'))
            conn.execute(text(f'GRANT "{r.agents}" TO "{r.login}"'))
        yield r
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{r.db}" WITH (FORCE)'))
            for role in (r.login, r.agents, r.gateway, r.viewer, r.daemon):
                conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


def _pg(url: str):
    return psycopg.connect(url.replace("+psycopg", ""), autocommit=True)


REFUSED = (psycopg.errors.InsufficientPrivilege, psycopg.errors.CheckViolation)


def test_an_agent_role_can_neither_set_nor_rewind_the_number(roles):
    agent_url, daemon_url = roles.url(roles.login), roles.url(roles.daemon)
    wd = Watchdog(agent_url)
    try:
        run = wd.run(agent="bot", guards=False)
        run.__enter__()
        run.step(model="m", tokens_in=1, tokens_out=1, cost_eur=0.001)  # the agent's writes are numbered
        engine = make_engine(daemon_url)
        feed = ChangeFeed()
        assert _read(engine, feed) == [run.id]
        before = feed.cursor
        with _pg(agent_url) as agent:
            with pytest.raises(REFUSED):
                agent.execute("UPDATE runs SET change_seq = 0 WHERE id = %s", (run.id,))
            for forged in ("SELECT setval('aw_change_seq', 1)", "SELECT nextval('aw_change_seq')",
                           "ALTER SEQUENCE aw_change_seq RESTART WITH 1", "UPDATE change_counter SET seq = 0",
                           "DROP TRIGGER zz_aw_change_seq ON runs"):
                with pytest.raises((*REFUSED, psycopg.errors.UndefinedTable)):
                    agent.execute(forged)
            # A number of the writer's choosing at insert is overwritten with the next one.
            rid = uuid.uuid4().hex
            agent.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, change_seq) "
                          "VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now(), 1)", (rid,))
            agent.execute("UPDATE runs SET progress = 'x' WHERE id = %s", (run.id,))
        with engine.connect() as conn:
            changed = {c.id: c.change_seq for c in ChangeFeed(before).read(conn).changed}
        assert set(changed) == {rid, run.id} and min(changed.values()) > before
        with engine.connect() as conn:
            assert high_water(conn) == max(changed.values())
        engine.dispose()
        run.__exit__(None, None, None)
    finally:
        wd.close()


def _numbers(daemon, rid: str) -> tuple:
    """The run's number in its row and in revision 0018's index of the numbers (None: no row)."""
    row = daemon.execute("SELECT r.change_seq, c.change_seq, c.shard = r.shard FROM runs r "
                         "FULL JOIN run_changes c ON c.run_id = r.id WHERE %s IN (r.id, c.run_id)", (rid,)).fetchone()
    return tuple(row) if row else (None, None, None)


def test_a_records_update_of_its_run_is_hot_and_its_number_still_indexed(roles):
    """Revision 0018: no index of runs holds change_seq, so the SDK's record (its event and its
    run's counters, one statement) updates the run row HOT; the number is indexed in run_changes,
    equal to the row's after every write of the run: its record, an event alone, its deletion."""
    from watchdog.store.agent_writes import AgentSQL
    from watchdog.store.dialects import for_name

    agent_url, daemon_url = roles.url(roles.login), roles.url(roles.daemon)
    with _pg(agent_url) as agent, _pg(daemon_url) as daemon:
        indexed = daemon.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'runs' "
                                 "AND indexdef LIKE '%change_seq%'").fetchall()
        assert indexed == []
        rid = uuid.uuid4().hex
        agent.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at) "
                      "VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now())", (rid,))
        first = _numbers(daemon, rid)
        assert first[0] == first[1] and first[0] > 0 and first[2] is True
        event = (rid, 1, None, "tool", "search", "a" * 16, None, True, None, None, 0.2,
                 None, None, None, None, None, None, None, None, None)
        update = (0, 1, 0, 0, 0, 0.0, 0, 0, 0, 1, None, None, rid)
        with agent.transaction():
            for statement, params in AgentSQL(for_name("postgresql")).record(event, update):
                assert agent.execute(statement, params).fetchall()[0][0] == "running"
            upd, hot = agent.execute("SELECT pg_stat_get_xact_tuples_updated('runs'::regclass), "
                                     "pg_stat_get_xact_tuples_hot_updated('runs'::regclass)").fetchone()
        assert (upd, hot) == (1, 1)  # one update of the run row (the feed's own renumbering none), HOT
        second = _numbers(daemon, rid)
        assert second[0] == second[1] > first[0]
        # An event alone (a gateway's, a plain-SQL writer's) renumbers its run in both places.
        agent.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 2, now(), 'heartbeat')", (rid,))
        third = _numbers(daemon, rid)
        assert third[0] == third[1] > second[0]
        with engine_of(daemon_url) as conn:
            assert high_water(conn) == third[0]
        # A run row without its index row (written with the triggers off: a restore, a bulk load)
        # gets one at its next change, so the feed still reads it.
        daemon.execute("DELETE FROM run_changes WHERE run_id = %s", (rid,))
        agent.execute("UPDATE runs SET progress = 'x' WHERE id = %s", (rid,))
        fourth = _numbers(daemon, rid)
        assert fourth[0] == fourth[1] > third[0]
        daemon.execute("DELETE FROM runs WHERE id = %s", (rid,))  # retention's delete
        assert _numbers(daemon, rid) == (None, None, None)


class engine_of:
    """A read connection of a fresh engine, disposed on exit."""

    def __init__(self, url: str):
        self.engine = make_engine(url)

    def __enter__(self):
        self.conn = self.engine.connect()
        return self.conn

    def __exit__(self, *exc) -> None:
        self.conn.close()
        self.engine.dispose()


def test_no_writer_reads_or_writes_the_index_of_the_numbers(roles):
    """run_changes is the tables' owner's alone (the roles script grants nothing on it): no
    agent can read another's runs there, nor set, rewind or delete a number, nor drop its triggers."""
    with _pg(roles.url(roles.login)) as agent:
        for forged in ("SELECT * FROM run_changes", "UPDATE run_changes SET change_seq = 0",
                       "INSERT INTO run_changes VALUES ('x', 1, 0)", "DELETE FROM run_changes",
                       "TRUNCATE run_changes", "DROP TRIGGER zz_aw_run_changes_update ON runs",
                       "ALTER TABLE runs DISABLE TRIGGER zz_aw_run_changes_update"):
            with pytest.raises(REFUSED):
                agent.execute(forged)
