"""The tick's judgement of one run's row: the transaction it is judged in (a SAVEPOINT per run), a lock another
session holds on it, what the tick believes of it, its pause or stop over budget, and the bounds it keeps when
it cannot be judged.

What the tick believes of one run's row (issue 20): its snapshot, budgets, facts and pause,
each from the daemon's own records where the row is only a claim (watchdog.daemon.trust.trust).

The tick's writes for running runs in one transaction, with a SAVEPOINT per run.

The tick's part in pause and approve: pause or stop a run over budget, and judge the paused ones.

A breach pauses when the run's profile says `on_breach = "pause"` for every budget it
broke; anything else stops (watchdog.core.policies.decide). A paused run is still
watched: its process dying marks it lost, a loop or silence stops it, and once
`approval_timeout_s` has passed without `resume` or `kill` it is stopped with the
reason it paused for.

The bounds a run keeps when its row cannot be judged: its wall clock from first sight, its process.

A quarantined row (one the tick cannot read or act on: a timestamp that does not parse, a
start 30 days ahead, text where a number belongs) is reported once (quarantine.py); before
issue 20 it was then never judged again, so writing one bad value escaped every budget. Here
it is still stopped once the daemon has watched it for its profile's max_wall_s (the
[defaults]' when its agent cannot be read), and marked lost when its process is gone. The
stop is cooperative: no row that cannot be read leads to a signal.

Runs whose row another session holds locked (PostgreSQL): tried once more after every other run
of the tick (first_missed: most such locks are a writer's short transaction), then passed over
this tick, tried again at every next one, reported once.

Any confined login may `SELECT ... FOR UPDATE` its own run and leave the transaction open. The
daemon's statements wait for such a lock at most engine.DAEMON_LOCK_TIMEOUT_MS (their
transactions call engine.bound_lock_waits), and that run's step is rolled back to its SAVEPOINT
alone: every other run of the tick is judged and stopped as usual. The locked run stays looked
at (sticky, like an unreadable one) so that the step is taken the first tick after the lock
goes; until then nothing of it can be written (its stop, its audit row, an alert naming it:
each insert's foreign key waits on the same row). So the report says so without naming the run
in a column: a log line at the first miss, and one alert (key `locked:<run>`, once ever) when
the row is still locked at the next tick, with the run id as the daemon reads it (marked unless
of the generated form). Its process is not signalled meanwhile (see docs/explanation/security.md,
"A run that holds its own row locked"). A confined writer's session (an agent's login on its own
run, a gateway's on any run it witnessed) that holds it with the same transaction at two ticks in
a row is ended by the daemon (row_holders decides, store.row_lockers finds and ends it), with its
login's sessions queued on the row: recorded and alerted as such (`locked:<run>:ended:<pid>:<xid>`),
and the run's step is taken again at once (RETRIES_AFTER_ENDING); a new session of a login already
ended on that run is ended at its first miss, until the step goes through.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Sequence, Mapping, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, Any

from watchdog.core import lifecycle as lc, policies as ap
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.budgets import Budgets, effective_budgets
from watchdog.core.messages import RunFacts
from watchdog.core.policies import RunSnapshot, totals, Verdict, evaluate
from watchdog.core.rowviews import RunView
from watchdog.core.interventions import Action
from watchdog.core.text import ident, marked, one_line
from watchdog.daemon.stops import stopping
from watchdog.daemon.stops.stopping import facts, lose_run, stop_run
from watchdog.daemon.tick import row_holders
from watchdog.daemon.tick.tickstate import ThisTick, TickState
from watchdog.daemon.trust.scan import merged
from watchdog.daemon.trust.lightrow import Light, LightRow
from watchdog.daemon.trust.trust import first_sight_budget_s
from watchdog.store.alerts import Audit, announce
from watchdog.store.engine import Connection, Engine, bound_lock_waits, DAEMON_LOCK_TIMEOUT_MS, store_unavailable
from watchdog.store import row_lockers
from watchdog.store.row_lockers import RowLocker
from watchdog.store.pause import acknowledge, acknowledge_resume, pause_key, request_pause

if TYPE_CHECKING:
    from watchdog.core.seal import Sealer
    from watchdog.daemon.context import TickContext


def snapshot(tk: TickContext, row: RunView, now: dt.datetime) -> RunSnapshot:
    """The run judged by the larger counters and its age from first sight at the latest."""
    return tk.scanner.snapshot(row, now, started_at=tk.trust.started_at(row))


def budgets(tk: TickContext, row: RunView, batch: Batch) -> Budgets:
    """Profile (or [defaults] for an owner it does not bind), clamped unless a sealed resume raised it."""
    prof = tk.config.profile(row.agent)
    # (A span run's profile is its sender's to use: an anonymous sender's never is; trust says.)
    if not row.resumes and not getattr(prof, "owners", ()) and getattr(row, "source", None) != lc.Source.OTLP:
        return effective_budgets(prof, row)  # no resume: never raised
    return tk.trust.budgets(batch.run, row)


def run_facts(tk: TickContext, row: RunView, top: tuple[str, int, int] | None, last_error: str | None,
              now: dt.datetime) -> RunFacts:
    """What alerts say of the run: its counters the larger of the row's and the daemon's, its
    duration from first sight at the latest."""
    f = facts(row, top, last_error, now)
    folded = tk.scanner.evidence.get(row.id)
    start = tk.trust.started_at(row)
    end = row.ended_at or now
    duration_s = max(0.0, (end - start).total_seconds()) if start is not None else f.duration_s
    if folded is None and duration_s == f.duration_s:
        return f
    steps, calls, errors, tokens, cost = merged((f.steps, f.tool_calls, f.tool_errors, f.tokens, f.cost_eur), folded)
    return dataclasses.replace(f, steps=steps, tool_calls=calls, tool_errors=errors, tokens=tokens, cost_eur=cost,
                               duration_s=duration_s)


def pause_is_known(tk: TickContext, row: RunView, now: dt.datetime, budgets: Budgets) -> bool:
    """The daemon paused this run, or confirms its guard's pause (a pausing budget at its
    limit by the daemon's own counters): remembered in its state file."""
    if tk.trust.pause_mark(row.id, row.resumes) is not None:
        return True
    if tk.trust.confirms_pause(row, totals(snapshot(tk, row, now), now), budgets):
        tk.trust.mark_pause(row.id, row.resumes, now.timestamp())
        return True
    return False


