"""Bounded connections: one small pool per agent process, and agents through a real
PgBouncer in transaction pooling mode, more of them than the server lets connect.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid

import psycopg
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from pgbouncer_proc import PgBouncer
from watchdog import Watchdog
from watchdog.core import lifecycle as lc
from watchdog.store.schema import runs

THREADS = 12


def test_threads_of_one_process_share_a_pool_of_two_connections(db_url, engine):
    wd = Watchdog(db_url, pool_size=2)
    errors = []
    start = threading.Barrier(THREADS)

    def agent():
        try:
            with wd.run(agent="threaded", guards=False) as run:
                start.wait(30)
                for i in range(25):
                    run.step(tokens_in=1)
                    run.record_tool("search", {"i": i})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=agent) for _ in range(THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [] and wd.buffered == 0 and wd.dropped_events == 0 and wd.rejected_events == 0
        assert 1 <= wd.writer.open_connections <= 2
    finally:
        wd.close()
    with engine.connect() as conn:
        rows = conn.execute(select(runs.c.status, runs.c.steps, runs.c.tool_calls)).all()
    assert sorted(rows) == [(lc.COMPLETED, 25, 25)] * THREADS


def test_a_pool_of_one_serialises_threads_instead_of_opening_more(sqlite_url):
    wd = Watchdog(sqlite_url, pool_size=1)
    try:
        with wd.run(agent="a", guards=False) as run:
            ts = [threading.Thread(target=lambda: [run.heartbeat("x") for _ in range(20)]) for _ in range(6)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
        assert wd.writer.open_connections == 1 and wd.buffered == 0
    finally:
        wd.close()
    with pytest.raises(ValueError, match="pool_size: expected an integer >= 1"):
        Watchdog(sqlite_url, pool_size=0)


@pytest.mark.postgres
def test_postgresql_server_sessions_of_a_threaded_agent_stay_within_its_pool(pg_migrated):
    """Counted on the server (pg_stat_activity), for a real agent process with 12 threads."""
    tag = f"aw-pool-{uuid.uuid4().hex[:8]}"
    code = textwrap.dedent(f"""
        import sys, threading
        from watchdog import Watchdog
        wd = Watchdog(sys.argv[1], pool_size=2)
        def agent():
            with wd.run(agent="threaded", guards=False) as run:
                for i in range(200):
                    run.record_tool("search", {{"i": i}})
        ts = [threading.Thread(target=agent) for _ in range({THREADS})]
        [t.start() for t in ts]; [t.join() for t in ts]
        print(wd.buffered + wd.dropped_events + wd.rejected_events)
        wd.close()
    """)
    admin = psycopg.connect(_conninfo(pg_migrated), autocommit=True)
    seen = []
    proc = subprocess.Popen([sys.executable, "-c", code, pg_migrated], stdout=subprocess.PIPE, text=True,
                            env={**_env(), "PGAPPNAME": tag})
    try:
        while proc.poll() is None:
            seen.append(admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                      (tag,)).fetchone()[0])
            time.sleep(0.02)
        out, _ = proc.communicate(timeout=120)
    finally:
        admin.close()
    assert proc.returncode == 0 and out.strip() == "0"
    assert max(seen) >= 1  # it was watched while it worked...
    assert max(seen) <= 3  # ...and never held more than its pool (2) and the overflow one


# -- through PgBouncer ------------------------------------------------------------------------------


def _conninfo(url: str, user: str | None = None) -> str:
    u = make_url(url)
    return f"host={u.host} port={u.port or 5432} user={user or u.username} dbname={u.database}"


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}


@pytest.fixture
def limited_role(pg_migrated):
    """A login role the server lets open at most LIMIT connections, allowed to write the store."""
    role = f"aw_lim_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(_conninfo(pg_migrated), autocommit=True)
    admin.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER CONNECTION LIMIT {LIMIT}')
    admin.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')
    admin.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    yield role
    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
    for _ in range(50):
        if admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (role,)).fetchone()[0] == 0:
            break
        time.sleep(0.1)
    admin.execute(f'DROP OWNED BY "{role}"')
    admin.execute(f'DROP ROLE "{role}"')
    admin.close()


LIMIT = 3
AGENTS = 10


@pytest.mark.postgres
@pytest.mark.slow
def test_more_agent_processes_than_the_server_allows_all_write_through_pgbouncer(pg_migrated, limited_role,
                                                                                   procs, tmp_path):
    dbname = make_url(pg_migrated).database
    # The limit is real: directly, the role gets LIMIT connections and no more.
    direct = [psycopg.connect(_conninfo(pg_migrated, limited_role)) for _ in range(LIMIT)]
    with pytest.raises(psycopg.OperationalError, match="too many connections for role"):
        psycopg.connect(_conninfo(pg_migrated, limited_role))
    for c in direct:
        c.close()

    with PgBouncer(users=[limited_role], pool_size=LIMIT) as bouncer:
        url = bouncer.url(limited_role, dbname)
        go = tmp_path / "go"
        agents = [procs.start("steady", url, wait=False, go=str(go), steps=15) for _ in range(AGENTS)]
        for a in agents:
            procs.ready(a, timeout_s=120)
        # Every agent is mid-run and holds its client connections: far more than the role may open.
        admin = psycopg.connect(_conninfo(pg_migrated), autocommit=True)
        try:
            server_side = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s",
                                        (limited_role,)).fetchone()[0]
        finally:
            admin.close()
        assert server_side <= LIMIT
        go.touch()
        for a in agents:
            assert a.wait(timeout_s=120) == 0, a.log() + bouncer.log()[-2000:]
        results = [a.result() for a in agents]
    assert all(r["status"] == lc.COMPLETED for r in results), results
    assert all(r["buffered"] == r["dropped"] == r["rejected"] == 0 for r in results), results
    assert all(1 <= r["open_connections"] <= 2 for r in results)
    admin = psycopg.connect(_conninfo(pg_migrated), autocommit=True)
    try:
        rows = admin.execute("SELECT status, steps, tool_calls FROM runs WHERE agent = 'steady'").fetchall()
    finally:
        admin.close()
    assert sorted(rows) == [("completed", 30, 30)] * AGENTS


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_pooled_session_the_server_ended_is_replaced_at_checkout_without_a_ping(db_url):
    """The pool checks a PostgreSQL connection by its socket, not by a SELECT 1 per checkout:
    an idle session the server ended (a restart, pg_terminate_backend) is replaced, never
    handed out; a live one is handed out without a round trip."""
    from sqlalchemy import event, text

    from watchdog.store.engine import make_engine

    engine = make_engine(db_url, pool_size=1, max_overflow=0)
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    try:
        with engine.connect() as conn:
            first = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        sent.clear()
        with engine.connect() as conn:  # the same live session, and no ping before the query
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar() == first
        assert sent == ["SELECT pg_backend_pid()"]
        with psycopg.connect(make_url(db_url).set(drivername="postgresql").render_as_string(False),
                             autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
            deadline = time.monotonic() + 30
            while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (first,)).fetchone()[0]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with engine.connect() as conn:  # no error: a new session
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar() != first
    finally:
        engine.dispose()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_session_on_a_descriptor_above_1024_is_handed_out(db_url):
    """The checkout's socket check works for any descriptor: a daemon holding a pidfd per local
    run has its database sockets above 1024, where select() would refuse every checkout."""
    import os
    import resource

    from sqlalchemy import text

    from watchdog.store.engine import make_engine

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2048 if hard == resource.RLIM_INFINITY else min(hard, 2048)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    held = []
    engine = make_engine(db_url)
    try:
        while len(held) < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        for _ in range(2):  # a new session, then the same one checked out again
            with engine.connect() as conn:
                assert conn.connection.driver_connection.fileno() >= 1024
                assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
