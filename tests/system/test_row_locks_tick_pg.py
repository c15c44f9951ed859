"""An agent's login holding its own run row locked, against a whole tick (PostgreSQL).

The review (tests/system/test_review_row_locks_pg.py) showed the daemon's stop request and the
ladder's FOR UPDATE waiting on such a lock with no bound. Here: the tick gives up on that run
after the bounded wait, stops every other login's runaway in the same tick, reports the locked
run once (a log line, then one alert at the next tick that still finds it locked: there, since
the daemon ends an agent's session that holds its row at two ticks in a row, the alert says so)
and records and carries out its stop the first tick after the lock goes.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid

import pytest

from daemon_support import actions, alerts_of, config, later, run_row
from pg_support import RolesStore, attested_daemon, let_go, raw
from watchdog.core import lifecycle as lc
from watchdog.core.outcomes import AlertKind
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.engine import DAEMON_LOCK_TIMEOUT_MS
from watchdog.store.schema import utcnow

# A tick meets each locked run's bounded wait up to three times (its step, its retry after every
# other run, its report): far below this, and far below the 10 s of the review's "frozen".
TICK_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_lockt").create() as s:
        yield s


@pytest.fixture
def daemon(store, attest):
    with attested_daemon(store, attest) as d:
        yield d


def _raw(url: str, **kw):
    return raw(url, **kw)


def _runaway(url: str, status: str = "running") -> str:
    """A plain-SQL run of the login of `url`, far over the default cost budget (2 EUR)."""
    rid = uuid.uuid4().hex
    with _raw(url, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, cost_eur, "
                     "source) VALUES (%s, 'bot', %s, 'cooperative', 'h', now(), now(), 9.0, 'sql')", (rid, status))
        if status == lc.STOPPING:  # its writer asked for its stop itself (a run may: running -> stopping)
            conn.execute("UPDATE runs SET stop_reason = 'max_cost' WHERE id = %s", (rid,))
    return rid


def _timed_tick(tk: Ticker, now):
    t0 = time.monotonic()
    rep = tk.tick(now)
    return rep, time.monotonic() - t0


@pytest.mark.parametrize("status", [lc.RUNNING, lc.STOPPING])
def test_a_locked_run_costs_one_bounded_wait_and_the_others_are_stopped_in_the_same_tick(
        store, daemon, status, caplog):
    eng, sealer = daemon
    held_rid = _runaway(store.url("a"), status)
    other = _runaway(store.url("b"))
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    now = utcnow()
    holder = _raw(store.url("a"))  # the agent's transaction, left open on its own run's row
    try:
        assert holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (held_rid,)).fetchone() == (held_rid,)
        with caplog.at_level(logging.WARNING, logger="watchdog.tick"):
            rep, took_s = _timed_tick(tk, now)
        assert took_s < TICK_WITHIN_S, took_s
        assert (other, lc.MAX_COST) in rep.stops  # the other login's runaway: stopped in this very tick
        assert run_row(eng, other).status == lc.STOPPING
        assert rep.locked == [held_rid] and held_rid not in rep.quarantined
        assert [r for r in caplog.records if held_rid in r.getMessage() and "locked" in r.getMessage()]
        assert run_row(eng, held_rid).status == status and actions(eng, held_rid) == []  # nothing written yet

        # Still locked by the same transaction: tried again, and the agent's session is ended (its
        # login is a confined writer's; tests/system/test_row_lock_holders_pg.py), said once, and
        # the run's step taken again at once, in that tick (its lock gone with the session).
        rep2, took_s = _timed_tick(tk, later(now, 1))
        assert took_s < TICK_WITHIN_S and rep2.locked == []
        assert [(r, login) for r, login, _ in rep2.ended_sessions] == [(held_rid, store.logins["a"])]
        said = [a for a in alerts_of(eng) if a.dedupe_key.startswith(AlertKind.LOCKED.key(held_rid))]
        assert len(said) == 1 and said[0].run_id is None  # no column naming the run: its FK would wait too
        assert f"{DAEMON_LOCK_TIMEOUT_MS} ms" in said[0].body and held_rid in said[0].body
    finally:
        holder.close()  # its session is gone, and the lock with it
    rep4 = tk.tick(later(now, 3))
    assert rep4.locked == []
    row = run_row(eng, held_rid)
    assert row.status == lc.STOPPING and row.stop_reason == lc.MAX_COST
    assert actions(eng, held_rid).count("stop_requested") == 1  # recorded once, when the lock went
    if status == lc.STOPPING:
        assert (held_rid, lc.MAX_COST) in rep2.heard + rep4.heard  # its own request, acknowledged once
        return
    assert (held_rid, lc.MAX_COST) in rep2.stops
    tk.tick(later(now, 5))  # past the cancel grace: the cooperative run's ladder step is taken
    assert run_row(eng, held_rid).signal_stage == lc.Stage.NOT_SIGNALLED
    assert actions(eng, held_rid).count("stop_requested") == 1


def _waits(watch, login: str) -> bool:
    return watch.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'",
                         (login,)).fetchone()[0] > 0


def _let_go_at_the_second_wait(store, holder, seen: list[str]) -> None:
    """Hold the row through the daemon's first bounded wait, let go once it waits again: what a
    writer's record transaction slow on a loaded server does (committed a moment after the wait)."""
    deadline = time.monotonic() + 20
    with _raw(store.url("daemon"), autocommit=True) as watch:
        for want in (True, False, True):
            while _waits(watch, store.daemon) != want and time.monotonic() < deadline:
                time.sleep(0.005)
            seen.append("waiting" if want else "gave up")
    let_go(holder)


