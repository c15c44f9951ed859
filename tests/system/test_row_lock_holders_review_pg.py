"""Hostile review of the daemon ending a session that holds a run's row (row_lockers, row_holders).

The worst outcome is the daemon ending an innocent session on a writer's prompting. Real server,
the real roles script, logins a, b (agents) and gw (the gateway), as test_row_lock_holders_pg.py.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from daemon_support import config, later, run_row
from pg_support import RolesStore, attested_daemon, raw
from test_row_lock_holders_pg import _alive, _gateway_holds, _holds_for_update, _pid, _runaway
from watchdog.store.joined import WITNESS_SEQ_BASE
from watchdog.core import lifecycle as lc
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.row_lockers import row_lockers
from watchdog.store.schema import utcnow


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_lkr").create() as s:
        yield s


@pytest.fixture
def daemon(store, attest):
    with attested_daemon(store, attest) as d:
        yield d


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
        # the daemon's no-key UPDATE does not wait on b's key share: the run stopped in that tick
        assert (rid, lc.MAX_COST) in rep.stops and run_row(eng, rid).status == lc.STOPPING
        assert _alive(b)  # (a statement of b's own: its transaction stays open, its key share held)
        assert _alive(b)
    finally:
        b.close()
        if gw is not None:
            gw.close()


def test_a_gateway_that_relocks_after_each_ending_keeps_the_run_from_being_stopped(store, daemon):
    """The ending's purpose: a gateway's credential no longer keeps another user's runaway from
    being stopped. But the run's step is taken only at the tick after the ending, and a new
    session of the same login (a reconnect, or one already queued on the row) took the lock in
    between: each holder was ended at its second tick, the run never stopped. Now the step is
    taken again at once after the ending, and a reconnect of a login already ended on this run is
    ended at its first miss."""
    eng, sealer = daemon
    rid = _runaway(store.url("b"))
    holders = [_gateway_holds(store, rid)]
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    now = utcnow()
    stopped, ended = False, 0
    try:
        for i in range(8):
            rep = tk.tick(later(now, i))
            ended += len(rep.ended_sessions)
            if (rid, lc.MAX_COST) in rep.stops:
                stopped = True
                break
            if not _alive(holders[-1]):
                holders.append(_gateway_holds(store, rid))  # the reconnect, before the next tick
        assert stopped, f"run never stopped in 8 ticks; {ended} gateway sessions ended"
        assert i == 1 and ended == 1  # the second tick ends the holder and stops the run
    finally:
        for h in holders:
            h.close()


def _queued(url: str, sql: str, params: tuple, autocommit: bool = False
            ) -> tuple[psycopg.Connection, threading.Thread, list]:
    """A session of `url`'s login whose statement waits on the row (in a thread: it blocks);
    `autocommit`: an honest short write, committed as soon as it gets the row."""
    conn = raw(url, autocommit=autocommit)
    if not autocommit:
        conn.execute("SELECT txid_current()")  # connected and in a transaction before it queues
    out: list = []

    def go() -> None:
        try:
            conn.execute(sql, params)
            out.append("got it")
        except psycopg.Error as exc:
            out.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return conn, t, out


def _waiting(store: RolesStore, pid: int) -> None:
    with raw(_super(store), autocommit=True) as c:
        for _ in range(200):
            if c.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == ("Lock",):
                return
            c.execute("SELECT pg_sleep(0.01)")  # polling the server for the waiter to queue, not proving absence
    raise AssertionError("the queued session never waited")


def _super(store: RolesStore) -> str:
    return store.base.set(database=store.db).render_as_string(hide_password=False)


def test_sessions_of_the_holders_login_queued_on_the_row_are_ended_with_it_and_the_run_stopped(store, daemon):
    """gw holds b's run's row, two more gw sessions wait on it (one behind the other): when the
    holder is ended the first waiter would take the row before the daemon's step. They are ended
    with it, the run is stopped in the same tick; b's own session queued on its row is left."""
    eng, sealer = daemon
    rid = _runaway(store.url("b"))
    holder = _gateway_holds(store, rid)
    ins = ("INSERT INTO events (run_id, seq, at, kind, tool, source) VALUES (%s, %s, now(), 'tool', 'search', "
           "'mcp')")
    q = [_queued(store.url("gw"), ins, (rid, WITNESS_SEQ_BASE + 1 + i)) for i in range(2)]
    pids = [_pid(holder)] + [_pid(c) for c, _, _ in q]
    for c, _, _ in q:
        _waiting(store, _pid(c))
    bq = _queued(store.url("b"), "SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,), autocommit=True)
    _waiting(store, _pid(bq[0]))
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    now = utcnow()
    try:
        assert tk.tick(now).locked == [rid]
        rep = tk.tick(later(now, 1))
        assert sorted(p for _, _, p in rep.ended_sessions) == sorted(pids)
        for _, t, out in q:
            t.join(10)
        for _, t, out in q:  # ended while waiting: never got the row
            assert out and isinstance(out[0], psycopg.OperationalError)
        bq[1].join(10)
        assert bq[2] == ["got it"] and _alive(bq[0])  # b's own short write: served, never ended
        assert rep.locked == [] and (rid, lc.MAX_COST) in rep.stops  # and the run stopped in that tick
        assert run_row(eng, rid).status == lc.STOPPING
    finally:
        holder.close()
        for c, t, _ in q + [bq]:
            c.close()


def test_honest_short_bursts_of_a_gateway_and_the_owner_are_never_ended(store, daemon):
    """gw witnesses on b's run and commits; b then holds its own row in a short transaction that
    a tick happens to meet, a new one each tick (a new transaction id each time): no session is
    ended, however many ticks in a row the daemon's write meets some lock."""
    eng, sealer = daemon
    rid = _runaway(store.url("b"))
    b = raw(store.url("b"))
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    now = utcnow()
    try:
        for i in range(5):
            gw = raw(store.url("gw"))
            gw.execute("INSERT INTO events (run_id, seq, at, kind, tool, source) VALUES (%s, %s, now(), 'tool', "
                       "'search', 'mcp')", (rid, WITNESS_SEQ_BASE + i))
            gw.commit()  # its witnessed event, committed at once
            assert b.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,)).fetchone() == (rid,)
            rep = tk.tick(later(now, i))
            assert rep.locked == [rid] and rep.ended_sessions == []
            assert _alive(gw) and _alive(b)
            b.rollback()  # b's burst ends before the next tick; the next one is another transaction
            gw.close()
        assert rid in [r for r, _ in tk.tick(later(now, 6)).stops]  # (the witnessed calls read as a loop)
    finally:
        b.close()


