"""Several daemons on one store, in-process and fast: the host lease, the leader, the
per-host judgement and the adoption of hosts whose daemon is gone.

Hosts are simulated by name here (`Killer(host=...)`, run rows written with that
host); tests/system/test_cluster.py runs real daemons in real UTS namespaces. Races use
real processes started together on a barrier.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import uuid

import pytest
from sqlalchemy import insert, select, text, update

from agent_procs import wait_until
from daemon_support import SEALER, actions, alerts_of, config, later
from watchdog.core import lifecycle as lc
from watchdog.daemon.leases.cluster import Membership
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.leases.lease import AlreadyRunning, LeaseLost, PgLease, SqliteLease, lease_for
from watchdog.daemon.process.service import Daemon
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store import leases
from watchdog.store.engine import make_engine
from watchdog.store.schema import daemons, events, interventions, runs, utcnow

NO_DAEMON = "agent-watchdog: a host has no live daemon: its runs cannot be signalled"  # .format(host): unchanged


def _run(engine, host, *, steps=0, kill_mode="process", status="running"):
    """A run row on `host` with no process identity (so no daemon calls it lost here)."""
    rid = uuid.uuid4().hex
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id=rid, agent="bot", status=status, kill_mode=kill_mode, host=host,
                                         started_at=now, last_seen_at=now, steps=steps))
    return rid


def _tool_event(engine, rid, seq, tool="search", ok=True):
    with engine.begin() as conn:
        conn.execute(insert(events).values(run_id=rid, seq=seq, at=utcnow(), kind="tool", tool=tool, ok=ok,
                                           args_hash=f"h{seq}"))


def _ticker(engine, host, lease=None, cfg=None):
    return Ticker(engine, cfg or config(), Killer(host=host), membership=Membership(engine, host, lease),
                  sealer=SEALER)


_HELD: list = []


def _lease(engine, host):
    lease = lease_for(engine, host, tick_s=1.0, alive=lambda holder: True)
    lease.acquire()
    _HELD.append(lease)
    return lease


@pytest.fixture(autouse=True)
def _release_leases():
    """A failed test must not leave its advisory locks held by this process's sessions."""
    yield
    while _HELD:
        _HELD.pop().release()


# -- one daemon per host, even when started together --------------------------------------------


def _contender(url, host, barrier, results, release, state_dir):
    engine = make_engine(url)
    # One host: one state directory, whose lock file (watchdog.daemon.leases.hostlock) decides.
    daemon = Daemon(engine, config(daemon={"state_dir": state_dir}), killer=Killer(host=host))
    barrier.wait(timeout=60)
    try:
        daemon.acquire()
    except AlreadyRunning as exc:
        results.put(("refused", os.getpid(), exc.holder.pid if exc.holder else None, str(exc)))
        return
    except BaseException as exc:  # noqa: BLE001 — reported, never hidden
        results.put(("error", os.getpid(), None, repr(exc)))
        return
    results.put(("won", os.getpid(), None, ""))
    release.wait(60)
    daemon.release()


@pytest.mark.parametrize("round_", range(3))
def test_daemons_started_at_once_on_one_host_exactly_one_takes_the_lease(db_url, engine, round_, tmp_path):
    ctx = mp.get_context("fork")
    n = 4
    barrier, results, release = ctx.Barrier(n), ctx.Queue(), ctx.Event()
    host = f"race-{round_}"
    procs = [ctx.Process(target=_contender, args=(db_url, host, barrier, results, release, str(tmp_path)))
             for _ in range(n)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=90) for _ in range(n)]
    finally:
        release.set()
        for p in procs:
            p.join(30)
    won = [g for g in got if g[0] == "won"]
    refused = [g for g in got if g[0] == "refused"]
    assert len(won) == 1 and len(refused) == n - 1, got
    winner = won[0][1]
    for _, _, named, message in refused:
        assert named == winner  # the refusal names the holder's pid
        assert f"(pid {winner}, started " in message and message.endswith(f"on {host}; this one exits")


def test_a_lease_outlives_its_release_as_an_expired_row_naming_the_last_holder(db_url, engine):
    lease = _lease(engine, "h1")
    with engine.connect() as conn:
        row = leases.holder(conn, "h1")
        assert row.pid == os.getpid() and row.expires_at > leases.db_now(conn)
    lease.release()
    with engine.connect() as conn:
        row = leases.holder(conn, "h1")
        assert row.pid == os.getpid() and row.expires_at <= leases.db_now(conn)
        assert leases.orphans(conn, ["h1"]) == {"h1": leases.Holder.of(conn.execute(select(daemons)).one())}
    again = _lease(engine, "h1")  # released: a new daemon takes it at once
    again.release()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_dead_daemons_host_lock_is_free_at_once_and_its_host_is_adopted(db_url, engine):
    """The lock goes with the session: a crashed daemon's host counts as without a daemon at
    once, before its lease row expires, and a new daemon takes the lock."""
    first = _lease(engine, "h2")
    with engine.connect() as conn:
        assert leases.orphans(conn, ["h2"]) == {}
    _kill_session(engine, first)  # the daemon dies: the server ends its session
    with engine.connect() as conn:
        assert "h2" in leases.orphans(conn, ["h2"])  # its row still looks live, its lock is gone
    second = PgLease(engine, "h2", tick_s=1.0)
    second.acquire()
    second.release()


