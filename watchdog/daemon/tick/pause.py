"""The tick's part in pause and approve: pause or stop a run over budget, and judge the paused ones.

A breach pauses when the run's profile says `on_breach = "pause"` for every budget it
broke; anything else stops (watchdog.core.pause.decide). A paused run is still
watched: its process dying marks it lost, a loop or silence stops it, and once
`approval_timeout_s` has passed without `resume` or `kill` it is stopped with the
reason it paused for.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from watchdog.core import lifecycle as lc
from watchdog.core import pause as ap
from watchdog.core.budgets import Budgets
from watchdog.core.messages import RunFacts
from watchdog.core.policies import Verdict, evaluate
from watchdog.core.rowviews import RunView
from watchdog.core.text import one_line
from watchdog.daemon.tick.batch import Batch
from watchdog.daemon.tick.believe import snapshot
from watchdog.daemon.stops.stopping import lose_run, stop_run
from watchdog.daemon.tick.tickstate import ThisTick
from watchdog.store.engine import Connection
from watchdog.store.pause import acknowledge, acknowledge_resume, pause_key, request_pause

if TYPE_CHECKING:
    from watchdog.daemon.context import TickContext

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
    from watchdog.store.interventions import grant_ok

    with batch.run() as conn:
        acknowledge_resume(conn, row, now=now, budgets=budgets, run_facts=facts, sealer=tk.sealer,
                           sealed=grant_ok(conn, row, tk.sealer))
    tk.state.resume_seen.add((row.id, row.resumes))