def test_a_second_daemons_login_and_a_writer_that_is_also_a_daemon_are_never_ended(store, daemon):
    """Another host's daemon with its own login (a member of the tables' owner), and a login that
    is both a gateway's and a member of the owner (an operator's), hold a run's row: alerted only,
    never ended; nor the daemon's own pool's other connection (test_row_lock_holders_pg.py)."""
    from sqlalchemy import text as sql
    eng, sealer = daemon
    tag = store.daemon.rsplit("_", 1)[-1]
    d2, mixed = f"aw_lkr_d2_{tag}", f"aw_lkr_mx_{tag}"
    with store.admin.connect() as conn:
        conn.execute(sql(f'CREATE ROLE "{d2}" LOGIN IN ROLE "{store.daemon}"'))
        conn.execute(sql(f'CREATE ROLE "{mixed}" LOGIN IN ROLE "{store.daemon}", "{store.gateway}"'))
    holders = []
    try:
        runs_ = [_runaway(store.url("a")), _runaway(store.url("b"))]
        for login, rid in zip((d2, mixed), runs_):
            url = store.base.set(username=login, database=store.db).render_as_string(hide_password=False)
            holders.append(_holds_for_update(url, rid))
        tk = Ticker(eng, config(), Killer(), sealer=sealer)
        now = utcnow()
        for i in range(4):
            rep = tk.tick(later(now, i))
            assert sorted(rep.locked) == sorted(runs_) and rep.ended_sessions == []
        assert all(_alive(h) for h in holders)
    finally:
        for h in holders:
            h.close()
        with store.admin.connect() as conn:
            for r in (d2, mixed):
                conn.execute(sql(f'DROP ROLE IF EXISTS "{r}"'))
