"""Issue 35: `events` partitioned by day on PostgreSQL (revision 0015), with the shipped roles script.

One database for the module, owned by a daemon login; two agent logins (A, B) in the agents'
role and a gateway login in the gateway's role. On partitions the evidence stays append-only,
each login's rows stay its own, (run_id, seq) stays unique (also across days and between two
writers racing for one number), a writer cannot pick its partition, and a row for a day with no
partition still lands. Retention drops a whole expired day: what a kept run had in it survives,
and the daemon's fold and the ledger read the same before and after. A separate database checks
the upgrade of a store with rows and the roles script's grants, and the downgrade.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import psycopg
import pytest
from sqlalchemy import text

from agent_procs import wait_until
from daemon_support import config, later, ticker
from pg_support import RolesStore
from watchdog import Watchdog
from watchdog.store import ledger, access, partitions, retention
from watchdog.store.engine import make_engine
from watchdog.store.joined import WITNESS_SEQ_BASE
from watchdog.store.schema import utcnow

class Store(RolesStore):
    def __init__(self, server: str):
        super().__init__(server, "aw_part")


def _make(pg_server_url, revision="head"):
    s = Store(pg_server_url).create(revision)
    return s, s.admin


def _drop(s, admin):
    s.drop()


@pytest.fixture(scope="module")
def store(pg_server_url):
    s, admin = _make(pg_server_url)
    try:
        yield s
    finally:
        _drop(s, admin)


def _raw(url: str, autocommit: bool = True):
    return psycopg.connect(url.replace("+psycopg", ""), autocommit=autocommit)


def _run(url: str, status: str = "running") -> str:
    rid = uuid.uuid4().hex
    ended = ", now()" if status not in ("running", "stopping", "paused") else ", NULL"
    with _raw(url) as conn:
        conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, source, ended_at) "
                     f"VALUES (%s, 'bot', %s, 'cooperative', 'h', now(), now(), 'sql'{ended})", (rid, status))
    return rid


def _event(conn, rid: str, seq: int, **extra) -> None:
    cols = ", ".join(["run_id", "seq", "at", "kind", *extra])
    marks = ", ".join(["%s", "%s", "now()", "'step'", *["%s"] * len(extra)])
    conn.execute(f"INSERT INTO events ({cols}) VALUES ({marks})", (rid, seq, *extra.values()))


def _where(store, rid: str) -> list[tuple[str, int]]:
    """(partition, seq) of each event of the run, read as the tables' owner."""
    with _raw(store.url("daemon")) as conn:
        return conn.execute("SELECT tableoid::regclass::text, seq FROM events WHERE run_id = %s ORDER BY seq",
                            (rid,)).fetchall()


def _today() -> str:
    return f"events_p{utcnow():%Y%m%d}"


def test_an_agents_event_lands_in_todays_partition_and_stays_as_written(store):
    rid = _run(store.url("a"))
    with _raw(store.url("a")) as conn:
        # A clock far ahead changes nothing: the server's time is the event's, and today's partition its home.
        conn.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 1, '2099-01-01 00:00:00+00', 'step')",
                     (rid,))
        for sql in ("UPDATE events SET kind = 'tool', tool = 'x' WHERE run_id = %s", "DELETE FROM events WHERE run_id = %s",
                    f"UPDATE {_today()} SET kind = 'heartbeat' WHERE run_id = %s",
                    f"DELETE FROM {_today()} WHERE run_id = %s", f"SELECT * FROM {_today()} WHERE run_id = %s",
                    f"SELECT * FROM {partitions.DEFAULT} WHERE run_id = %s"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql, (rid,))
        # Neither the id nor the partition key is the writer's to give.
        for col, value in (("id", 10**15), ("stored_at", "2001-01-01 00:00:00+00")):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"INSERT INTO events (run_id, seq, at, kind, {col}) VALUES (%s, 2, now(), 'step', %s)",
                             (rid, value))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"INSERT INTO {_today()} (run_id, seq, at, kind) VALUES (%s, 3, now(), 'step')", (rid,))
    assert _where(store, rid) == [(_today(), 1)]
    with _raw(store.url("daemon")) as conn:
        at, stored = conn.execute("SELECT at, stored_at FROM events WHERE run_id = %s", (rid,)).fetchone()
        assert at == stored and at.year == utcnow().year


