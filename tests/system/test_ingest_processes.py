"""The SDK's write path with real processes: agents contending for SQLite's one write lock wait
for it (BEGIN IMMEDIATE, inside the busy timeout) instead of failing, and a forked child never
writes through the connections it inherited (os.register_at_fork drops them)."""

from __future__ import annotations

import multiprocessing as mp
import os
import sqlite3
import threading
import time
import warnings

from sqlalchemy import func, select

from watchdog import Watchdog
from watchdog.store.engine import make_engine, sqlite_path
from watchdog.store.schema import events, runs

RECORDS = 120
AGENTS = 6
HOLD_S = 0.4  # how long a foreign writer keeps the write lock while the agents start


def _agent(url: str, opened, go, out) -> None:
    try:
        wd = Watchdog(url)
        outages: list[str] = []
        note = wd._note_outage
        wd._note_outage = lambda exc: (outages.append(str(exc)), note(exc))  # type: ignore[method-assign]
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # the SDK's outage warning fails the agent
            with wd.run(agent="contender", guards=False) as run:
                opened.wait(60)  # every run is open: now the foreign writer takes the lock
                go.wait(60)
                for i in range(RECORDS):
                    if i % 3:
                        run.record_tool("search", {"q": i}, ok=i % 7 != 0)
                    else:
                        run.step(tokens_in=1)
        out.put((run.id, wd.buffered, wd.dropped_events, wd.rejected_events, outages, None))
        wd.close()
    except BaseException as exc:  # noqa: BLE001 — reported to the parent
        out.put((None, None, None, None, None, repr(exc)))


def test_agents_contending_for_the_sqlite_write_lock_wait_for_it_and_lose_nothing(sqlite_url):
    ctx = mp.get_context("fork")
    opened, go, out = ctx.Barrier(AGENTS + 1), ctx.Barrier(AGENTS + 1), ctx.Queue()
    procs = [ctx.Process(target=_agent, args=(sqlite_url, opened, go, out)) for _ in range(AGENTS)]
    for p in procs:
        p.start()
    # A foreign writer holds the lock as the agents start: each one's first BEGIN IMMEDIATE waits
    # in the busy handler, then they all contend with each other.
    opened.wait(60)
    holder = sqlite3.connect(sqlite_path(sqlite_url), isolation_level=None, timeout=30)
    holder.execute("BEGIN IMMEDIATE")
    go.wait(60)
    time.sleep(HOLD_S)
    holder.execute("COMMIT")
    holder.close()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    engine = make_engine(sqlite_url)
    for run_id, buffered, dropped, rejected, outages, error in results:
        assert error is None, error
        assert (buffered, dropped, rejected, outages) == (0, 0, 0, [])
        with engine.connect() as conn:
            n = conn.execute(select(func.count()).select_from(events).where(events.c.run_id == run_id)).scalar_one()
            row = conn.execute(select(runs.c.steps, runs.c.tool_calls, runs.c.tool_errors, runs.c.last_seq)
                               .where(runs.c.id == run_id)).one()
        steps = len(range(0, RECORDS, 3))
        errors = sum(1 for i in range(RECORDS) if i % 3 and i % 7 == 0)
        assert n == RECORDS
        assert tuple(row) == (steps, RECORDS - steps, errors, RECORDS)
    engine.dispose()


def test_a_deferred_transaction_that_reads_then_writes_fails_where_the_sdks_waits(sqlite_url):
    """Why the SDK's writes BEGIN IMMEDIATE: a deferred transaction whose snapshot went stale
    fails at once on its first write (SQLITE_BUSY_SNAPSHOT), whatever the busy timeout; the
    SDK's transaction in the same spot waits for the lock and goes through."""
    path = sqlite_path(sqlite_url)
    wd = Watchdog(sqlite_url)
    try:
        with wd.run(agent="bot", guards=False) as run:
            run.step(tokens_in=1)
            deferred = sqlite3.connect(path, isolation_level=None, timeout=5)
            other = sqlite3.connect(path, isolation_level=None, timeout=5, check_same_thread=False)
            try:
                deferred.execute("BEGIN")
                deferred.execute("SELECT steps FROM runs WHERE id = ?", (run.id,)).fetchone()
                run.step(tokens_in=1)  # another writer commits after the deferred one's snapshot
                started = time.monotonic()
                try:
                    deferred.execute("UPDATE runs SET progress = 'x' WHERE id = ?", (run.id,))
                    failed = None
                except sqlite3.OperationalError as exc:
                    failed = str(exc)
                assert failed is not None and "locked" in failed
                assert time.monotonic() - started < 2  # not the busy timeout: no wait could help
                deferred.execute("ROLLBACK")

                other.execute("BEGIN IMMEDIATE")  # a foreign writer holds the lock for a moment
                release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
                release.start()
                started = time.monotonic()
                run.step(tokens_in=1)  # the SDK's BEGIN IMMEDIATE waits for it inside the busy timeout
                release.join()
                assert time.monotonic() - started >= 0.25
                assert (wd.buffered, wd.dropped_events) == (0, 0)
            finally:
                deferred.close()
                other.close()
        assert run.steps == 3
    finally:
        wd.close()


def test_a_child_forked_with_open_connections_opens_its_own(db_url):
    wd = Watchdog(db_url)
    try:
        with wd.run(agent="parent", guards=False) as run:
            run.step(tokens_in=1)  # the pool now holds an open connection the child inherits
            assert wd.writer.open_connections == 1
            pid = os.fork()
            if pid == 0:  # the child: report through the exit code only, never pytest's machinery
                code = 1
                try:
                    fresh = wd.writer.open_connections == 0 and wd.writer._idle == []
                    with wd.run(agent="child", guards=False) as kid:
                        for _ in range(30):
                            kid.step(tokens_in=1)
                    code = 0 if fresh and (wd.buffered, wd.dropped_events) == (0, 0) else 2
                finally:
                    os._exit(code)
            for _ in range(30):
                run.step(tokens_in=1)  # concurrently, through the parent's own connection
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            run.step(tokens_in=1)  # the parent's connection survived the child's exit
            assert wd.writer.open_connections == 1
        assert (wd.buffered, wd.dropped_events) == (0, 0)
    finally:
        wd.close()
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            steps = dict(conn.execute(select(runs.c.agent, runs.c.steps)).all())
    finally:
        engine.dispose()
    assert steps == {"parent": 32, "child": 30}
