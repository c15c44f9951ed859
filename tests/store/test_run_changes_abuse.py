"""Revision 0018's index of the change numbers (`run_changes`) under attack, on PostgreSQL with the
shipped roles script and real logins: two agents (a, b) and a gateway (gw). No writer has any
right on the index or its triggers, every way of writing a run keeps the two numbers equal, a
late commit is still read, one agent's open transaction never holds another's writes, and the
daemon's feed keeps working across a live upgrade to 0018."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Iterator

import psycopg
import pytest
import sqlalchemy.exc

from pg_support import RolesStore
from watchdog.store import access, change_index, scan
from watchdog.store.changes import LATE_READS, ChangeFeed
from watchdog.store.shards import Reach
from watchdog.store.engine import make_engine, read_connection

REFUSED = (psycopg.errors.InsufficientPrivilege, psycopg.errors.CheckViolation)
FUNCTIONS = ("aw_run_changes_insert", "aw_run_changes_update", "aw_run_changes_delete")


@pytest.fixture(scope="module")
def store(pg_server_url: str) -> Iterator[RolesStore]:
    s = RolesStore(pg_server_url, prefix="awrc").create()
    try:
        yield s
    finally:
        s.drop()


def _pg(url: str, **kw: Any) -> Any:
    return psycopg.connect(url.replace("+psycopg", ""), autocommit=True, **kw)


def _new_run(conn: Any) -> str:
    rid = uuid.uuid4().hex
    conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at) "
                 "VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now())", (rid,))
    return rid


def _skew(daemon: Any) -> list:
    """Every run whose number differs between runs and run_changes (or is in one only), or, from
    revision 0020, any column of its light copy there (change_index.LIGHT)."""
    light = [c for c in change_index.LIGHT if daemon.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'run_changes'::regclass AND attname = %s "
        "AND NOT attisdropped)", (c,)).fetchone()[0]]
    cols = ["change_seq", "shard", *light]
    return daemon.execute("SELECT r.id, c.run_id, r.change_seq, c.change_seq FROM runs r "
                          "FULL JOIN run_changes c ON c.run_id = r.id "
                          f"WHERE ROW({', '.join('r.' + c for c in cols)}) IS DISTINCT FROM "
                          f"ROW({', '.join('c.' + c for c in cols)})").fetchall()


def test_no_login_has_a_right_on_the_index_or_a_way_around_its_triggers(store):
    with _pg(store.url("daemon")) as daemon:
        configs = dict(daemon.execute("SELECT proname, proconfig FROM pg_proc WHERE proname = ANY(%s)",
                                      (list(FUNCTIONS),)).fetchall())
    assert configs == {f: ["search_path=pg_catalog, pg_temp"] for f in FUNCTIONS}
    for who in ("a", "b", "gw"):
        with _pg(store.url(who)) as conn:
            for priv in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"):
                assert conn.execute("SELECT has_table_privilege('run_changes', %s)", (priv,)).fetchone()[0] is False
            for f in FUNCTIONS:
                assert conn.execute("SELECT has_function_privilege(%s, 'EXECUTE')", (f + "()",)).fetchone()[0] is False
            for forged in ("TRUNCATE runs", "DELETE FROM runs", "SET session_replication_role = replica",
                           "ALTER TABLE runs DISABLE TRIGGER zz_aw_run_changes_update",
                           "ALTER TABLE runs DISABLE TRIGGER ALL",
                           "CREATE FUNCTION public.aw_run_changes_update() RETURNS trigger LANGUAGE sql AS $$ $$",
                           "CREATE TABLE public.aw_new_runs (id text)",
                           "CREATE OR REPLACE FUNCTION aw_run_changes_update() RETURNS trigger "
                           "LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
                           "CREATE TRIGGER zz_aw_run_changes_zz AFTER UPDATE ON runs FOR EACH STATEMENT "
                           "EXECUTE FUNCTION aw_run_changes_update()"):
                with pytest.raises((*REFUSED, psycopg.errors.UndefinedFunction)):
                    conn.execute(forged)
            for table in ("run_changes", "runs"):
                with pytest.raises(REFUSED):
                    with conn.transaction():
                        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            # pg_temp is searched last: a temporary table named as the transition table or the index
            # is never what the definer's function writes or reads.
            conn.execute("CREATE TEMP TABLE aw_new_runs (id text, change_seq bigint, shard smallint)")
            conn.execute("INSERT INTO aw_new_runs VALUES ('forged', 0, 0)")
            conn.execute("CREATE TEMP TABLE run_changes (run_id text, change_seq bigint, shard smallint)")
            rid = _new_run(conn)
            conn.execute("UPDATE runs SET progress = 'p' WHERE id = %s", (rid,))
            assert conn.execute("SELECT count(*) FROM pg_temp.run_changes").fetchone()[0] == 0
    with _pg(store.url("daemon")) as daemon:
        assert _skew(daemon) == []
        assert daemon.execute("SELECT count(*) FROM run_changes WHERE run_id = 'forged'").fetchone()[0] == 0


def test_every_way_of_writing_runs_keeps_the_two_numbers_equal(store):
    from watchdog.store.agent_writes import AgentSQL
    from watchdog.store.dialects import for_name

    with _pg(store.url("a")) as a, _pg(store.url("gw")) as gw, _pg(store.url("daemon")) as daemon:
        mine = [_new_run(a) for _ in range(3)]
        # An upsert of an existing run (the UPDATE arm) and of a new one (the INSERT arm), in one statement.
        fresh = uuid.uuid4().hex
        a.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at) "
                  "VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now()), "
                  "(%s, 'bot', 'running', 'cooperative', 'h', now(), now()) "
                  "ON CONFLICT (id) DO UPDATE SET progress = 'upserted'", (mine[0], fresh))
        assert _skew(daemon) == []
        # A multi-row UPDATE, and one in a writable CTE together with an event of the same run.
        a.execute("UPDATE runs SET steps = steps + 1 WHERE id = ANY(%s)", (mine,))
        assert _skew(daemon) == []
        a.execute("WITH u AS (UPDATE runs SET steps = steps + 1 WHERE id = ANY(%s) RETURNING id) "
                  "INSERT INTO events (run_id, seq, at, kind) SELECT u.id, 1, now(), 'heartbeat' FROM u", (mine[1:],))
        assert _skew(daemon) == []
        # Two statements of one transaction, the later number is the one kept; a savepoint rolled back.
        with a.transaction():
            a.execute("UPDATE runs SET steps = steps + 1 WHERE id = %s", (mine[0],))
            a.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 2, now(), 'heartbeat')", (mine[0],))
            try:
                with a.transaction():
                    a.execute("UPDATE runs SET steps = steps + 1 WHERE id = %s", (mine[2],))
                    raise RuntimeError
            except RuntimeError:
                pass
            a.execute("UPDATE runs SET steps = steps + 1 WHERE id = %s", (mine[0],))
        assert _skew(daemon) == []
        # The SDK's record and the gateway's witnessed event on a run it does not own.
        event = (mine[2], 3, None, "tool", "search", "a" * 16, None, True, None, None, 0.2,
                 None, None, None, None, None, None, None, None, None)
        update = (0, 1, 0, 0, 0, 0.0, 0, 0, 0, 3, None, None, mine[2])
        with a.transaction():
            for statement, params in AgentSQL(for_name("postgresql")).record(event, update):
                a.execute(statement, params)
        gw.execute("INSERT INTO events (run_id, seq, at, kind, source) VALUES (%s, %s, now(), 'heartbeat', 'mcp')",
                   (mine[1], 2 ** 30))
        assert _skew(daemon) == []
        # Retention deletes a run: its index row goes, and a run made again under its id is read.
        engine = make_engine(store.url("daemon"))
        try:
            feed = ChangeFeed()
            with read_connection(engine) as conn:
                feed.read(conn)
            daemon.execute("DELETE FROM runs WHERE id = %s", (fresh,))
            assert _skew(daemon) == []
            a.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at) "
                      "VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now())", (fresh,))
            a.execute("UPDATE runs SET progress = 'later' WHERE id = %s", (mine[0],))
            with read_connection(engine) as conn:
                assert {c.id for c in feed.read(conn).changed} == {fresh, mine[0]}
        finally:
            engine.dispose()
        assert _skew(daemon) == []


def test_a_number_committed_after_the_late_windows_reads_is_still_read(store):
    """A writer takes its number, then commits after LATE_READS reads of the feed that each
    passed later numbers: the next read reports it."""
    engine = make_engine(store.url("daemon"))
    try:
        with _pg(store.url("a")) as a, _pg(store.url("b")) as b:
            late, other = _new_run(a), _new_run(b)
            feed = ChangeFeed()
            with read_connection(engine) as conn:
                feed.read(conn)
            slow = psycopg.connect(store.url("a").replace("+psycopg", ""))
            try:
                slow.execute("UPDATE runs SET progress = 'slow' WHERE id = %s", (late,))  # the number, uncommitted
                for i in range(LATE_READS):
                    b.execute("UPDATE runs SET progress = %s WHERE id = %s", (str(i), other))
                    with read_connection(engine) as conn:
                        assert [c.id for c in feed.read(conn).changed] == [other]
                slow.commit()
            finally:
                slow.close()
            with read_connection(engine) as conn:
                assert [c.id for c in feed.read(conn).changed] == [late]
    finally:
        engine.dispose()


def test_one_agents_open_transaction_never_holds_anothers_writes(store):
    """Agent a holds its run's locks (an update, an event, FOR UPDATE, an advisory lock) in an open
    transaction; agent b's writes of its own runs, which upsert the same index and take numbers
    of the same sequence, do not wait (lock_timeout: a wait is an error, not a slow test)."""
    with _pg(store.url("a")) as setup:
        ra = _new_run(setup)
    holder = psycopg.connect(store.url("a").replace("+psycopg", ""))
    try:
        holder.execute("UPDATE runs SET steps = steps + 1 WHERE id = %s", (ra,))
        holder.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 1, now(), 'heartbeat')", (ra,))
        holder.execute("SELECT id FROM runs FOR UPDATE").fetchall()
        holder.execute("SELECT pg_advisory_xact_lock(0), pg_advisory_xact_lock(1)")
        with _pg(store.url("b"), options="-c lock_timeout=1000") as b:
            rb = _new_run(b)
            b.execute("UPDATE runs SET steps = steps + 1 WHERE id = %s", (rb,))
            b.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 1, now(), 'heartbeat')", (rb,))
            b.execute("UPDATE runs SET steps = steps + 1")  # every run it can see
    finally:
        holder.rollback()
        holder.close()


def _wait_for_lock_wait(daemon: Any, user: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if daemon.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'",
                          (user,)).fetchone()[0]:
            return
        time.sleep(0.01)
    raise AssertionError("the upgrade never waited for the writer's lock")


def test_a_write_committed_during_the_upgrade_to_0018_is_in_the_index(pg_server_url):
    """A writer's transaction open while `db upgrade` copies runs into run_changes commits a new
    number before the triggers exist: the index must hold it, or the feed of a daemon started
    after the upgrade misses that change. And a daemon that cached the pre-0018 source goes on
    reading every change after the upgrade."""
    with RolesStore(pg_server_url, prefix="awup").create("0017") as s:
        engine = make_engine(s.url("daemon"))
        try:
            with _pg(s.url("a")) as a:
                rid, other = _new_run(a), _new_run(a)
            feed = ChangeFeed()
            with read_connection(engine) as conn:
                assert {c.id for c in feed.read(conn).changed} == {rid, other}  # source cached: runs
            writer = psycopg.connect(s.url("a").replace("+psycopg", ""))
            try:
                writer.execute("UPDATE runs SET progress = 'during' WHERE id = %s", (rid,))
                done: list[BaseException | None] = []

                def upgrade() -> None:
                    try:
                        e = make_engine(s.url("daemon"))
                        access.upgrade(e)
                        e.dispose()
                        done.append(None)
                    except BaseException as exc:  # noqa: BLE001
                        done.append(exc)

                t = threading.Thread(target=upgrade)
                t.start()
                with _pg(s.url("daemon")) as watch:
                    _wait_for_lock_wait(watch, s.daemon)
                writer.commit()
                t.join(60)
                assert done == [None]
            finally:
                writer.close()
            with _pg(s.url("a")) as a:
                a.execute("UPDATE runs SET progress = 'after' WHERE id = %s", (other,))
            with read_connection(engine) as conn:
                assert {c.id for c in feed.read(conn).changed} == {rid, other}
            with _pg(s.url("daemon")) as daemon:
                assert _skew(daemon) == []
            # A daemon that found the index and a store taken back below 0018: loud, never blind.
            fresh = make_engine(s.url("daemon"))
            try:
                with read_connection(fresh) as conn:
                    ChangeFeed().read(conn)  # caches the index
                access.downgrade(fresh, "0017")
                with pytest.raises(sqlalchemy.exc.ProgrammingError, match="run_changes"):
                    with read_connection(fresh) as conn:
                        ChangeFeed().read(conn)
            finally:
                fresh.dispose()
        finally:
            engine.dispose()


def test_the_upgrade_after_0018_mends_an_index_row_left_behind(pg_server_url):
    """A store upgraded to 0018 with the race above (here: an index row set back by its owner, and
    one of a run that is gone) is mended by 0019."""
    with RolesStore(pg_server_url, prefix="awmd").create("0018") as s:
        with _pg(s.url("a")) as a:
            rid = _new_run(a)
            a.execute("UPDATE runs SET progress = 'x' WHERE id = %s", (rid,))
        with _pg(s.url("daemon")) as daemon:
            daemon.execute("UPDATE run_changes SET change_seq = 1 WHERE run_id = %s", (rid,))
            daemon.execute("INSERT INTO run_changes VALUES ('gone', 2, 0)")
            assert len(_skew(daemon)) == 2
            engine = make_engine(s.url("daemon"))
            access.upgrade(engine)
            engine.dispose()
            assert _skew(daemon) == []


def test_a_run_changes_table_a_writer_made_is_never_the_feeds_index(pg_server_url):
    """Before 0018, or wherever PUBLIC may create in the schema (PostgreSQL 14 and older by
    default), an agent can make a table named run_changes itself: the daemon must not read its
    feed from it (the agent's rows would decide which changes the daemon sees)."""
    with RolesStore(pg_server_url, prefix="awsq").create("0017") as s:
        with _pg(s.url("daemon")) as daemon:
            daemon.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")  # PostgreSQL 14's default
        with _pg(s.url("a")) as a:
            rid = _new_run(a)
            a.execute("CREATE TABLE public.run_changes (run_id varchar(32), change_seq bigint, shard smallint)")
            a.execute("GRANT SELECT ON public.run_changes TO PUBLIC")
            a.execute("INSERT INTO public.run_changes VALUES ('none', 9223372036854775000, 0)")
            engine = make_engine(s.url("daemon"))
            try:
                feed = ChangeFeed()
                with read_connection(engine) as conn:
                    assert [c.id for c in feed.read(conn).changed] == [rid]
                a.execute("UPDATE runs SET progress = 'later' WHERE id = %s", (rid,))
                with read_connection(engine) as conn:
                    assert [c.id for c in feed.read(conn).changed] == [rid]
            finally:
                engine.dispose()


def test_an_idle_writer_never_holds_the_upgrade_nor_the_writers_queued_behind_it(pg_server_url):
    """0019 locks runs against writers, and a lock request queues every later writer of the table
    behind it. An agent's transaction left idle with a change to its run must not make `db upgrade`
    (and so every agent's writes) wait for as long as it stays open: the upgrade gives up after a
    bounded wait, tries again, then fails naming the fix with nothing changed; once the idle
    transaction is gone it upgrades."""
    from watchdog.errors import StoreError

    with RolesStore(pg_server_url, prefix="awul").create("0018") as s:
        engine = make_engine(s.url("daemon"))
        try:
            with _pg(s.url("a")) as a:
                rid = _new_run(a)
            idle = psycopg.connect(s.url("a").replace("+psycopg", ""))
            try:
                idle.execute("UPDATE runs SET progress = 'idle' WHERE id = %s", (rid,))  # and left open
                with pytest.raises(StoreError, match="idle in transaction"):
                    access.upgrade(engine, lock_timeout_ms=100, tries=2, pause_s=0.0)
                assert access.current(engine) == "0018"
                with _pg(s.url("b")) as b:  # no lock of the upgrade's is left behind for writers
                    b.execute("SET lock_timeout = '1s'")
                    _new_run(b)
            finally:
                idle.close()
            access.upgrade(engine, lock_timeout_ms=100, tries=2, pause_s=0.0)
            assert access.current(engine) == access.head()
            with _pg(s.url("daemon")) as daemon:
                assert _skew(daemon) == []
        finally:
            engine.dispose()


def test_the_light_copy_follows_every_column_the_feed_reads(store):
    """Revision 0020: run_changes carries the feed's light columns, copied from the run row as
    stored by every kind of write (the skew checks each column), and the feed's reads of them
    read that table alone, in the order of its index: no probe of runs per changed run."""
    with _pg(store.url("a")) as a, _pg(store.url("daemon")) as daemon:
        rid = _new_run(a)
        a.execute("UPDATE runs SET steps = 3, tool_calls = 2, tokens_in = 5, tokens_out = 7, cost_eur = 0.5, "
                  "last_seen_at = now(), stop_requested_at = now(), status = 'stopping' WHERE id = %s", (rid,))
        a.execute("UPDATE runs SET paused_at = now(), parent_id = NULL WHERE id = %s", (rid,))
        daemon.execute("UPDATE runs SET signal_stage = 'term', signalled_at = now(), resumes = 1, max_steps = 9 "
                       "WHERE id = %s", (rid,))
        assert _skew(daemon) == []
        copy = daemon.execute("SELECT host, status, steps, max_steps, resumes FROM run_changes WHERE run_id = %s",
                              (rid,)).fetchone()
        assert copy == ("h", "stopping", 3, 9, 1)
    engine = make_engine(store.url("daemon"))
    try:
        with read_connection(engine) as conn:
            src = change_index.source(conn)
            assert src is change_index.COPIED
            tick_light = scan._light_select(conn, with_seq=True)
            from watchdog.store.changes import _light, _rendered

            for what, columns in (("tick light", tick_light), ("feed light", _light(conn))):
                assert src.reads_alone(columns)
                sql = _rendered(conn, src, what, columns)
                plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql.replace("%s", "0")))
                assert " runs" not in plan.replace("run_changes", ""), plan
            # A read that needs a column outside the copy still joins runs.
            from sqlalchemy import select
            from watchdog.store.schema import runs

            wide = select(runs.c.id, runs.c.change_seq, runs.c.labels)
            assert not src.reads_alone(wide) and "FROM runs JOIN run_changes" in str(src.rows(wide))
            got = ChangeFeed().read_rows(conn, "test wide", wide, i_id=0, i_seq=1)
            assert rid in got.ids
    finally:
        engine.dispose()