def test_each_login_keeps_to_its_own_rows_on_partitions(store):
    mine, theirs = _run(store.url("a")), _run(store.url("b"))
    with _raw(store.url("a")) as conn:
        _event(conn, mine, 1)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # row-level security: not A's run
            _event(conn, theirs, 1)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the witnesses' range is the gateways'
            _event(conn, mine, WITNESS_SEQ_BASE, source="mcp")
    with _raw(store.url("gw")) as conn:
        _event(conn, mine, WITNESS_SEQ_BASE, source="mcp")  # a witnessed call of A's run
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # below the range: the writer's numbers
            _event(conn, mine, 7, source="mcp")
        seen = conn.execute("SELECT run_id, seq FROM events WHERE run_id IN (%s, %s)", (mine, theirs)).fetchall()
        assert seen == [(mine, WITNESS_SEQ_BASE)]  # the witnesses' numbers only, never A's own record
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT kind FROM events WHERE run_id = %s", (mine,))
    with _raw(store.url("b")) as conn:
        _event(conn, theirs, 1)  # B's own seq 1 is B's: A's seq 1 is another run's
    assert _where(store, mine) == [(_today(), 1), (_today(), WITNESS_SEQ_BASE)]


def test_a_seq_is_stored_once_across_days_and_between_racing_writers(store):
    rid = _run(store.url("a"))
    yesterday = utcnow() - dt.timedelta(days=1)
    partitions.ensure_ahead(make_engine(store.url("daemon")))
    with _raw(store.url("daemon")) as conn:  # the owner may date a row: one from yesterday's partition (or default)
        conn.execute("INSERT INTO events (run_id, seq, at, kind, stored_at) VALUES (%s, 1, %s, 'step', %s)",
                     (rid, yesterday, yesterday))
    with _raw(store.url("a")) as conn:
        with pytest.raises(psycopg.errors.UniqueViolation) as refused:
            _event(conn, rid, 1)
        assert refused.value.diag.constraint_name == "uq_events_run_id_seq"
    # Two open transactions of A numbering the same record: the second waits for the first, then is refused.
    first = _raw(store.url("a"), autocommit=False)
    _event(first, rid, 2)
    outcome: list[BaseException | None] = []

    def second():
        with _raw(store.url("a"), autocommit=False) as conn:
            try:
                _event(conn, rid, 2)
                conn.commit()
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

    t = threading.Thread(target=second)
    t.start()
    _waits_for_a_lock(store, store.logins["a"])
    first.commit()
    first.close()
    t.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.errors.UniqueViolation)
    assert [seq for _, seq in _where(store, rid)] == [1, 2]


def _waits_for_a_lock(store, login: str) -> None:
    # As the server's admin: pg_stat_activity shows another login's wait only to a superuser.
    with _raw(store.base.render_as_string(hide_password=False)) as watch:
        assert wait_until(lambda: watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'",
            (login,)).fetchone()[0] == 1, timeout_s=10)


def test_another_login_can_neither_freeze_a_runs_writes_nor_probe_its_numbers(store):
    """Review R1/R8: the seq-once lock was an advisory key listed in pg_locks; A took B's and held it."""
    mine, theirs = _run(store.url("a")), _run(store.url("b"))
    writer = _raw(store.url("b"), autocommit=False)  # B mid-transaction: its lock is held now
    _event(writer, theirs, 1)
    with _raw(store.url("a"), autocommit=False) as squatter:
        # Everything A can find and take: every advisory key listed, every runs row it may lock.
        squatter.execute("SELECT pg_advisory_lock(classid::int, objid::int) FROM pg_locks "
                         "WHERE locktype = 'advisory' AND objsubid = 2")
        squatter.execute("SELECT pg_advisory_lock((classid::bigint << 32) | objid::bigint) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1")
        assert squatter.execute("SELECT id FROM runs WHERE id = %s FOR NO KEY UPDATE", (theirs,)).fetchall() == []
        squatter.execute("SELECT id FROM runs FOR NO KEY UPDATE")
        writer.commit()
        with _raw(store.url("b")) as again:  # B's next writes go on while A holds all of it
            again.execute("SET statement_timeout = 5000")
            _event(again, theirs, 2)
            again.execute("UPDATE runs SET steps = steps + 1 WHERE id = %s", (theirs,))
        squatter.rollback()
        # A's probe of B's numbers: refused as RLS refuses, whether the number is taken or not.
        for seq in (1, 3):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                _event(squatter, theirs, seq)
            squatter.rollback()
        _event(squatter, mine, 1)
        squatter.commit()
    writer.close()
    assert [seq for _, seq in _where(store, theirs)] == [1, 2]