def test_a_row_its_writer_holds_only_briefly_is_stopped_in_the_same_tick(store, daemon):
    """A row found locked at this tick for the first time is most likely its writer's own short
    transaction: the run is tried once more after every other run, and its stop goes out in this
    tick, not the next (under load one of three runs of a spent daily budget was stopped a tick,
    5 s by default, late: tests/system/test_money.py)."""
    eng, sealer = daemon
    rid = _runaway(store.url("a"))
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    holder = _raw(store.url("a"))
    assert holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,)).fetchone() == (rid,)
    seen: list[str] = []
    t = threading.Thread(target=_let_go_at_the_second_wait, args=(store, holder, seen))
    t.start()
    try:
        rep = tk.tick(utcnow())
    finally:
        t.join(30)
    assert seen == ["waiting", "gave up", "waiting"]  # the first wait gave up; the second had the row
    assert (rid, lc.MAX_COST) in rep.stops and rep.locked == []
    assert run_row(eng, rid).status == lc.STOPPING
    assert actions(eng, rid).count("stop_requested") == 1


def test_the_receivers_event_insert_meets_the_seq_once_lock_and_gives_up_bounded(store, daemon):
    """0017's seq-once trigger locks each inserted event's run row (FOR NO KEY UPDATE): the OTLP
    receiver's insert for a run whose login holds its row waits on it too, bounded like the tick's
    (the request gets 503 and the exporter retries; the receiver's lock is not held forever)."""
    from watchdog.store import witness
    from watchdog.store.engine import bound_lock_waits, row_locked

    eng, _ = daemon
    rid = _runaway(store.url("a"))
    holder = _raw(store.url("a"))
    try:
        holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,))
        t0 = time.monotonic()
        with pytest.raises(Exception) as got:
            with eng.begin() as conn:
                bound_lock_waits(conn)
                witness.append(conn, rid, [witness.WitnessedCall(kind=lc.EV_TOOL, tool="search", ok=True)],
                               source=lc.Source.OTLP, now=utcnow(), joined=True)
        assert row_locked(got.value), repr(got.value)[:300]
        assert time.monotonic() - t0 < TICK_WITHIN_S
    finally:
        let_go(holder)
    with eng.begin() as conn:  # the lock gone, the same insert goes through
        bound_lock_waits(conn)
        assert witness.append(conn, rid, [witness.WitnessedCall(kind=lc.EV_TOOL, tool="search", ok=True)],
                              source=lc.Source.OTLP, now=utcnow(), joined=True)