def test_a_writer_cannot_forge_the_host_it_is_judged_under(store):
    """The host a sharded judge confines its feed with is run_changes' copy of runs.host: the one
    the run registered with, which no login may change afterwards (the roles script's column
    grants), and which no writer can set in the index itself. A writer aiming its run at another
    judge's host (an update, an upsert's UPDATE arm, the index directly) is refused; the judge of
    that host never reads the run's changes, the judge of its own host does."""
    with _pg(store.url("a")) as a, _pg(store.url("gw")) as gw, _pg(store.url("daemon")) as daemon:
        rid = _new_run(a)
        for who, conn in (("a", a), ("gw", gw)):
            for forged in ("UPDATE runs SET host = 'judge-b' WHERE id = %s",
                           "INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at) "
                           "VALUES (%s, 'bot', 'running', 'cooperative', 'judge-b', now(), now()) "
                           "ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host",
                           "UPDATE run_changes SET host = 'judge-b' WHERE run_id = %s",
                           "INSERT INTO run_changes (run_id, change_seq, host) VALUES (%s, 9223372036854775000, 'judge-b')"):
                with pytest.raises(REFUSED, match="permission denied"):
                    conn.execute(forged, (rid,))
        a.execute("UPDATE runs SET steps = steps + 1 WHERE id = %s", (rid,))
        a.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 5, now(), 'heartbeat')", (rid,))
        assert daemon.execute("SELECT host FROM run_changes WHERE run_id = %s", (rid,)).fetchone() == ("h",)
        assert _skew(daemon) == []
    engine = make_engine(store.url("daemon"))
    try:
        theirs, mine = ChangeFeed(), ChangeFeed()
        no_buckets: list[int] = []
        with read_connection(engine) as conn:
            assert rid not in scan.changed_light(conn, theirs, Reach({"judge-b"}, no_buckets)).ids
            assert rid in scan.changed_light(conn, mine, Reach({"h"}, no_buckets)).ids
        with _pg(store.url("a")) as a:
            a.execute("UPDATE runs SET progress = 'again' WHERE id = %s", (rid,))
        with read_connection(engine) as conn:
            assert rid not in scan.changed_light(conn, theirs, Reach({"judge-b"}, no_buckets)).ids
            assert rid in scan.changed_light(conn, mine, Reach({"h"}, no_buckets)).ids
    finally:
        engine.dispose()


