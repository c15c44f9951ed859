"""Pause and approve in the store: running → paused, paused → running with more budget.

Each state change is written with its audit row and its alert in one transaction, like
every stop (watchdog.daemon.stops.stopping). The decisions are watchdog.core.policies'; who
pauses is the daemon (its tick) or the run's own in-process guard (which writes only
the status: the daemon records and alerts what it did not request, `acknowledge`).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import pwd
import socket
from typing import Any, Protocol

from sqlalchemy import and_, desc, select
from sqlalchemy.engine import Connection

from watchdog.core import policies as ap, lifecycle as lc
from watchdog.core.budgets import Budgets, Totals
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.interventions import Action
from watchdog.core.messages import RunFacts
from watchdog.core.seal import Sealer
from watchdog.store import run_rows
from watchdog.store.alerts import queued, Audit, announce, record
from watchdog.store.run_rows import with_top_child, run_row
from watchdog.store.schema import interventions, runs


class PausedRun(Protocol):
    """What pause and resume read of a run: a `runs` row as the tick reads it, or a RunRow."""

    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def stop_reason(self) -> str | None: ...
    @property
    def paused_at(self) -> dt.datetime | None: ...
    @property
    def started_at(self) -> dt.datetime: ...
    @property
    def resumes(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def tool_calls(self) -> int: ...
    @property
    def cost_eur(self) -> float: ...
    @property
    def tokens_in(self) -> int | None: ...
    @property
    def tokens_out(self) -> int | None: ...


def operator() -> str:
    """Who ran a CLI command: `cli@host:pid (user)`; the user from the process's real uid, never
    from the environment (plus who used sudo, when it was sudo)."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = f"uid {os.getuid()}"
    sudo = os.environ.get("SUDO_USER")
    if sudo and os.getuid() == 0:
        user += f", sudo by {sudo}"
    return f"cli@{socket.gethostname()}:{os.getpid()} ({user})"


def pause_key(row: PausedRun, paused_at: dt.datetime) -> str:
    """The alert key of one pause: a run paused, resumed and paused again gets two alerts."""
    return AlertKind.PAUSE.key(row.id, f"{paused_at.timestamp():.6f}")


def request_pause(conn: Connection, row: PausedRun, *, reason: str, detail: str, now: dt.datetime, by: str,
                  budgets: Budgets, run_facts: RunFacts, sealer: Sealer | None = None) -> bool:
    """running → paused, with its intervention and its alert (what to answer); False if the run
    is no longer running."""
    if not run_rows.move(conn, row.id, lc.PAUSED, was=lc.RUNNING, stop_reason=reason, stop_detail=detail,
                         paused_at=now):
        return False
    _announce(conn, row, reason, detail, now, by, budgets, run_facts, by_guard=False, sealer=sealer)
    return True


def acknowledge(conn: Connection, row: PausedRun, *, now: dt.datetime, by: str, budgets: Budgets,
                run_facts: RunFacts, sealer: Sealer | None = None) -> bool:
    """A paused run whose pause this daemon did not write (its in-process guard paused it):
    record and alert it once. True when it did."""
    if row.paused_at is None or queued(conn, pause_key(row, row.paused_at)):
        return False
    reason = row.stop_reason if row.stop_reason in ap.BY_REASON else None
    if reason is None:
        return False  # not a pause anyone can answer with more budget: the tick stops it
    # Worded from the daemon's numbers: the row's stop_detail is its writer's text (issue 20).
    _announce(conn, row, reason, ap.measured_detail(reason, run_facts, budgets), row.paused_at, by, budgets,
              run_facts, by_guard=True, at=now, sealer=sealer)
    return True


def _announce(conn: Connection, row: PausedRun, reason: str, detail: str, paused_at: dt.datetime, by: str,
              budgets: Budgets, f: RunFacts, *, by_guard: bool, at: dt.datetime | None = None,
              sealer: Sealer | None = None) -> None:
    held = "in-process guard paused the run" if by_guard else "paused: held at its next record"
    said = Outcome.of(Say.PAUSE, pause_key(row, paused_at), row.id, f=with_top_child(conn, row, f), prof=budgets,
                      reason=reason, detail=detail, by_guard=by_guard)
    announce(conn, said, now=at or paused_at, sealer=sealer, audit=Audit(
        Action.PAUSED, f"sdk (acknowledged by {by})" if by_guard else by, reason=reason, detail=detail,
        outcome=f"{held}; waiting up to {budgets.approval_timeout_s:g} s for resume or kill"))


