"""Hostile review 3: a gateway's lock wait is bounded behind PgBouncer too.

The gateways (LiteLLM callback, MCP proxy) bound their lock waits so that another login's open
INSERT of a run id they are about to make refuses one call instead of stalling a thread for ever
(tests/system/test_review_gateway_locks_pg.py: enough stalled threads make every check fail
open). The bound was a session `SET lock_timeout` sent once, when a connection opens. Behind
PgBouncer's transaction pooling (which the store supports) a session setting lands on whichever
server connection ran that one transaction: the gateway's next transactions run on others, and
wait as long as the other login likes. (And the setting stays on that server connection for
whichever client of the login gets it next.) It must hold in every transaction, as the daemon's
`SET LOCAL` does (watchdog.store.engine.bound_lock_waits).
"""

from __future__ import annotations

import threading
import uuid

import pytest

from pg_support import RolesStore, raw
from watchdog import Watchdog
from watchdog.core.periods import utcnow
from watchdog.store import joined
from watchdog.store.engine import GATEWAY_LOCK_TIMEOUT_MS, GATEWAY_ROLE, row_locked

pytest.importorskip("psycopg")


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_gwpb").create() as s:
        yield s


def test_a_gateways_lock_wait_is_bounded_through_pgbouncer(store):
    from pgbouncer_proc import PgBouncer, binary

    if binary() is None:
        pytest.skip("pgbouncer is not installed")
    gw = store.logins["gw"]
    with PgBouncer(users=[gw], pool_size=3) as bouncer:
        url = bouncer.url(gw, store.db)
        wd = Watchdog(url, attest_socket="", lock_timeout_ms=GATEWAY_LOCK_TIMEOUT_MS)
        wd.store_role = GATEWAY_ROLE
        held = raw(store.url("a"))  # login a's open INSERT of the id the gateway will make
        other = raw(url)  # another client of the gateway's login (another worker, another thread)
        try:
            rid = f"held-{uuid.uuid4().hex[:12]}"
            wd.writer.query("SELECT 1")  # the gateway's connection opens: its SET ran on one server connection
            other.execute("SELECT 1")  # ...which another transaction of the login now holds (LIFO)
            held.execute("INSERT INTO runs (id, agent, status, kill_mode, host) "
                         "VALUES (%s, 'attacker', 'running', 'cooperative', 'elsewhere')", (rid,))
            outcome: list[BaseException | None] = []

            def make() -> None:
                run = wd.run(agent="gw-run", run_id=rid, guards=False)
                run.source = "litellm"
                try:
                    run.start()
                    outcome.append(None)
                except BaseException as exc:  # noqa: BLE001 — what it raised is the answer
                    outcome.append(exc)

            t = threading.Thread(target=make, daemon=True)
            t.start()
            t.join(timeout=15)  # far past GATEWAY_LOCK_TIMEOUT_MS
            stalled = t.is_alive()
        finally:
            held.rollback()
            held.close()
            other.rollback()
            other.close()
        t.join(timeout=30)
        wd.close()
        assert not stalled, "the gateway's INSERT waited on the other login's lock past 15 s"
        assert outcome and outcome[0] is not None and row_locked(outcome[0]), outcome


def test_a_gateways_witness_event_wait_is_bounded_through_pgbouncer(store):
    """The witness events (a joined run's steps and tool calls) go through the engine, not the
    Writer: an agent holding its own run's row locked makes their foreign key wait."""
    from pgbouncer_proc import PgBouncer, binary

    if binary() is None:
        pytest.skip("pgbouncer is not installed")
    gw = store.logins["gw"]
    agent = Watchdog(store.url("b"), attest_socket="")
    run = agent.run(agent="victim")
    run.start()
    with PgBouncer(users=[gw], pool_size=3) as bouncer:
        url = bouncer.url(gw, store.db)
        wd = Watchdog(url, attest_socket="", lock_timeout_ms=GATEWAY_LOCK_TIMEOUT_MS)
        hold = raw(store.url("b"))  # the runaway's own session, its row locked
        other = raw(url)
        try:
            with wd.engine.connect() as conn:  # the engine's connection opens (on one server connection)
                conn.exec_driver_sql("SELECT 1")
            other.execute("SELECT 1")  # ...which another transaction of the login now holds
            hold.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (run.id,))
            outcome: list[BaseException | None] = []

            def append() -> None:
                try:
                    joined.append_witness_event(wd.engine, run.id, source="litellm", kind="step", at=utcnow())
                    outcome.append(None)
                except BaseException as exc:  # noqa: BLE001
                    outcome.append(exc)

            t = threading.Thread(target=append, daemon=True)
            t.start()
            t.join(timeout=15)
            stalled = t.is_alive()
        finally:
            hold.rollback()
            hold.close()
            other.rollback()
            other.close()
        t.join(timeout=30)
        wd.close()
    run.end("completed", None, None)
    agent.close()
    assert not stalled, "the gateway's witness event waited on the run's row lock past 15 s"
    assert outcome and outcome[0] is not None and row_locked(outcome[0]), outcome
