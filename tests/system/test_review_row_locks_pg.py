"""Review (hostile): an agent login that holds its own run row's lock must not freeze the daemon.

Any confined login may `SELECT ... FOR UPDATE` its own run (it holds UPDATE on some columns and
row-level security lets it see the row). The daemon's stop request and the enforcer's exactly-once
read (`store.ladder.stage_now`, FOR UPDATE) then wait for that lock with no timeout, in the tick's
own thread: one idle transaction of one agent stalls the tick for every run of every login.
These tests wait (bounded) for the daemon's call to return, a positive event (fixed: the daemon's
lock waits are bounded, watchdog.store.engine.bound_lock_waits).
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest

from pg_support import RolesStore, let_go, raw
from watchdog.store import ladder, run_rows
from watchdog.store.engine import make_engine, row_locked

RETURN_WITHIN_S = 10.0  # far above the daemon's tick: a call blocked this long has frozen the daemon


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_lock").create() as s:
        yield s


def _raw(url: str, **kw):
    return raw(url, **kw)


def _run(url: str, status: str = "running") -> str:
    rid = uuid.uuid4().hex
    with _raw(url, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, source) "
                     "VALUES (%s, 'bot', %s, 'process', 'h', now(), now(), 'sdk')", (rid, status))
    return rid


def _returns(call) -> bool:
    """Whether call() returned (or raised) within RETURN_WITHIN_S."""
    done = threading.Event()

    def go():
        try:
            call()
        finally:
            done.set()

    threading.Thread(target=go, daemon=True).start()
    return done.wait(RETURN_WITHIN_S)


@pytest.mark.parametrize("step", ["stage_now", "request_stop"])
def test_an_agent_holding_its_run_row_lock_does_not_freeze_the_daemon(store, step):
    rid = _run(store.url("a"))
    engine = make_engine(store.url("daemon"))
    if step == "stage_now":
        with engine.begin() as conn:
            run_rows.request_stop(conn, rid, reason="max_steps", detail="d", outcome="o",
                               now=dt.datetime.now(dt.timezone.utc), by="test")
    holder = _raw(store.url("a"))  # the agent's transaction, left open
    try:
        assert holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,)).fetchone() == (rid,)

        raised: list[BaseException] = []

        def daemon_step():
            try:
                with engine.begin() as conn:
                    if step == "stage_now":
                        ladder.stage_now(conn, rid)
                    else:
                        run_rows.request_stop(conn, rid, reason="max_steps", detail="d", outcome="o",
                                           now=dt.datetime.now(dt.timezone.utc), by="test")
            except Exception as exc:  # noqa: BLE001 — what the tick sees: one run's lock, not an outage
                raised.append(exc)

        assert _returns(daemon_step), f"the daemon's {step} waited {RETURN_WITHIN_S} s on an agent's row lock"
        assert len(raised) == 1 and row_locked(raised[0])  # the bounded wait gave up, and says why
    finally:
        let_go(holder)  # releases the lock: the blocked thread finishes
        engine.dispose()