def test_many_locked_runs_cost_a_tick_a_bounded_number_of_waits_and_each_is_tried_in_turn(
        store, daemon, monkeypatch):
    """A session holding many runs' rows: past locked.MAX_WAITS_PER_TICK waits a tick tries no
    more of them; the others come first, the locked ones least recently tried first. (A superuser's
    session, one the daemon never ends: an agent's login's would be ended at its second miss.)"""
    from watchdog.daemon.tick import judging

    monkeypatch.setattr(judging, "MAX_WAITS_PER_TICK", 1)
    eng, sealer = daemon
    held = sorted(_runaway(store.url("a")) for _ in range(3))
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    now = utcnow()
    holder = _raw(store.base.set(database=store.db).render_as_string(hide_password=False))
    try:
        for rid in held:
            holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (rid,))
        rep = tk.tick(now)  # each is new: tried once (three waits, once per run ever)
        assert sorted(rep.locked) == held and set(tk.state.locked_tried) == set(held)
        tried = []
        for i in range(1, 4):  # then one wait a tick, in turn
            other = _runaway(store.url("b"))
            before = dict(tk.state.locked_tried)
            rep = tk.tick(later(now, i))
            assert (other, lc.MAX_COST) in rep.stops  # the other login's runaway: this tick
            assert sorted(rep.locked) == held  # all still looked at
            tried += [rid for rid in held if tk.state.locked_tried[rid] != before[rid]]
        assert sorted(tried) == held  # each tried exactly once in three ticks
    finally:
        let_go(holder)
    rep = tk.tick(later(now, 5))
    assert rep.locked == [] and sorted(r for r, _ in rep.stops if r in held) == held


def test_sealing_ended_runs_skips_a_row_its_login_holds_and_seals_the_others(store, daemon):
    """The leader's seal duty writes ended runs' top tool on their rows: a row held locked is
    skipped (sealed once free), the rest of the batch is written, nothing waits."""
    from sqlalchemy import update

    from watchdog.store import retention
    from watchdog.store.schema import runs

    eng, _ = daemon
    held_rid, free_rid = _runaway(store.url("a")), _runaway(store.url("a"))
    with eng.begin() as conn:  # both ended, unsealed (as the daemon's own stops leave them)
        conn.execute(update(runs).where(runs.c.id.in_([held_rid, free_rid]))
                     .values(status=lc.KILLED, ended_at=utcnow(), top_tool_calls=None))
    holder = _raw(store.url("a"))
    try:
        holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (held_rid,))
        t0 = time.monotonic()
        retention.seal_ended(eng)
        assert time.monotonic() - t0 < TICK_WITHIN_S
        assert run_row(eng, free_rid).top_tool_calls == 0 and run_row(eng, held_rid).top_tool_calls is None
    finally:
        let_go(holder)
    retention.seal_ended(eng)
    assert run_row(eng, held_rid).top_tool_calls == 0


def test_the_leaders_booking_and_pricing_pass_over_a_row_its_login_holds(store, daemon):
    """The money work books ended runs (booked_at on their rows) and moves priced steps' cost onto
    their runs: a row held locked is passed over, never waited on; the rest is booked at once,
    and the held run once its lock goes (a review follow-up: these waited with no bound)."""
    from sqlalchemy import update

    from watchdog.store import event_rows, ledger
    from watchdog.store.schema import runs

    eng, sealer = daemon
    held_rid, free_rid = _runaway(store.url("a")), _runaway(store.url("a"))
    with eng.begin() as conn:  # both ended, not booked yet
        conn.execute(update(runs).where(runs.c.id.in_([held_rid, free_rid])).values(status=lc.KILLED, ended_at=utcnow()))
    tk = Ticker(eng, config(), Killer(), sealer=sealer)
    holder = _raw(store.url("a"))
    try:
        holder.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (held_rid,))
        with eng.begin() as conn:
            assert not event_rows.hold_run_row(conn, held_rid) and event_rows.hold_run_row(conn, free_rid)
        rep, took_s = _timed_tick(tk, utcnow())
        assert took_s < TICK_WITHIN_S, took_s
        assert run_row(eng, free_rid).booked_at is not None and run_row(eng, held_rid).booked_at is None
    finally:
        let_go(holder)
    with eng.begin() as conn:
        booking = ledger.book(conn, ledger.read_unbooked(conn), utcnow(), dt.timezone.utc)
    assert [r.id for r in booking.booked] == [held_rid] and run_row(eng, held_rid).booked_at is not None
