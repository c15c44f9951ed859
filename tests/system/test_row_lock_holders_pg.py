"""The daemon ends a confined writer's session that keeps a run's row locked from it (PostgreSQL).

The hole (a review): a gateway's login may append a witnessed event to ANY run; its insert locks
that run's row (0017's seq-once trigger) until its transaction ends. Left open, the run's stop
gave up its bounded wait every tick and the daemon only alerted: whoever holds a gateway's
credential kept another user's runaway from ever being stopped. The same for an agent's login on
its own run. Now the tick that meets the same transaction's lock a second time in a row ends that
session (watchdog.daemon.tick.row_holders), says so (an alert naming the login, an intervention),
and the run is stopped in that tick. Never the daemon's own login's session, nor a superuser's; and
a daemon whose login lacks pg_signal_backend only alerts, as before, and warns once.

Real server, the real roles script (pg_support.RolesStore), logins a and b (agents) and gw.
"""

from __future__ import annotations

import logging
import subprocess
import uuid

import psycopg
import pytest
from sqlalchemy import select, text

from daemon_support import alerts_of, config, later, run_row
from pg_support import RolesStore, attested_daemon, let_go, raw
from watchdog.core import lifecycle as lc
from watchdog.core.outcomes import AlertKind
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.engine import make_engine
from watchdog.store.joined import WITNESS_SEQ_BASE
from watchdog.store.schema import interventions, utcnow


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_lkh").create() as s:
        yield s


@pytest.fixture
def daemon(store, attest):
    with attested_daemon(store, attest) as d:
        yield d


def _runaway(url: str) -> str:
    """A plain-SQL run of the login of `url`, far over the default cost budget (2 EUR)."""
    rid = uuid.uuid4().hex
    with raw(url, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, cost_eur, "
                     "source) VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now(), 9.0, 'sql')", (rid,))
    return rid


def _gateway_holds(store: RolesStore, rid: str):
    """gw appends a witnessed event to `rid` (another owner's run: allowed) and leaves its transaction open."""
    holder = raw(store.url("gw"))
    holder.execute("INSERT INTO events (run_id, seq, at, kind, tool, source) VALUES (%s, %s, now(), 'tool', 'search', "
                   "'mcp')", (rid, WITNESS_SEQ_BASE))
    return holder


def _holds_for_update(url: str, rid: str):
    holder = raw(url)
    assert holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,)).fetchone() == (rid,)
    return holder


def _alive(conn) -> bool:
    """Whether the session still answers (a terminated backend's connection raises)."""
    try:
        return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def _pid(conn) -> int:
    return int(conn.info.backend_pid)


def _session_ended(eng) -> list:
    with eng.connect() as conn:
        return conn.execute(select(interventions).where(interventions.c.action == "session_ended")).all()


def _ended_within_three_ticks(store, eng, sealer, rid, holder, login_key):
    """Ticks until the holder's session is ended and the run stopped (the second); returns the ended alerts."""
    pid = _pid(holder)
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    now = utcnow()
    rep1 = tk.tick(now)
    assert rep1.locked == [rid] and rep1.ended_sessions == []  # a first miss may be a race: nothing ended
    assert _alive(holder)  # (its own statement: the holder's transaction is still open, its lock held)
    # The check above ran a statement in the holder's transaction, which leaves it open and locked.
    rep2 = tk.tick(later(now, 1))  # the same transaction holds it at a second tick in a row: ended
    assert rep2.ended_sessions == [(rid, store.logins[login_key], pid)]
    assert not _alive(holder)
    # and the run's step taken again at once, in that tick (review: taken only at the next one, a
    # reconnect of the same login took the row first each time; test_row_lock_holders_review_pg.py)
    assert rep2.locked == [] and (rid, lc.MAX_COST) in rep2.stops
    rep3 = tk.tick(later(now, 2))
    assert rep3.locked == [] and rep3.ended_sessions == []
    row = run_row(eng, rid)
    assert row.status == lc.STOPPING and row.stop_reason == lc.MAX_COST
    said = [a for a in alerts_of(eng) if a.dedupe_key.startswith(AlertKind.LOCKED.key(rid) + ":ended:")]
    assert len(said) == 1 and said[0].run_id is None
    assert f"«{store.logins[login_key]}»" in said[0].body and f"pid {pid}" in said[0].body
    assert "ended a session that held its row locked" in said[0].title
    # the plain "cannot be stopped" alert is not sent for a lock the daemon ended
    assert not [a for a in alerts_of(eng) if a.dedupe_key == AlertKind.LOCKED.key(rid)]
    audit = [r for r in _session_ended(eng) if rid in (r.detail or "")]
    assert len(audit) == 1 and f"pid {pid}" in audit[0].detail and audit[0].run_id is None
    return said