def test_two_racing_owner_transactions_store_a_seq_once(store):
    """Review R5: the tables' owner took no lock, so its two racing inserts both committed."""
    rid = _run(store.url("daemon"))
    first = _raw(store.url("daemon"), autocommit=False)
    _event(first, rid, 1)
    outcome: list[BaseException | None] = []

    def second():
        with _raw(store.url("daemon"), autocommit=False) as conn:
            try:
                _event(conn, rid, 1)
                conn.commit()
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

    t = threading.Thread(target=second)
    t.start()
    _waits_for_a_lock(store, store.daemon)
    first.commit()
    first.close()
    t.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.errors.UniqueViolation)
    assert outcome[0].diag.constraint_name == "uq_events_run_id_seq"
    assert [seq for _, seq in _where(store, rid)] == [1]


def test_a_row_for_a_day_without_partition_lands_and_moves_when_its_day_is_made(store):
    rid = _run(store.url("a"))
    ahead = utcnow() + dt.timedelta(days=partitions.DAYS_AHEAD + 3)
    with _raw(store.url("daemon")) as conn:
        conn.execute("INSERT INTO events (run_id, seq, at, kind, stored_at) VALUES (%s, 1, now(), 'step', %s)",
                     (rid, ahead))
    assert _where(store, rid) == [(partitions.DEFAULT, 1)]
    eng = make_engine(store.url("daemon"))
    try:
        made = partitions.ensure_ahead(eng, days_ahead=partitions.DAYS_AHEAD + 3)
        assert f"events_p{ahead:%Y%m%d}" in made
        assert partitions.ensure_ahead(eng, days_ahead=partitions.DAYS_AHEAD + 3) == []  # idempotent
    finally:
        eng.dispose()
    assert _where(store, rid) == [(f"events_p{ahead:%Y%m%d}", 1)]
    with _raw(store.url("a")) as conn:  # the triggers hold on the new partition too: seq 1 is taken
        with pytest.raises(psycopg.errors.UniqueViolation):
            _event(conn, rid, 1)


def _old_day(eng, days: int) -> partitions.DayPartition:
    day = (utcnow() - dt.timedelta(days=days)).date()
    with eng.begin() as conn:
        partitions._make_day(conn, day)
    with eng.connect() as conn:
        return next(p for p in partitions.day_partitions(conn) if p.lo.date() == day)


def test_retention_drops_an_expired_day_whole_and_the_fold_and_ledger_read_the_same(store):
    eng = make_engine(store.url("daemon"))
    wd = Watchdog(store.url("a"))
    try:
        old = _old_day(eng, 40)
        stamp = old.lo + dt.timedelta(hours=12)
        ended = [_run(store.url("a"), status="completed") for _ in range(3)]
        kept = wd.run("keeper", guards=False).start()  # still running: its old events stay
        kept.step(tokens_in=10, tokens_out=5, cost_eur=0.25)
        kept.record_tool("search", {"q": 1})
        with eng.begin() as conn:
            for rid in ended:
                conn.execute(text("UPDATE runs SET started_at = :t, ended_at = :t, last_seen_at = :t WHERE id = :r"),
                             {"t": stamp, "r": rid})
            rows = [{"r": rid, "s": n, "t": stamp} for rid in ended for n in range(1, 101)]
            rows += [{"r": kept.id, "s": 100 + n, "t": stamp} for n in range(20)]
            conn.execute(text("INSERT INTO events (run_id, seq, at, kind, tokens_in, cost_eur, stored_at) "
                              "VALUES (:r, :s, :t, 'step', 1, 0.01, :t)"), rows)
        # keep_days = 0: the leader's own retention would prune before the fold is read (it runs the same prune).
        cfg = config(store={"keep_days": 0}, agents={"keeper": {"max_steps": 1000}, "bot": {"max_steps": 1000}})
        tk = ticker(eng, cfg)
        now = utcnow()
        tk.tick(now)
        before_fold = list(tk.scanner.evidence.get(kept.id))
        keys = {"day": f"{now:%Y-%m-%d}", "month": f"{now:%Y-%m}"}
        with eng.connect() as conn:
            before_ledger = ledger.read_spend(conn, keys)
        rep = retention.prune(eng, now - dt.timedelta(days=30))
        assert rep.partitions == 1 and rep.runs == 3 and rep.events == 300
        with eng.connect() as conn:
            assert old.name not in {p.name for p in partitions.day_partitions(conn)}
            assert conn.execute(text("SELECT count(*) FROM events WHERE run_id = ANY(:ids)"),
                                {"ids": ended}).scalar() == 0
            assert conn.execute(text("SELECT count(*) FROM events WHERE run_id = :r"), {"r": kept.id}).scalar() == 22
            assert ledger.read_spend(conn, keys) == before_ledger
        tk.tick(later(now, 2))
        assert tk.scanner.evidence.get(kept.id) == before_fold
        cold = ticker(eng, cfg)  # a restarted daemon folds the kept run's whole history again: the same
        cold.tick(later(now, 4))
        assert cold.scanner.evidence.get(kept.id) == before_fold
        kept.step(tokens_in=1)  # and it keeps writing
        tk.tick(later(now, 6))
        assert tk.scanner.evidence.get(kept.id)[0] == before_fold[0] + 1
        kept.__exit__(None, None, None)
    finally:
        wd.close()
        eng.dispose()


