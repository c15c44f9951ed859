"""A stop as the daemon composes it: the store's request, the alert in the daemon's words
(sealed), and the same for the run's active children, in the caller's one transaction, so a
crash never leaves a stop without its record or an alert without its stop.

The store verbs (watchdog.store.run_rows) each do one thing; this is the one place that says
which of them a stop, a run lost, or a stop of a row the daemon cannot read whole is made of.
Without a sealer (the CLI, not root nor the daemon's user) the alerts are not queued here: the
daemon composes them when it sees the stops (watchdog.daemon.stops.acknowledge).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Sequence

from watchdog.core import lifecycle as lc
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.budgets import Budgets, for_run
from watchdog.core.messages import RunFacts
from watchdog.core.text import scrub, one_line
from watchdog.core.seal import Sealer
from watchdog.store import run_rows
from watchdog.store.alerts import announce
from watchdog.store.run_rows import with_top_child
from watchdog.store.engine import Connection

# A run seen only through spans whose sender the kernel did not confirm (watchdog.daemon.otlp).
SPANS_UNPROVEN = "not signalled: spans cannot prove their sender"
NOT_OWN_PARENT = ("cooperative stop requested with the run it names as its parent; that link is not the "
                  "daemon's own record, so this run is never signalled for it")
GONE = "its process is gone"


def stop_plan(kill_mode: str, source: str | None = None) -> str:
    """What the stop will lead to, in the alert's words."""
    if kill_mode == lc.COOPERATIVE and source == lc.Source.OTLP:
        return f"cooperative stop requested ({SPANS_UNPROVEN})"
    if kill_mode == lc.COOPERATIVE:
        return "cooperative stop requested (the run shares its process: it will not be signalled)"
    return "cooperative stop requested; SIGTERM after the cancel grace if it has not ended"


def facts(row: Any, top_tool: Sequence[Any] | None = None, last_error: str | None = None,
          now: dt.datetime | None = None) -> RunFacts:
    """What an alert may say about a run; its free texts (an error, a heartbeat) are agents'
    words: scrubbed again here (an agent in another language may have stored them raw)."""
    end = row.ended_at or now or row.last_seen_at
    top: tuple[Any, ...] | None = None
    if top_tool is not None:
        top = (one_line(scrub(str(top_tool[0])) or "", 64), *top_tool[1:])
    # Each store text on one printable line: a newline in an agent's name must not let its
    # writer add a line of their own ("action: nothing was done") to the on-call's alert.
    return RunFacts(
        id=one_line(row.id, 40), agent=one_line(scrub(str(row.agent)) or "", 64), host=one_line(row.host, 100),
        pid=row.pid, kill_mode=one_line(row.kill_mode, 16), steps=row.steps,
        tool_calls=row.tool_calls, tool_errors=row.tool_errors, cost_eur=row.cost_eur,
        duration_s=max(0.0, (end - row.started_at).total_seconds()), top_tool=top,
        last_error=_line(scrub(last_error), 300), progress=_line(scrub(row.progress), 300),
        tokens=(row.tokens_in or 0) + (row.tokens_out or 0),
        unpriced_tokens=getattr(row, "cost_unpriced_tokens", 0) or 0,
        partial=_line(scrub(getattr(row, "partial", None)), 500))


def _line(text: str | None, limit: int) -> str | None:
    return None if text is None else one_line(text, limit)


def budgets_of_child(child: Any, parent_budgets: Budgets) -> Budgets:
    """What a child run's alert shows it against: its own columns over its parent's profile
    (the daemon's config is not at hand here; a child never has more than its parent)."""
    return for_run(parent_budgets, child)


def stop_run(conn: Connection, row: Any, *, reason: str, detail: str, now: dt.datetime, by: str, budgets: Budgets,
             run_facts: RunFacts, sealer: Sealer | None = None, why: str | None = None,
             own_parent: Callable[[Any], bool] | None = None) -> bool:
    """running (or paused) -> stopping, with its intervention and (from the daemon, `sealer` given)
    its alert, and the same for the run's active child runs; False if someone else got there
    first. `why`: said before the plan (a paused run nobody answered, or killed while paused)."""
    plan = stop_plan(row.kill_mode, getattr(row, "source", None))
    outcome = f"{why}; {plan}" if why else plan
    iid = run_rows.request_stop(conn, row.id, reason=reason, detail=detail, outcome=outcome, now=now, by=by)
    if iid is None:
        return False
    if sealer is not None:
        announce(conn, Outcome.of(Say.STOP, AlertKind.STOP.key(row.id), row.id, f=with_top_child(conn, row, run_facts),
                               b=budgets, reason=reason, detail=detail, action=outcome),
                 now=now, sealer=sealer, audit=iid)
    for child, child_detail in run_rows.stop_children(conn, row, reason=reason, detail=detail, now=now, by=by):
        if sealer is None:
            continue
        if own_parent is not None and not own_parent(child):
            # issue 20: the link to this parent is not the daemon's own record (any writer can set
            # parent_id): a cooperative stop, alerted as a stop the daemon did not decide.
            said = Outcome.of(Say.REQUESTED_STOP, AlertKind.STOP.key(child.id), child.id, f=facts(child, now=now),
                           b=budgets_of_child(child, budgets), reason=reason, plan=NOT_OWN_PARENT)
        else:
            said = Outcome.of(Say.STOP, AlertKind.STOP.key(child.id), child.id, f=facts(child, now=now),
                           b=budgets_of_child(child, budgets), reason=reason, detail=child_detail,
                           action=stop_plan(child.kill_mode))
        announce(conn, said, now=now, sealer=sealer)
    return True


def lose_run(conn: Connection, row: Any, *, detail: str, now: dt.datetime, by: str, budgets: Budgets,
             run_facts: RunFacts, sealer: Sealer | None = None) -> bool:
    """An active run whose process is gone: lost, recorded and alerted; False if it was not active."""
    iid = run_rows.mark_lost(conn, row.id, detail=detail, now=now, by=by)
    if iid is None:
        return False
    announce(conn, Outcome.of(Say.LOST, AlertKind.LOST.key(row.id), row.id, f=run_facts, b=budgets, detail=detail),
             now=now, sealer=sealer, audit=iid)
    return True


def stop_unreadable(conn: Connection, run_id: str, *, reason: str, detail: str, outcome: str, now: dt.datetime,
                    by: str, sealer: Sealer | None = None) -> bool:
    """running / paused -> stopping for a run whose row the daemon cannot read whole (it never
    builds a row object): its intervention and alert, worded by the daemon. False if it was not active."""
    iid = run_rows.request_stop(conn, run_id, reason=reason, detail=detail, outcome=outcome, now=now, by=by)
    if iid is None:
        return False
    announce(conn, Outcome.of(Say.UNREADABLE_STOP, AlertKind.STOP.key(run_id), run_id, run_id=run_id, reason=reason,
                           detail=detail), now=now, sealer=sealer, audit=iid)
    return True


def lose_unreadable(conn: Connection, run_id: str, *, pid: int, host: str, now: dt.datetime, by: str,
                    sealer: Sealer | None = None) -> bool:
    """An active run the daemon cannot read whole whose process is gone: lost."""
    iid = run_rows.mark_lost(conn, run_id, detail=GONE, now=now, by=by,
                          outcome="marked lost (its row could not be read whole)")
    if iid is None:
        return False
    announce(conn, Outcome.of(Say.UNREADABLE_LOST, AlertKind.LOST.key(run_id), run_id, run_id=run_id, pid=pid,
                           host=host), now=now, sealer=sealer, audit=iid)
    return True
