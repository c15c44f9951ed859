"""Child runs on the SDK side: their budgets, their roll-up into the parent, the status they obey.

`run.child(agent="researcher", max_steps=5)` opens a run whose `parent_id` is the
parent's id. Its budgets are its own, never above what the parent has left when it
opens. Each of its records is still one transaction: it also adds the child's steps,
tool calls and spend to every ancestor's row (so the daemon judges a parent on its
totals without reading its children), and reads back the child's status *and* its
ancestors': a paused parent holds its children, a stopped one stops them.

A child in another process opens with `wd.run(..., parent_id=ID)`: its ancestors and
the parent's budgets left are read from the store once, at start.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from watchdog.core import budgets as bud
from watchdog.core import lifecycle as lc
from watchdog.errors import RunKilled
from watchdog.store.lineage import parent_run

if TYPE_CHECKING:
    from watchdog.sdk.seams import RunLike, WatchdogLike

MAX_DEPTH = 32  # a parent_id chain is never followed further (a cycle written by hand)
# The totals a child spends from its parent: the registry's measure → the Run attribute.
_SPENT = {"steps": "steps", "tool_calls": "tool_calls", "cost_eur": "cost_eur", "age_s": "elapsed_s"}


def obeyed_stop(row: Sequence[Any], run_id: str) -> RunKilled | None:
    """The stop a status row (own or an ancestor's) means for this run, or None."""
    status, reason, detail = row[0], row[1], row[2]
    if status not in (lc.STOPPING, lc.KILLED, lc.LOST):
        return None
    whose = row[3] if len(row) > 3 else run_id
    if whose != run_id:
        return RunKilled(reason or lc.MANUAL, f"its parent run {whose[:8]} was stopped: {detail or reason or ''}")
    return RunKilled(reason or lc.MANUAL, detail or "")


# --- budgets: never above what the parent has left ------------------------------


def left_of(parent_budgets: bud.Budgets, spent: Mapping[str, float]) -> dict[str, float]:
    """Per run budget, what the parent has left (limit - spent) or, for budgets a child does not
    spend from (identical calls, silence), the parent's own limit."""
    out = {}
    for b in bud.RUN_BUDGETS:
        limit = getattr(parent_budgets, b.key)
        out[b.key] = limit - spent[b.measure] if b.measure in spent else limit
    return out


def exhausted(left: Mapping[str, float]) -> tuple[bud.Budget, float] | None:
    for b in bud.RUN_BUDGETS:
        value = left[b.key]
        if (b.integer and value < 1) or value <= 0:
            return b, value
    return None


def clamp(asked: Mapping[str, float], child_profile: bud.Budgets, left: Mapping[str, float]) -> dict[str, float]:
    """The child's own budget columns: what it asked for (else its profile's), at most the parent's left."""
    out = {}
    for b in bud.RUN_BUDGETS:
        want = asked.get(b.key, getattr(child_profile, b.key))
        cap = int(left[b.key]) if b.integer else left[b.key]
        out[b.key] = min(want, cap)
    return out


def no_room(parent: RunLike, left: Mapping[str, float]) -> None:
    """RunKilled (the parent's breach) when the parent has nothing left to give a child."""
    hit = exhausted(left)
    if hit is not None:
        b, value = hit
        raise RunKilled(b.reason, f"no {b.label} left for a child run ({b.key} {b.fmt(getattr(parent.budgets, b.key))}, "
                                  f"left {b.fmt(max(value, 0))})")


def spent_in_process(parent: RunLike) -> dict[str, float]:
    spent = {m: getattr(parent, attr) for m, attr in _SPENT.items()}
    spent["tokens"] = parent.tokens_in + parent.tokens_out
    return spent


def from_store(wd: WatchdogLike, parent_id: str) -> tuple[tuple[str, ...], bud.Budgets, dict[str, float]]:
    """(ancestor ids nearest first, the parent's budgets left) for a child in another process."""
    parent = parent_run(wd.writer, parent_id)
    if parent is None:
        raise ValueError(f"parent_id: no run {parent_id!r} in the store")
    if parent.status not in lc.ACTIVE_STATUSES:
        raise ValueError(f"parent_id: run {parent_id[:8]} already ended ({parent.status}): a child needs a live parent")
    chain = [parent_id]
    up = parent.parent_id
    while up and up not in chain and len(chain) < MAX_DEPTH:
        chain.append(up)
        found = parent_run(wd.writer, up)
        up = found.parent_id if found else None
    budgets = bud.for_run(wd.config().profile(parent.agent), parent.budget_row())
    started = parent.started_at
    age_s = (dt.datetime.now(dt.timezone.utc) - started).total_seconds() if started else 0.0
    spent = {"steps": parent.steps, "tool_calls": parent.tool_calls, "cost_eur": parent.cost_eur, "age_s": age_s,
             "tokens": parent.tokens}
    return tuple(chain), budgets, left_of(budgets, spent)
