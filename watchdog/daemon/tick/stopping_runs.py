"""The tick's part in runs already stopping: a stop it did not request acknowledged once, then
the ladder (how a stop is composed in the first place: watchdog.daemon.stops.stopping).

A stopping run is acknowledged (recorded if nobody did, alerted once, worded by the daemon
from the store's numbers), then walked down the ladder (cancel, SIGTERM, SIGKILL:
watchdog.daemon.stops.ladder) or ended when its process is gone. The ladder's step is the seam
between the two roles: the judge (watchdog.daemon.stops.commands.judge) says which command is
due, and the Ticker's own Enforcer (watchdog.daemon.stops.enforcer) carries it out. Before a first signal the daemon
confirms the stop is its own: a stop only written into the store never leads to a signal.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from watchdog.core import lifecycle as lc
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.budgets import Budgets
from watchdog.core.interventions import Action
from watchdog.core.messages import ACK_MARK, RunFacts
from watchdog.core.policies import evaluate, with_period
from watchdog.core.rowviews import RunView
from watchdog.core.seal import Sealer
from watchdog.daemon.tick import judging
from watchdog.daemon.trust import ownstage
from watchdog.daemon.stops import redrive
from watchdog.daemon.tick.judging import Batch
from watchdog.daemon.stops.commands import judge
from watchdog.daemon.stops.enforcer import Checks
from watchdog.daemon.stops.ladder import WAITING_STAGES, exited
from watchdog.daemon.stops.ladder import due as ladder_due
from watchdog.daemon.stops.steps import Said
from watchdog.daemon.tick.tickstate import ThisTick
from watchdog.daemon.stops.stopping import stop_plan
from watchdog.store.alerts import queued, announce, record, stop_intervention
from watchdog.store.engine import Connection, bound_lock_waits
from watchdog.store.run_rows import stop_alert

if TYPE_CHECKING:
    from watchdog.daemon.context import TickContext

log = logging.getLogger("watchdog.tick")


def judge_stopping(tk: TickContext, this: ThisTick, row: RunView, batch: Batch, budgets: Budgets, f: RunFacts) -> None:
    """A stopping run: acknowledged once, then its ladder (or its end, when its process is gone)."""
    now = this.now
    this.rep.stopping += 1
    own = ownstage.own_stage(tk.memory, row.id)
    if ownstage.differs(row, own):  # the ladder goes by the daemon's record (issue 20)
        batch.commit()
        with tk.engine.begin() as conn:
            bound_lock_waits(conn)  # a writer may hold the row locked: this run's step fails, not the tick
            row = ownstage.restore(conn, row, own)
    if row.id not in tk.state.acked and acknowledge_stop(tk, row, f, budgets, now, batch):
        this.rep.heard.append((row.id, row.stop_reason if row.stop_reason in lc.STOP_REASONS else "unknown"))
    gone = (row.signal_stage in (None, *WAITING_STAGES) and tk.gone(row, this)
            and not tk.exec_trees.left(row))
    redriven = None
    if not gone and row.signal_stage == lc.Stage.REFUSED:  # issue 36: the operator's `kill` drives it again
        with batch.run() as conn:
            redriven = redrive.pending(tk.sealer, conn, row, tk.state.redriven)
    if not gone and redriven is None and not ladder_due(row, now, tk.config.daemon, tk.killer.host):
        return  # nothing to do yet: no transaction (on SQLite, no write lock)
    batch.commit()  # first: on SQLite the batch holds the write lock this transaction needs
    with tk.engine.begin() as conn:  # its own transaction: it may signal a process
        bound_lock_waits(conn)  # before its first statement: exited()'s writes wait on the row too
        if gone:
            # It ended without saying so: after the cooperative stop (no need to wait for the
            # grace), or after a signal that was refused / not allowed / did not work.
            exited(conn, row, now=now, by=tk.by, facts=f, budgets=budgets, sealer=tk.sealer)
            return
        own_evidence, owner_evidence = tk.own_evidence, tk.owner_evidence

        def own_says() -> bool | str:  # SQLite: its MAC'd records; PostgreSQL: its owner's (issue 32)
            if own_evidence is not None:
                return own_evidence.justifies(conn, row, now, skip_clock=this.skip_clock)
            assert owner_evidence is not None
            return owner_evidence.justifies(conn, row, now, budgets, lambda r: tk.closing(r, this),
                                            skip_clock=this.skip_clock)

        # The seam (watchdog.daemon.stops.commands): the judge's commands for this run, carried out
        # by the Ticker's own enforcer, each at most once (its key on the row and in tk.memory).
        daemon = tk.config.daemon
        commands = judge(row, now, daemon, tk.killer.host, redriven=redriven is not None)
        checks = Checks(Said(now, tk.by, f, budgets, tk.sealer), daemon.cancel_grace_s, daemon.term_grace_s,
                        sharing=this.sharing[(row.host, row.pid)] - 1,
                        confirmed=lambda: confirms(tk, this, conn, row, budgets),
                        own_evidence=None if own_evidence is None and owner_evidence is None else own_says,
                        remembered=tk.exec_trees.remembered(row.id))
        tk.enforcer.carry_out(conn, commands, row, checks)
        if redriven is not None:
            tk.state.redriven.add(redriven)  # once per redrive alert
        ownstage.remember(conn, tk.memory, row, row.signal_stage)


def confirms(tk: TickContext, this: ThisTick, conn: Connection, row: RunView, budgets: Budgets) -> bool:
    """Before the first signal: did this daemon decide the stop, or do its own budgets say
    the run is over one now? A stop only written into the store (any store writer can
    write one for any run) never leads to a signal by itself."""
    if row.id in tk.state.decided or sealed_stop(tk.sealer, conn, row):
        return True
    return bool(with_period(evaluate(judging.snapshot(tk, row, this.now), budgets, this.now,
                                     skip_clock=this.skip_clock), tk.closing(row, this)))


def sealed_stop(sealer: Sealer | None, conn: Connection, row: RunView) -> bool:
    """The stop's alert was sealed with this daemon's key by someone who is not acknowledging
    a store request: this daemon in an earlier life, or an operator running `kill` as the
    daemon's user. Only the key's holders can write such a row."""
    if sealer is None:
        return False
    # On the caller's connection: a second one would wait for the write lock the caller holds.
    a = stop_alert(conn, row.id)
    if redrive.sealed(sealer, conn, row) is not None:
        return True  # an operator's sealed `kill` of the run while it was stopping (issue 36)
    if a is None or not isinstance(a.body, str) or ACK_MARK in a.body:
        return False
    return bool(sealer.alert_ok(a.mac, a.dedupe_key, a.title, a.body, a.created_at))


def acknowledge_stop(tk: TickContext, row: RunView, f: RunFacts, budgets: Budgets, now: dt.datetime, batch: Batch) -> bool:
    """A stopping run whose stop this daemon did not request (the run's guard, the CLI,
    any store writer): record it if nobody did and alert it, worded by the daemon from
    the store's numbers. Once per run: remembered, and its alert key is unique. True when
    this call heard it (its alert queued now)."""
    heard = False
    with batch.run() as conn:
        if not queued(conn, AlertKind.STOP.key(row.id)):
            reason = row.stop_reason if row.stop_reason in lc.STOP_REASONS else "unknown"
            iid = stop_intervention(conn, row.id)
            if iid is None:
                iid = record(conn, at=now, action=Action.STOP_REQUESTED, by=tk.by, run_id=row.id, reason=reason,
                             outcome="stop requested in the store, not by this daemon; acknowledged")
            said = Outcome.of(Say.REQUESTED_STOP, AlertKind.STOP.key(row.id), row.id, f=f, b=budgets, reason=reason,
                              plan=stop_plan(row.kill_mode))
            announce(conn, said, now=now, sealer=tk.sealer, audit=iid)
            log.warning("stop requested in the store: %s run %s — %s", row.agent, row.id[:8], reason)
            heard = True
    tk.state.acked.add(row.id)
    return heard