def _kill_session(engine, lease) -> None:
    """End a lease's server session as a crash would, and wait until the server has."""
    pid = lease._conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    gone = lambda: engine.connect().execute(  # noqa: E731
        text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).scalar() == 0
    assert wait_until(gone, 30)


# -- one leader per store ---------------------------------------------------------------------


# SQLite is one host: the daemon holding the store's lock file there is its sole daemon and
# leader (issue 20: no row decides it); several hosts and their leader are PostgreSQL's.
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_exactly_one_leader_and_the_next_takes_over_when_it_goes(db_url, engine):
    hosts = ["ha", "hb", "hc"]
    held = {h: _lease(engine, h) for h in hosts}
    leaders = [h for h in hosts if held[h].refresh()]
    assert len(leaders) == 1
    for _ in range(2):  # stable
        assert [h for h in hosts if held[h].refresh()] == leaders
    with engine.connect() as conn:
        marked = conn.execute(select(daemons.c.host).where(daemons.c.leader_since.is_not(None))).scalars().all()
    assert marked == leaders
    old = leaders[0]
    held[old].release()
    rest = [h for h in hosts if h != old]
    new = [h for h in rest if held[h].refresh()]
    assert len(new) == 1  # at the next refresh of the survivors: within one tick
    for h in rest:
        held[h].release()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_released_lease_frees_its_locks_before_release_returns(db_url, engine):
    """Closing the socket frees the locks only once the server's backend has exited: the
    survivors' next try could still fail. release() frees them in its session first."""
    lease = _lease(engine, "ha")
    assert lease.refresh()  # the only daemon: leader
    keys = {leases.host_key("ha"), leases.LEADER_KEY}
    with engine.connect() as conn:
        assert keys <= leases.held_keys(conn)
    lease.release()
    with engine.connect() as conn:
        assert not keys & leases.held_keys(conn)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_leaders_read_of_other_hosts_is_its_session_check(db_url, engine):
    """With other hosts to check, the leader skips its ping: the read on its lease's session
    proves the session alive, and a dead one fails the tick's start as the ping would."""
    a = _lease(engine, "ha")
    member = Membership(engine, "ha", a)
    assert member.refresh({"hb": 3}).leader  # hb: no daemon ever, adopted
    _kill_session(engine, a)
    with pytest.raises(Exception):
        member.refresh({"hb": 3})
    assert not a.leader
    role = member.refresh({"hb": 3})  # the next tick takes the locks on a new session
    assert role.leader and "hb" in role.adopted
    a.release()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_read_that_fails_on_what_it_read_keeps_the_lease_session(db_url, engine):
    """Only an outage ends the lease's session (and frees its locks): a read on it that failed
    on its rows (which any store writer can shape) costs the tick, never the leadership."""
    a = _lease(engine, "ha")
    assert a.refresh()
    with pytest.raises(Exception):
        a.read(lambda conn: conn.execute(text("SELECT 1 / 0")).scalar())
    assert a._conn is not None and a.leader
    with engine.connect() as conn:
        assert {leases.host_key("ha"), leases.LEADER_KEY} <= leases.held_keys(conn)
    assert a.refresh()
    a.release()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_leader_whose_session_died_is_replaced_and_steps_down(db_url, engine):
    a, b = _lease(engine, "ha"), _lease(engine, "hb")
    assert a.refresh() and not b.refresh()
    _kill_session(engine, a)
    assert b.refresh()  # the lock went with a's session
    with pytest.raises(Exception):
        a.refresh()  # a finds its session gone: it is not leader this tick...
    assert not a.leader
    assert not a.refresh()  # ...and takes its host lock again, but b leads now
    a.release()
    b.release()


def test_a_daemons_row_rewritten_by_a_store_writer_is_written_again_never_obeyed(sqlite_url):
    """The lease is the daemon's lock file (issue 20): a row pointing at another process only
    gets written again; the daemon goes on leading (tests/system/test_lease_flock.py: the real daemon)."""
    engine = make_engine(sqlite_url)
    try:
        lease = SqliteLease(engine, "h1", tick_s=1.0)
        lease.acquire()
        with engine.begin() as conn:  # a store writer points the row at a process of its own
            conn.execute(update(daemons).values(pid=1, pid_create_time=1.0))
        lease.touch(utcnow(), None)
        assert lease.refresh() is True
        with engine.connect() as conn:
            assert leases.holder(conn, "h1").pid == os.getpid()
    finally:
        engine.dispose()