def resume(conn: Connection, row: PausedRun, grant: ap.Grant, *, now: dt.datetime, by: str, budgets: Budgets,
           run_facts: RunFacts) -> str:
    """paused → running with the run's budgets raised by `grant`: returns what changed.
    ValueError when the run is not paused or the grant would not lift the pause."""
    if row.status != lc.PAUSED:
        raise ValueError(f"run {row.id[:8]} is {row.status}, not paused: only a paused run can be resumed")
    if not grant.adds:
        raise ValueError("give at least one of --add-steps, --add-tool-calls, --add-eur, --add-s")
    paused_s = max(0.0, (now - row.paused_at).total_seconds()) if row.paused_at else 0.0
    columns = grant.columns(budgets, paused_s)
    used = Totals(steps=row.steps, tool_calls=row.tool_calls, cost_eur=row.cost_eur,
                  tokens=(row.tokens_in or 0) + (row.tokens_out or 0),
                  age_s=max(0.0, (now - row.started_at).total_seconds()))
    why = ap.still_over(row.stop_reason, used, columns, grant)
    if why:
        raise ValueError(why)
    if not run_rows.move(conn, row.id, lc.RUNNING, was=lc.PAUSED, stop_reason=None, stop_detail=None,
                         paused_at=None, resumes=runs.c.resumes + 1, **dict[str, Any](columns)):
        raise ValueError(f"run {row.id[:8]} was stopped or resumed meanwhile")
    granted = grant.describe(budgets, columns)
    if paused_s >= 1:
        granted += f" (the {math.ceil(paused_s)} s it was paused do not count against max_wall_s)"
    record(conn, at=now, action=Action.RESUMED, by=by, run_id=row.id, reason=row.stop_reason, detail=granted,
           outcome=f"resumed after {paused_s:.0f} s paused")
    return granted  # the daemon alerts it (acknowledge_resume): only the daemon speaks to humans


def resume_key(row: PausedRun) -> str:
    return AlertKind.RESUME.key(row.id, row.resumes)


def acknowledge_resume(conn: Connection, row: PausedRun, *, now: dt.datetime, budgets: Budgets, run_facts: RunFacts,
                       sealer: Sealer | None = None, sealed: bool = False) -> bool:
    """Alert a resume once (the run's `resumes`-th), worded by the daemon from numbers alone:
    the budgets the run is now held to, and whether an operator sealed the resume. The audit
    row's actor and detail are not quoted: any store writer can write one (issue 20)."""
    key = resume_key(row)
    if not row.resumes or queued(conn, key):
        return False
    iv = conn.execute(select(interventions).where(and_(interventions.c.run_id == row.id,
                                                       interventions.c.action == Action.RESUMED))
                      .order_by(desc(interventions.c.id)).limit(1)).first()
    if iv is None:
        return False
    from watchdog.core.budgets import RUN_BUDGETS

    reason = iv.reason if iv.reason in ap.BY_REASON else None
    held = ", ".join(f"{b.key} {b.fmt(getattr(budgets, b.key), getattr(budgets, b.key))}" for b in RUN_BUDGETS
                     if getattr(budgets, b.key, None) is not None and b.add_option)
    by = ("an operator (sealed with the daemon's key)" if sealed else
          "a row in the store, not sealed by an operator: its budgets stay within its profile")
    said = Outcome.of(Say.RESUME, key, row.id, f=run_facts, prof=budgets, reason=reason, granted=f"now held to {held}",
                      by=by)
    return announce(conn, said, now=now, sealer=sealer, audit=iv.id).queued


def deny_pause(conn: Connection, row: PausedRun, *, now: dt.datetime, by: str, agent: str,
               sealer: Sealer | None = None) -> Any:
    """paused -> running for a pause the daemon neither wrote nor confirms (a store writer's
    claim): recorded, alerted once per run in the daemon's words; the row read again (or None)."""
    if not run_rows.move(conn, row.id, lc.RUNNING, was=lc.PAUSED, paused_at=None, stop_reason=None,
                         stop_detail=None):
        return None
    said = Outcome.of(Say.PAUSE_DENIED, AlertKind.PAUSE_DENIED.key(row.id), row.id, run_id=row.id, agent=agent)
    announce(conn, said, now=now, sealer=sealer, once=True, audit=Audit(
        Action.PAUSE_DENIED, by, outcome="paused in the store, not confirmed by the daemon's counters: running again"))
    return run_row(conn, row.id)