def test_upgrade_keeps_rows_and_grants_and_downgrade_gives_one_table_back(pg_server_url):
    s, admin = _make(pg_server_url, revision="0014")
    try:
        eng = make_engine(s.url("daemon"))
        rid = _run(s.url("a"))
        with _raw(s.url("a")) as conn:
            _event(conn, rid, 1)
        with _raw(s.url("daemon")) as conn:
            conn.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 2, now() - interval '3 days', 'step')",
                         (rid,))
        access.upgrade(eng)  # no roles script run after it: the grants and policies came along
        with _raw(s.url("a")) as conn:
            _event(conn, rid, 3)
            with pytest.raises(psycopg.errors.UniqueViolation):
                _event(conn, rid, 1)
        where = _where(s, rid)
        three_days = f"events_p{utcnow() - dt.timedelta(days=3):%Y%m%d}"
        assert where == [(_today(), 1), (three_days, 2), (_today(), 3)]
        s.roles_script()  # and running it again after the upgrade works as before
        with _raw(s.url("b")) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                _event(conn, rid, 4)
        access.downgrade(eng, "0014")
        with _raw(s.url("daemon")) as conn:
            assert conn.execute("SELECT relkind FROM pg_class WHERE oid = 'events'::regclass").fetchone()[0] == "r"
            assert conn.execute("SELECT seq FROM events WHERE run_id = %s ORDER BY seq", (rid,)).fetchall() == [
                (1,), (2,), (3,)]
        with _raw(s.url("a")) as conn:
            _event(conn, rid, 4)
            with pytest.raises(psycopg.errors.UniqueViolation):
                _event(conn, rid, 4)
        access.upgrade(eng)
        assert [seq for _, seq in _where(s, rid)] == [1, 2, 3, 4]
        eng.dispose()
    finally:
        _drop(s, admin)


def test_an_open_transaction_makes_retention_leave_the_day_quickly_and_drop_it_later(store):
    """Review R2/R9: one idle-in-transaction writer made the DETACH fail after 2 s at every tick,
    queuing every writer behind it, and the error escaped before any row was deleted."""
    import time

    eng = make_engine(store.url("daemon"))
    try:
        old = _old_day(eng, 50)
        stamp = old.lo + dt.timedelta(hours=6)
        gone = _run(store.url("a"), status="completed")
        with eng.begin() as conn:
            conn.execute(text("UPDATE runs SET started_at = :t, ended_at = :t, last_seen_at = :t WHERE id = :r"),
                         {"t": stamp, "r": gone})
            conn.execute(text("INSERT INTO events (run_id, seq, at, kind, stored_at) VALUES (:r, :s, :t, 'step', :t)"),
                         [{"r": gone, "s": n, "t": stamp} for n in range(1, 11)])
        idle = _raw(store.url("a"), autocommit=False)  # an agent's transaction left open on events
        _event(idle, _run(store.url("a")), 1)
        busy = _run(store.url("b"))
        waits: list[float] = []
        stop = threading.Event()

        def writer():
            with _raw(store.url("b")) as conn:
                seq = 0
                while not stop.is_set():
                    seq += 1
                    t0 = time.perf_counter()
                    _event(conn, busy, seq)
                    waits.append(time.perf_counter() - t0)

        t = threading.Thread(target=writer)
        t.start()
        assert wait_until(lambda: len(waits) >= 5, timeout_s=10)
        t0 = time.perf_counter()
        rep = retention.prune(eng, utcnow() - dt.timedelta(days=30))
        took = time.perf_counter() - t0
        n = len(waits)
        assert wait_until(lambda: len(waits) >= n + 5, timeout_s=10)  # the writer goes on after it
        stop.set()
        t.join(10)
        assert rep.partitions_busy == old.name and rep.partitions == 0
        assert rep.runs >= 1 and rep.events >= 10  # the rows went one by one meanwhile
        assert took < 1.5, took
        assert max(waits) < 1.0, max(waits)  # was LOCK_TIMEOUT_MS = 2 s for every writer, at every tick
        with eng.connect() as conn:
            assert old.name in {p.name for p in partitions.day_partitions(conn)}
            assert conn.execute(text("SELECT count(*) FROM runs WHERE id = :r"), {"r": gone}).scalar() == 0
        # The leader's partition making gives up as quickly, and says so.
        t0 = time.perf_counter()
        with pytest.raises(partitions.Busy):
            partitions.ensure_ahead(eng, days_ahead=partitions.DAYS_AHEAD + 9)
        assert time.perf_counter() - t0 < 1.5
        idle.rollback()
        idle.close()
        rep = retention.prune(eng, utcnow() - dt.timedelta(days=30))
        assert rep.partitions_busy is None and rep.partitions >= 1
        with eng.connect() as conn:
            assert old.name not in {p.name for p in partitions.day_partitions(conn)}
        assert f"events_p{utcnow() + dt.timedelta(days=partitions.DAYS_AHEAD + 9):%Y%m%d}" in partitions.ensure_ahead(
            eng, days_ahead=partitions.DAYS_AHEAD + 9)
    finally:
        eng.dispose()


