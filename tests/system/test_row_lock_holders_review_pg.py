"""Hostile review of the daemon ending a session that holds a run's row (row_lockers, row_holders).

The worst outcome is the daemon ending an innocent session on a writer's prompting. Real server,
the real roles script, logins a, b (agents) and gw (the gateway), as test_row_lock_holders_pg.py.
"""

from __future__ import annotations

import psycopg
import pytest

from daemon_support import config, later, run_row
from pg_support import RolesStore, raw
from test_row_lock_holders_pg import _alive, _gateway_holds, _pid, _runaway
from watchdog.core import lifecycle as lc
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.engine import make_engine
from watchdog.store.row_lockers import row_lockers
from watchdog.store.schema import utcnow


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_lkr").create() as s:
        yield s


@pytest.fixture
def daemon(store, attest):
    a = attest(store.url("daemon"))
    eng = make_engine(store.url("daemon"))
    yield eng, a.sealer
    eng.dispose()


def test_a_key_share_holder_that_never_blocks_the_daemon_is_not_ended_with_the_gateway(store, daemon):
    """b holds its own run's row FOR KEY SHARE (what a foreign key check takes): that lock never
    conflicts with the daemon's writes (no-key UPDATEs, key-share inserts). A gateway then holds
    the same row with its witnessed event (FOR NO KEY UPDATE, compatible with b's): xmax is a
    multixact of both. Only the gateway's session keeps the daemon out; ending b too would let the
    gateway's holder get an innocent session ended."""
    eng, sealer = daemon
    rid = _runaway(store.url("b"))
    b = raw(store.url("b"))
    gw = None
    try:
        assert b.execute("SELECT id FROM runs WHERE id = %s FOR KEY SHARE", (rid,)).fetchone() == (rid,)
        gw = _gateway_holds(store, rid)
        tk = Ticker(eng, config(), Killer(), sealer=sealer)
        now = utcnow()
        assert tk.tick(now).locked == [rid]
        with eng.connect() as conn:
            named = {lk.login for lk in row_lockers(conn, rid)}
        assert named == {store.logins["gw"]}  # b's key share does not hold the row from the daemon
        rep = tk.tick(later(now, 1))
        assert [(r, p) for r, _, p in rep.ended_sessions] == [(rid, _pid(gw))]
        assert _alive(b)  # (a statement of b's own: its transaction stays open, its key share held)
        rep = tk.tick(later(now, 2))  # the daemon's no-key UPDATE does not wait on b's key share
        assert (rid, lc.MAX_COST) in rep.stops and run_row(eng, rid).status == lc.STOPPING
        assert _alive(b)
    finally:
        b.close()
        if gw is not None:
            gw.close()