def test_the_roles_script_grants_the_daemons_login_pg_signal_backend(store):
    with store.admin.connect() as conn:
        assert conn.execute(text("SELECT pg_has_role(:d, 'pg_signal_backend', 'USAGE')"), {"d": store.daemon}).scalar()
        # and nothing that reads other sessions' queries: pg_locks and backend_xid are every login's
        assert not conn.execute(text("SELECT pg_has_role(:d, 'pg_read_all_stats', 'USAGE')"),
                                {"d": store.daemon}).scalar()


def test_a_gateway_holding_another_owners_run_row_open_is_ended_and_the_run_stopped(store, daemon):
    eng, sealer = daemon
    rid = _runaway(store.url("b"))
    holder = _gateway_holds(store, rid)
    try:
        _ended_within_three_ticks(store, eng, sealer, rid, holder, "gw")
    finally:
        holder.close()


def test_an_agent_holding_its_own_run_row_open_is_ended_and_its_run_stopped(store, daemon):
    eng, sealer = daemon
    rid = _runaway(store.url("a"))
    holder = _holds_for_update(store.url("a"), rid)
    try:
        _ended_within_three_ticks(store, eng, sealer, rid, holder, "a")
    finally:
        holder.close()


def test_an_agent_holding_its_row_in_a_savepoint_is_found_too(store, daemon):
    """A subtransaction's lock names the subtransaction's id in xmax (not the session's backend_xid):
    pg_locks maps it to its session all the same."""
    eng, sealer = daemon
    rid = _runaway(store.url("a"))
    holder = raw(store.url("a"))
    try:
        holder.execute("SELECT txid_current()")  # a top-level id of its own first
        holder.execute("SAVEPOINT s")
        holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,))
        _ended_within_three_ticks(store, eng, sealer, rid, holder, "a")
    finally:
        holder.close()


def test_two_sessions_sharing_the_lock_are_both_ended(store, daemon):
    """Two sessions of the agent's login each holding its run's row FOR SHARE: xmax is then a
    multixact, whose members (pg_get_multixact_members) name both sessions; both are ended."""
    eng, sealer = daemon
    rid = _runaway(store.url("a"))
    holders = [raw(store.url("a")) for _ in range(2)]
    try:
        for h in holders:
            h.execute("SELECT id FROM runs WHERE id = %s FOR SHARE", (rid,))
        tk = Ticker(eng, config(), Killer(), sealer=sealer)
        now = utcnow()
        assert tk.tick(now).ended_sessions == []
        rep = tk.tick(later(now, 1))
        assert sorted(p for _, _, p in rep.ended_sessions) == sorted(_pid(h) for h in holders)
        assert not any(_alive(h) for h in holders)
        assert (rid, lc.MAX_COST) in rep.stops  # in that very tick
        said = [a for a in alerts_of(eng) if a.dedupe_key.startswith(AlertKind.LOCKED.key(rid) + ":ended:")]
        assert len(said) == 2  # one per session ended
    finally:
        for h in holders:
            h.close()


def _superuser_url(store: RolesStore) -> str:
    return store.base.set(database=store.db).render_as_string(hide_password=False)