# -- each host judges its own runs; the leader adopts hosts without a daemon ------------------


# SQLite is one host: the daemon holding the store's lock file there is its sole daemon and
# leader (issue 20: no row decides it); several hosts and their leader are PostgreSQL's.
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_follower_judges_only_its_own_hosts_runs_and_reads_only_their_events(db_url, engine):
    la, lb = _lease(engine, "ha"), _lease(engine, "hb")
    ta, tb = _ticker(engine, "ha", la), _ticker(engine, "hb", lb)
    on_a = _run(engine, "ha", steps=50, kill_mode="cooperative")
    on_b = _run(engine, "hb", steps=50, kill_mode="cooperative")
    for i in range(3):
        _tool_event(engine, on_a, i + 1)
    rep_a = ta.tick(utcnow())
    rep_b = tb.tick(utcnow())
    assert rep_a.leader and not rep_b.leader
    assert rep_a.stops == [(on_a, lc.MAX_STEPS)] and rep_b.stops == [(on_b, lc.MAX_STEPS)]
    assert (rep_a.active, rep_b.active) == (1, 1)
    for i in range(3, 6):
        _tool_event(engine, on_a, i + 1)
    assert ta.tick(utcnow()).new_events == 3  # the leader reads every host's events (circuits)
    assert tb.tick(utcnow()).new_events == 0  # the follower none of another host's
    _tool_event(engine, on_b, 1)
    assert tb.tick(utcnow()).new_events == 1  # its own host's, yes...
    assert not tb.scanner.all_recent  # ...but no all-runs rate window: the leader's (soak: RSS stays flat)
    la.release()
    lb.release()


def test_the_leader_adopts_a_host_whose_daemon_is_gone_stops_cooperatively_and_alerts_once(db_url, engine):
    l1, l2 = _lease(engine, "h1"), _lease(engine, "h2")
    t1 = _ticker(engine, "h1", l1)
    assert l1.refresh()
    runaway = _run(engine, "h2", steps=50, kill_mode="process")
    t = utcnow()
    rep = t1.tick(t)
    assert rep.stops == [] and rep.adopted == ()  # h2 has a live daemon: its runs are its own
    l2.release()  # h2's daemon stops
    rep = t1.tick(later(t, 1))
    assert rep.adopted == ("h2",)
    assert rep.stops == [(runaway, lc.MAX_STEPS)]
    for s in (2, 5, 30, 60):  # far past the cancel grace: still never signalled
        t1.tick(later(t, s))
    assert actions(engine, runaway) == ["stop_requested"]
    restarted = _ticker(engine, "h1", l1)  # a restarted leader remembers nothing but the store
    restarted.tick(later(t, 61))
    titles = [a.title for a in alerts_of(engine)]
    assert titles.count(NO_DAEMON.format("h2")) == 1
    (alert,) = [a for a in alerts_of(engine) if a.title == NO_DAEMON.format("h2")]
    assert "host «h2»   active runs 1" in alert.body and f"last daemon: pid {os.getpid()}" in alert.body
    with engine.connect() as conn:
        (iv,) = conn.execute(select(interventions).where(interventions.c.action == "no_daemon")).all()
    assert iv.detail == "host h2" and iv.run_id is None
    l1.release()


def test_a_host_that_never_had_a_daemon_is_adopted_and_a_returning_daemon_takes_its_runs_back(db_url, engine):
    l1 = _lease(engine, "h1")
    t1 = _ticker(engine, "h1", l1)
    rid = _run(engine, "h9", steps=0, kill_mode="cooperative")
    assert t1.tick(utcnow()).adopted == ("h9",)
    l9 = _lease(engine, "h9")  # its daemon starts
    rep = t1.tick(utcnow())
    assert rep.adopted == () and rep.active == 0  # h9's run is its own daemon's again
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == rid).values(steps=50))
    assert t1.tick(utcnow()).stops == []
    assert _ticker(engine, "h9", l9).tick(utcnow()).stops == [(rid, lc.MAX_STEPS)]
    (alert,) = [a for a in alerts_of(engine) if a.title == NO_DAEMON.format("h9")]
    assert "no daemon of this store ever ran on it" in alert.body
    l1.release()
    l9.release()


# SQLite is one host: the daemon holding the store's lock file there is its sole daemon and
# leader (issue 20: no row decides it); several hosts and their leader are PostgreSQL's.
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_follower_never_adopts(db_url, engine):
    l1, l3 = _lease(engine, "h1"), _lease(engine, "h3")
    assert l1.refresh() and not l3.refresh()
    rid = _run(engine, "h2", steps=50, kill_mode="cooperative")
    rep = _ticker(engine, "h3", l3).tick(utcnow())
    assert not rep.leader and rep.adopted == () and rep.stops == []
    assert _ticker(engine, "h1", l1).tick(utcnow()).stops == [(rid, lc.MAX_STEPS)]
    l1.release()
    l3.release()