def test_a_partition_made_under_default_privileges_is_reached_only_through_events(store):
    """Review R12: the owner's default privileges gave the leader's new partition a grant, and a
    partition has no row-level security of its own: a confined login wrote it directly."""
    eng = make_engine(store.url("daemon"))
    day = (utcnow() + dt.timedelta(days=partitions.DAYS_AHEAD + 20)).date()
    with _raw(store.url("daemon")) as conn:
        conn.execute(f'ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO "{store.agents}", PUBLIC')
    try:
        with eng.begin() as conn:
            name = partitions._make_day(conn, day)
        rid = _run(store.url("a"))
        with _raw(store.url("a")) as conn:
            for sql in (f"INSERT INTO {name} (id, run_id, seq, at, kind, stored_at) "
                        f"VALUES (9223372036854775000, %s, 1, now(), 'step', '{day.isoformat()} 12:00+00')",
                        f"SELECT * FROM {name} WHERE run_id = %s", f"DELETE FROM {name} WHERE run_id = %s"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql, (rid,))
        with _raw(store.url("daemon")) as conn:
            acl, rls = conn.execute("SELECT relacl::text[], relrowsecurity FROM pg_class WHERE oid = to_regclass(%s)",
                                    (name,)).fetchone()
            assert rls and all(entry.startswith(f"{store.daemon}=") for entry in acl or []), acl
            # Every partition 0015 made is the same.
            assert conn.execute("SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                                "WHERE i.inhparent = 'events'::regclass AND NOT c.relrowsecurity").fetchone()[0] == 0
    finally:
        with _raw(store.url("daemon")) as conn:
            conn.execute(f'ALTER DEFAULT PRIVILEGES REVOKE ALL ON TABLES FROM "{store.agents}", PUBLIC')
        eng.dispose()


def test_retention_keeps_the_events_of_a_run_whose_keep_test_is_null(store):
    """Review finding 4: `NOT prunable` is NULL for an ended run with no ended_at: its events went with the day."""
    eng = make_engine(store.url("daemon"))
    try:
        old = _old_day(eng, 60)
        stamp = old.lo + dt.timedelta(hours=3)
        rid = _run(store.url("daemon"), status="completed")
        with eng.begin() as conn:
            conn.execute(text("UPDATE runs SET ended_at = NULL WHERE id = :r"), {"r": rid})
            assert conn.execute(text("SELECT ended_at FROM runs WHERE id = :r"), {"r": rid}).scalar() is None
            conn.execute(text("INSERT INTO events (run_id, seq, at, kind, stored_at) VALUES (:r, 1, :t, 'step', :t)"),
                         {"r": rid, "t": stamp})
        rep = retention.prune(eng, utcnow() - dt.timedelta(days=30))
        assert rep.partitions >= 1
        assert _where(store, rid) == [(partitions.DEFAULT, 1)]
    finally:
        eng.dispose()