def test_truncating_runs_empties_the_index(pg_server_url):
    """TRUNCATE fires no DELETE trigger: revision 0020's own trigger empties run_changes with runs
    (a copy row left behind would be read alone as a run that is not there)."""
    with RolesStore(pg_server_url, prefix="awtr").create() as s:
        with _pg(s.url("a")) as a:
            _new_run(a)
        with _pg(s.url("daemon")) as daemon:
            assert daemon.execute("SELECT count(*) FROM run_changes").fetchone()[0] == 1
            daemon.execute("TRUNCATE runs CASCADE")
            assert daemon.execute("SELECT count(*) FROM run_changes").fetchone()[0] == 0
        engine = make_engine(s.url("daemon"))
        try:
            with read_connection(engine) as conn:
                assert ChangeFeed().read(conn).changed == ()
        finally:
            engine.dispose()


def test_the_upgrade_to_0020_copies_every_run_and_the_migration_copies_the_feeds_columns(pg_server_url):
    """A store at 0019 with runs (one of them written with the triggers off, its index row stale)
    upgraded to 0020: every run's copy equals its row. The migration's list of columns is the
    package's (a migration never imports the package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0020_run_changes_light.py"
    spec = importlib.util.spec_from_file_location("_aw_0020", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.LIGHT == change_index.LIGHT
    with RolesStore(pg_server_url, prefix="aw20").create("0019") as s:
        with _pg(s.url("a")) as a:
            ids = [_new_run(a) for _ in range(3)]
            a.execute("UPDATE runs SET steps = 2 WHERE id = %s", (ids[0],))
        with _pg(s.url("daemon")) as daemon:
            daemon.execute("UPDATE run_changes SET change_seq = 1 WHERE run_id = %s", (ids[1],))
            engine = make_engine(s.url("daemon"))
            try:
                access.upgrade(engine)
            finally:
                engine.dispose()
            assert _skew(daemon) == []
            assert daemon.execute("SELECT count(*) FROM run_changes WHERE host = 'h' AND agent = 'bot'"
                                  ).fetchone()[0] == 3