def unclaimed_pause(tk: TickContext, row: RunView, now: dt.datetime, batch: Batch) -> RunView | None:
    """A paused row whose pause the daemon neither wrote nor confirms: denied (running again);
    the row read again, or None when it is no longer paused."""
    if row.status != lc.PAUSED:
        return None
    with batch.run() as conn:
        again: RunView | None = tk.trust.deny_pause(conn, row, now)  # store.pause.deny_pause: a Row or None
        return again


# -- The tick's writes for running runs in one transaction, with a SAVEPOINT per run -------------------------------

class _Transaction(Protocol):
    def commit(self) -> None: ...


class Batch:
    """The tick's writes for running runs (stop requests, lost runs, rate alarms) in ONE
    transaction, opened at the first write, with a SAVEPOINT per run so a failing run rolls
    back only its own rows: one commit per tick instead of one per run. On PostgreSQL its lock
    waits are bounded (engine.bound_lock_waits, for the whole transaction): a run whose row a
    writer holds locked fails its own step (rolled back to its SAVEPOINT), never the tick's."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # The open connection and its transaction: both set at the first write, both None after.
        self._open: tuple[Connection, _Transaction] | None = None

    @property
    def conn(self) -> Connection | None:
        return None if self._open is None else self._open[0]

    @contextmanager
    def run(self) -> Iterator[Connection]:
        if self._open is None:
            conn = self.engine.connect()
            self._open = (conn, conn.begin())
            bound_lock_waits(conn)
        conn = self._open[0]
        sp = conn.begin_nested()
        try:
            yield conn
        except BaseException:
            sp.rollback()
            raise
        sp.commit()

    def commit(self) -> None:
        if self._open is None:
            return
        try:
            self._open[1].commit()
        finally:
            self.close()

    def close(self) -> None:
        """Without a commit: what is pending is rolled back."""
        if self._open is not None:
            try:
                self._open[0].close()
            finally:
                self._open = None


# -- The tick's part in pause and approve: pause or stop a run over budget, and judge the paused ones --------------

log = logging.getLogger("watchdog.tick")


def act_on_breach(tk: TickContext, this: ThisTick, conn: Connection, row: RunView, verdicts: list[Verdict], *,
                  budgets: Budgets, facts: RunFacts, stop_only: bool = False) -> tuple[str, Verdict, bool]:
    """Pause or stop a running run over budget (one transaction, the caller's):
    ("pause" | "stop", the verdict acted on, whether this tick did it). `stop_only`: a run
    that paused itself without the daemon's confirmation (it cannot be paused again: stopped)."""
    now, rep = this.now, this.rep
    action, v = ap.decide(verdicts, budgets)
    if stop_only:
        action = "stop"
    if action == "pause":
        done = request_pause(conn, row, reason=v.reason, detail=v.detail, now=now, by=tk.by, budgets=budgets,
                             run_facts=facts, sealer=tk.sealer)
        if done:
            rep.pauses.append((row.id, v.reason))
            tk.state.pause_seen.add(pause_key(row, now))
            tk.trust.mark_pause(row.id, row.resumes, now.timestamp())  # the daemon's own pause (issue 20)
            log.warning("paused: %s run %s — %s (%s); waiting for resume or kill", row.agent, row.id[:8],
                        v.reason, v.detail)
        return action, v, done
    done = stop_run(conn, row, reason=v.reason, detail=v.detail, now=now, by=tk.by, budgets=budgets,
                        run_facts=facts, sealer=tk.sealer, own_parent=tk.trust.parent_ok)
    if done:
        rep.stops.append((row.id, v.reason))
        log.warning("stop requested: %s run %s — %s (%s)", one_line(row.agent, 64), one_line(row.id, 8), v.reason,
                    one_line(v.detail))
    return action, v, done


def judge_paused(tk: TickContext, this: ThisTick, row: RunView, *, budgets: Budgets, facts: RunFacts, batch: Batch) -> None:
    """One paused run: lost, stopped (a loop, silence, no answer in time), or still waiting."""
    now, rep = this.now, this.rep
    if tk.gone(row, this):
        if tk.exec_trees.left(row):  # exec is gone, not its tree: stopped, and the ladder takes the tree down
            with batch.run() as conn:
                if tk.exec_trees.stop_orphaned(conn, row, budgets=budgets, facts=facts, now=now):
                    tk.state.decided.add(row.id)  # the daemon's own decision: its ladder may signal
                    rep.stops.append((row.id, lc.PROCESS_GONE))
            return
        with batch.run() as conn:
            if lose_run(conn, row, detail=f"process {row.pid} on {row.host} is gone without ending the run "
                                            f"(it was paused for {row.stop_reason})",
                         now=now, by=tk.by, budgets=budgets, run_facts=facts, sealer=tk.sealer):
                rep.lost.append(row.id)
        return
    rep.paused += 1
    key = pause_key(row, row.paused_at) if row.paused_at is not None else None
    if key is not None and key not in tk.state.pause_seen:
        with batch.run() as conn:  # paused by the run's own guard: say so once
            acknowledge(conn, row, now=now, by=tk.by, budgets=budgets, run_facts=facts, sealer=tk.sealer)
        tk.state.pause_seen.add(key)
    stops = ap.stops_while_paused(evaluate(snapshot(tk, row, now), budgets, now, skip_clock=this.skip_clock))
    if stops:
        v = stops[0]
        tk.state.decided.add(row.id)  # this daemon's own decision: it may signal for it
        with batch.run() as conn:
            if stop_run(conn, row, reason=v.reason, detail=v.detail, now=now, by=tk.by, budgets=budgets,
                            run_facts=facts, why=f"stopped while paused for {row.stop_reason}", sealer=tk.sealer,
                            own_parent=tk.trust.parent_ok):
                rep.stops.append((row.id, v.reason))
        return
    _timeout(tk, this, row, budgets=budgets, facts=facts, batch=batch)


def _timeout(tk: TickContext, this: ThisTick, row: RunView, *, budgets: Budgets, facts: RunFacts, batch: Batch) -> None:
    """A paused run nobody answered in time (or nobody could answer): stopped with its reason."""
    now = this.now
    # Waited since the daemon paused it or confirmed the pause (its state file), never since a
    # paused_at its writer could set ahead (issue 20).
    since_s = tk.trust.pause_mark(row.id, row.resumes)
    waited_s = ap.waited_s(now, since_s, row.paused_at)
    if not ap.approval_expired(row.paused_at, row.stop_reason, waited_s, budgets.approval_timeout_s):
        return  # still waiting for a human
    # No answer in time (or a paused row nobody could answer: no pause time, no pausable reason).
    reason = row.stop_reason if row.stop_reason in ap.BY_REASON else "manual"
    detail = ap.measured_detail(reason, facts, budgets)  # never the row's stop_detail (issue 20)
    why = (ap.timeout_plan(budgets, "stopped with the reason it paused for") if waited_s is not None
           else "paused without a pause time or reason")
    tk.state.decided.add(row.id)
    with batch.run() as conn:
        if stop_run(conn, row, reason=reason, detail=detail, now=now, by=tk.by, budgets=budgets,
                     run_facts=facts, why=why, sealer=tk.sealer, own_parent=tk.trust.parent_ok):
            this.rep.stops.append((row.id, reason))
            log.warning("approval timeout: %s run %s stopped — %s", row.agent, row.id[:8], reason)


def announce_resume(tk: TickContext, row: RunView, *, budgets: Budgets, facts: RunFacts, now: dt.datetime,
                    batch: Batch) -> None:
    """A run a human resumed (`agent-watchdog resume`, which queues no alert): say so, once."""
    from watchdog.store.alerts import grant_ok

    with batch.run() as conn:
        acknowledge_resume(conn, row, now=now, budgets=budgets, run_facts=facts, sealer=tk.sealer,
                           sealed=grant_ok(conn, row, tk.sealer))
    tk.state.resume_seen.add((row.id, row.resumes))


# -- The bounds a run keeps when its row cannot be judged: its wall clock from first sight, its proce --------------


def backstop(tk: TickContext, this: ThisTick, light: Mapping[str, LightRow], batch: Batch) -> None:
    """For each run the tick could not judge this tick (this.rep.quarantined); `light`: the active
    runs' light rows by id (watchdog.daemon.tick.activeset), so the cost is that of the few bad ones."""
    now, live, rep = this.now, this.live, this.rep
    bad = {rid for rid in rep.quarantined if isinstance(rid, str)}
    if not bad:
        return
    now_s = now.timestamp()
    done = tk.state.backstopped
    for rid in sorted(bad):
        row = light.get(rid)
        if row is None or rid in done:
            continue
        r = Light(row)
        first = tk.trust.first.get(rid, now_s)
        pid, ctime = r.pid, r.pid_create_time
        gone = (live is not None and r.host == tk.killer.host and isinstance(pid, int) and pid > 0
                and isinstance(ctime, float) and pid not in live)
        short = rid[:8]
        if gone and isinstance(pid, int):  # (gone says it is: for the type)
            with batch.run() as conn:
                if stopping.lose_unreadable(
                        conn, rid, pid=pid, host=tk.killer.host, now=now, by=tk.by, sealer=tk.sealer):
                    rep.lost.append(rid)
            done.add(rid)
            continue
        limit_s = first_sight_budget_s(tk.config, r.agent)
        watched_s = now_s - first
        if watched_s <= limit_s or r.status not in lc.STOPPABLE_STATUSES:
            continue
        detail = f"watched {watched_s:.0f} s > max_wall_s {limit_s:g} s (from the daemon's first sight)"
        with batch.run() as conn:
            if stopping.stop_unreadable(
                    conn, rid, reason=lc.WALL_CLOCK, detail=detail, now=now, by=tk.by, sealer=tk.sealer,
                    outcome="cooperative stop requested (its row cannot be read: it will not be signalled)"):
                rep.stops.append((rid, lc.WALL_CLOCK))
                log.warning("stop requested: quarantined run %s — %s", short, detail)
        done.add(rid)


# -- Runs whose row another session holds locked (PostgreSQL): passed over this tick, tried again ------------------


ALERT_AFTER_TICKS = 2  # a lock that outlives one tick is no writer's short transaction
# Past this many lock waits given up in one tick, the runs known locked are not tried again this
# tick (2 s at 250 ms): a login holding many of its runs' rows slows a tick by this at most. They
# come last in the tick, least recently tried first, so each is tried again within a few ticks.
MAX_WAITS_PER_TICK = 8


def order(state: TickState, rows: list[Any]) -> list[Any]:
    """The runs in judging order: every other run first, then those known locked, least recently
    tried first (the waits spent on them never delay another run's stop)."""
    if not state.locked:
        return rows
    free = [r for r in rows if r.id not in state.locked]
    held_rows = sorted((r for r in rows if r.id in state.locked), key=lambda r: state.locked_tried.get(r.id, 0))
    return free + held_rows


def first_missed(state: TickState, this: ThisTick, rows: list[Any]) -> Iterator[Any]:
    """The runs whose row was found locked for the first time at this tick, to be tried once more
    after every other run: most such locks are a writer's own short record transaction, slow on
    a loaded server, long committed by then, and the run's stop then goes out in this tick, not
    the next (one of three runs of a spent daily budget was stopped a tick late). Within the
    tick's lock waits; a second miss counts as the same tick's (held(again=True))."""
    if not this.rep.locked:  # the usual tick: no pass over its rows
        return
    for row in rows:
        if this.lock_waits >= MAX_WAITS_PER_TICK:
            return
        if row.id in this.rep.locked and state.locked.get(row.id) == 1:
            yield row


def skipped(tk: TickContext, this: ThisTick, row: Any) -> bool:
    """A run known locked, once this tick's waits are spent: not tried now (it stays looked at,
    and goes first among the locked at a later tick)."""
    if this.lock_waits < MAX_WAITS_PER_TICK or row.id not in tk.state.locked:
        return False
    this.rep.locked.append(row.id)
    return True


# After the daemon ended the session(s) holding a run's row, its step is taken again at once, in
# the same tick, at most this many times (each a bounded wait): taken only at the next tick, a
# reconnect of the same login (or a session already queued on the row) took the row first every
# time, and the run was never stopped (review).
RETRIES_AFTER_ENDING = 2
# The queued sessions ended with a holder, at most (each ending waits for its exit, bounded): more
# would take the row in turn and, their login an offender by then, be ended at their first miss.
MAX_QUEUED_ENDED = 16


def held(tk: TickContext, this: ThisTick, row: Any, batch: Batch, again: bool = False) -> bool:
    """The run's step gave up on its row lock this tick: remembered, logged once, alerted once; a
    confined writer's session holding it at two ticks in a row is ended (row_holders), with the
    sessions of its login queued behind it. True when a session was ended: the caller takes the
    step again at once. `again`: this miss is such a retry's, in the tick that already counted one."""
    rid, st = row.id, tk.state
    this.lock_waits += 1
    if again:
        ticks = st.locked.get(rid, 1)
    else:
        ticks = st.locked.get(rid, 0) + 1
        st.locked[rid] = ticks
        st.locked_tries += 1
        st.locked_tried[rid] = st.locked_tries
        this.rep.locked.append(rid)
    if ticks == 1 and not again:
        log.warning("run %s (%s): its row is locked by another session; its step waits, tried again each tick",
                    one_line(rid, 40), one_line(str(row.status), 16))
    lockers, ended = _end_holders(tk, row, batch, ticks)
    this.rep.ended_sessions += [(rid, lk.login, lk.pid) for lk in ended]
    if ended:
        st.offenders[rid] = st.offenders.get(rid, frozenset()) | {lk.login for lk in ended}
    sealer = tk.sealer
    if sealer is None:
        return bool(ended)
    if ended:  # said as the ending, whatever the tick (each ended session once)
        for lk in ended:
            audit = Audit(Action.SESSION_ENDED, by=tk.by, reason="row_locked", outcome="session ended",
                          detail=f"ended session pid {lk.pid} of login {marked(lk.login)}: it held run {ident(rid)}'s "
                                 f"row locked at {ticks} ticks in a row")
            _say(batch, this, rid, Outcome.of(
                Say.ROW_LOCK_ENDED, AlertKind.LOCKED.key(rid, "ended", lk.pid, lk.xid), None, run_id=rid,
                status=str(row.status), waited_ms=DAEMON_LOCK_TIMEOUT_MS, ticks=ticks, ended=[(lk.login, lk.pid)]), sealer, audit)
        return True
    if ticks != ALERT_AFTER_TICKS or again:
        return False
    _say(batch, this, rid, Outcome.of(Say.ROW_LOCKED, AlertKind.LOCKED.key(rid), None, run_id=rid,
                                      status=str(row.status), waited_ms=DAEMON_LOCK_TIMEOUT_MS, ticks=ticks,
                                      holders=[(lk.login, lk.pid) for lk in lockers]), sealer)
    return False


def _say(batch: Batch, this: ThisTick, rid: str, said: Outcome, sealer: Sealer, audit: Audit | None = None) -> None:
    try:
        with batch.run() as conn:  # no run_id column: its foreign key would wait on the same lock
            announce(conn, said, now=this.now, sealer=sealer, audit=audit, once=True)
    except Exception as exc:  # noqa: BLE001 — the log line said it; never at the other runs' expense
        if store_unavailable(exc):
            raise
        log.warning("run %s: could not queue its locked-row alert (%s)", one_line(rid, 40), type(exc).__name__)


def _end_holders(tk: TickContext, row: Any, batch: Batch, ticks: int) -> tuple[list[RowLocker], list[RowLocker]]:
    """(the sessions seen holding the run's row, those of them ended now). Only a diagnosis and a
    signal: a failure here costs the run this tick's ending, never the tick."""
    rid, st = row.id, tk.state
    try:
        with batch.run() as conn:
            lockers = row_lockers.row_lockers(conn, rid)
            before = st.lockers.get(rid, frozenset())
            st.lockers[rid] = row_holders.seen(lockers)
            if not lockers:
                return lockers, []
            ours = row_lockers.daemon_logins(conn)
            offenders = st.offenders.get(rid, frozenset())
            chosen = row_holders.to_end(lockers, before, ticks, ours, offenders)
            if not chosen:
                return lockers, []
            if not row_lockers.may_end_sessions(conn):
                if not st.end_refused_said:
                    st.end_refused_said = True
                    log.warning("run %s: its row is held locked by a writer's session (login %s, pid %d) the daemon "
                                "may not end: its login lacks pg_signal_backend (%s; sql/postgres-roles.sql grants "
                                "it). Until then such a lock is only alerted.", one_line(rid, 40),
                                one_line(chosen[0].login, 64), chosen[0].pid, row_lockers.END_GRANT)
                return lockers, []
            # Its login's sessions queued behind it (or behind one another) would take the row
            # before the daemon's step: ended with it. A login may end its own sessions itself
            # (pg_terminate_backend allows it for the same role), so this lends it nothing.
            logins = sorted({lk.login for lk in chosen} | offenders)
            queued = [w for w in row_lockers.row_waiters(conn, [lk.pid for lk in chosen], logins)
                      if row_holders.may_end(w, ours)][:MAX_QUEUED_ENDED]
            # (the queued first: ended after the holder, the first of them would already hold the row)
            ended = [lk for lk in queued + chosen if row_lockers.end_session(conn, lk)]
    except Exception as exc:  # noqa: BLE001 — the lock is still alerted; never at the other runs' expense
        if store_unavailable(exc):
            raise
        log.warning("run %s: could not look up who holds its row (%s)", one_line(rid, 40), type(exc).__name__)
        return [], []
    for lk in ended:
        log.warning("run %s: ended session pid %d of login %s: it held the run's row locked at %d ticks in a row",
                    one_line(rid, 40), lk.pid, one_line(lk.login, 64), ticks)
    return lockers, ended


def released(tk: TickContext, row: Any) -> None:
    """The run's step went through: its lock is gone (said once in the log)."""
    tk.state.locked_tried.pop(row.id, None)
    tk.state.lockers.pop(row.id, None)
    tk.state.offenders.pop(row.id, None)
    if tk.state.locked.pop(row.id, None) is not None:
        log.warning("run %s: its row lock is released; its step is taken", one_line(row.id, 40))