@pytest.mark.parametrize("who", ["daemon", "superuser"])
def test_the_daemons_own_login_or_a_superuser_holding_a_row_is_never_ended(store, daemon, who):
    eng, sealer = daemon
    rid = _runaway(store.url("a"))
    holder = _holds_for_update(store.url("daemon") if who == "daemon" else _superuser_url(store), rid)
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    now = utcnow()
    try:
        for i in range(4):
            rep = tk.tick(later(now, i))
            assert rep.locked == [rid] and rep.ended_sessions == []
            assert _alive(holder)
        said = [a for a in alerts_of(eng) if a.dedupe_key == AlertKind.LOCKED.key(rid)]
        assert len(said) == 1 and "cannot be stopped" in said[0].title  # the old alert, for a human
        login = store.daemon if who == "daemon" else store.base.username
        assert f"login «{login}» (pid {_pid(holder)})" in said[0].body  # naming who holds it
        assert not [a for a in alerts_of(eng) if a.dedupe_key.startswith(AlertKind.LOCKED.key(rid) + ":ended:")]
    finally:
        let_go(holder)
    rep = tk.tick(later(now, 5))
    assert (rid, lc.MAX_COST) in rep.stops


def test_a_short_transaction_each_tick_is_not_ended(store, daemon):
    """Two misses by two different transactions of the same login are no held lock: nothing ended
    at the second tick (the policy wants the same pid and transaction id)."""
    eng, sealer = daemon
    rid = _runaway(store.url("a"))
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    now = utcnow()
    holder = _holds_for_update(store.url("a"), rid)
    try:
        assert tk.tick(now).locked == [rid]
        holder.rollback()  # that transaction ends; another takes the lock before the next tick
        holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,))
        rep = tk.tick(later(now, 1))
        assert rep.locked == [rid] and rep.ended_sessions == [] and _alive(holder)
        rep = tk.tick(later(now, 2))  # that one held at two ticks in a row: ended
        assert [s[0] for s in rep.ended_sessions] == [rid] and not _alive(holder)
    finally:
        holder.close()


# -- without the grant -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bare(pg_server_url):
    """A store whose daemon login lacks pg_signal_backend (the roles script run as the tables'
    owner cannot grant it: it warns and goes on)."""
    with RolesStore(pg_server_url, "aw_lkn").create() as s:
        with s.admin.connect() as conn:
            conn.execute(text(f'REVOKE pg_signal_backend FROM "{s.daemon}"'))
        u = s.base
        done = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={s.agents}",
                               "-v", f"gateway_role={s.gateway}", "-v", f"viewer_role={s.viewer}",
                               "-h", str(u.host), "-p", str(u.port or 5432), "-U", s.daemon, "-d", s.db,
                               "-f", str(RolesStore.SCRIPT)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "could not grant pg_signal_backend" in done.stderr and f"GRANT pg_signal_backend TO" in done.stderr
        yield s


def test_without_pg_signal_backend_nothing_is_ended_the_old_alert_goes_out_and_one_warning(bare, attest, caplog):
    with bare.admin.connect() as conn:
        assert not conn.execute(text("SELECT pg_has_role(:d, 'pg_signal_backend', 'USAGE')"),
                                {"d": bare.daemon}).scalar()
    a = attest(bare.url("daemon"))
    eng = make_engine(bare.url("daemon"))
    runs = [_runaway(bare.url("b")), _runaway(bare.url("b"))]
    holders = [_gateway_holds(bare, rid) for rid in runs]
    tk = Ticker(eng, config(), Killer(), sealer=a.sealer)
    now = utcnow()
    try:
        with caplog.at_level(logging.WARNING, logger="watchdog.tick"):
            for i in range(4):
                rep = tk.tick(later(now, i))
                assert sorted(rep.locked) == sorted(runs) and rep.ended_sessions == []
        assert all(_alive(h) for h in holders)
        warned = [r for r in caplog.records if "pg_signal_backend" in r.getMessage()]
        assert len(warned) == 1 and "GRANT pg_signal_backend TO" in warned[0].getMessage()
        for rid in runs:  # the old alert, each once
            said = [x for x in alerts_of(eng) if x.dedupe_key == AlertKind.LOCKED.key(rid)]
            assert len(said) == 1 and f"«{bare.logins['gw']}»" in said[0].body
        assert _session_ended(eng) == []
    finally:
        for h in holders:
            let_go(h)
    rep = tk.tick(later(now, 5))
    assert sorted(r for r, _ in rep.stops) == sorted(runs)
    eng.dispose()
