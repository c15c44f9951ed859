"""Pure policy functions: a run snapshot + its effective budgets + now → verdicts.

No database, no OS, no clock of their own: the tick passes everything in, so
each policy is tested with plain values. There is one policy per budget of the
registry (watchdog.core.budgets), and they all compare the same way the SDK's
guards do: `Budget.over`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Callable

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import BUDGETS, BY_KEY, RATE, Budget, Budgets, Totals
from watchdog.core.marked import marked
from watchdog.core.periods import PeriodState


@dataclass(frozen=True)
class RunSnapshot:
    id: str
    agent: str
    started_at: dt.datetime
    last_seen_at: dt.datetime
    steps: int
    tool_calls: int
    tool_errors: int
    cost_eur: float
    tokens: int = 0  # in + out
    # The most repeated (tool, args hash) of the run and its count.
    top_signature: tuple[str, int] | None = None
    # Tool calls in the last minute, and the top tool among them.
    calls_last_min: int = 0
    top_tool_last_min: tuple[str, int] | None = None


@dataclass(frozen=True)
class Verdict:
    reason: str
    value: float
    limit: float
    detail: str  # one human line: "steps 13/12"


# When several policies trip in one tick, name the most specific cause.
PRIORITY = (
    lc.LOOP_DETECTED,
    lc.MAX_COST,
    lc.MAX_TOKENS,
    lc.MAX_TOOL_CALLS,
    lc.MAX_STEPS,
    lc.DAILY_BUDGET,
    lc.MONTHLY_BUDGET,
    lc.TOOL_RATE,
    lc.WALL_CLOCK,
    lc.HEARTBEAT_TIMEOUT,
)


def totals(s: RunSnapshot, now: dt.datetime) -> Totals:
    return Totals(
        steps=s.steps, tool_calls=s.tool_calls, cost_eur=s.cost_eur, tokens=s.tokens,
        age_s=(now - s.started_at).total_seconds(), silent_s=(now - s.last_seen_at).total_seconds(),
        identical_calls=s.top_signature[1] if s.top_signature else 0, calls_last_min=s.calls_last_min)


def check(budget: Budget, s: RunSnapshot, b: Budgets, now: dt.datetime, used: Totals | None = None) -> Verdict | None:
    """The verdict of one budget on one run, or None."""
    used = used or totals(s, now)
    value, limit = getattr(used, budget.measure), getattr(b, budget.key)
    if not budget.over(value, limit):
        return None
    detail = budget.detail(value, limit)
    # A tool's name is the writer's text: marked (one line, bounded, defanged), since the detail is
    # stored as the stop's detail and quoted in its alert (watchdog.core.marked).
    if budget.measure == "identical_calls" and s.top_signature:
        detail = f"{marked(s.top_signature[0])} {detail}"
    elif budget is RATE and s.top_tool_last_min:
        detail += f", top {marked(s.top_tool_last_min[0])} ×{s.top_tool_last_min[1]}"
    return Verdict(budget.reason, value, limit, detail)


# One budget's judgement of one run at `now`: its verdict, or None.
Policy = Callable[[RunSnapshot, Budgets, dt.datetime], Verdict | None]


def _policy(key: str) -> Policy:
    budget = BY_KEY[key]

    def policy(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
        return check(budget, s, b, now)

    policy.__name__ = budget.reason
    policy.__doc__ = f"{budget.key}: stop with {budget.reason} when {budget.label} goes over it."
    return policy


wall_clock = _policy("max_wall_s")
max_steps = _policy("max_steps")
max_tool_calls = _policy("max_tool_calls")
max_cost = _policy("max_cost_eur")
loop_detected = _policy("max_identical_calls")
heartbeat_timeout = _policy("heartbeat_timeout_s")
tool_rate = _policy("max_tool_calls_per_min")


def evaluate(s: RunSnapshot, b: Budgets, now: dt.datetime, *, skip_clock: bool = False) -> list[Verdict]:
    """Every verdict against the run, the most specific first. The rate only stops with on_rate = "stop".
    `skip_clock`: the wall clock just jumped; durations measured on it are not judged."""
    used = totals(s, now)
    verdicts = []
    for budget in BUDGETS:
        if (budget is RATE and b.on_rate != "stop") or (skip_clock and budget.clock):
            continue
        if (v := check(budget, s, b, now, used)) is not None:
            verdicts.append(v)
    return sorted(verdicts, key=lambda v: PRIORITY.index(v.reason) if v.reason in PRIORITY else len(PRIORITY))


def period_budget(state: PeriodState) -> Verdict:
    """A spent period budget (watchdog.core.periods.PeriodState) stops every running run it covers:
    the run may be well within its own budgets, the agent's (or tenant's) day is not."""
    return Verdict(state.reason, state.spent_eur, state.budget_eur,
                   f"{state.marked_label} is spent: {state.spent_eur:.2f}/{state.budget_eur:.2f} EUR ({state.key})")


def with_period(verdicts: list[Verdict], state: PeriodState | None) -> list[Verdict]:
    """`evaluate`'s verdicts plus the period budget's, the most specific still first."""
    if state is None:
        return verdicts
    return sorted([*verdicts, period_budget(state)], key=lambda v: PRIORITY.index(v.reason)
                  if v.reason in PRIORITY else len(PRIORITY))


def rate_alarm(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    """The tool-rate alarm: alert first (and stop only with on_rate = "stop")."""
    return tool_rate(s, b, now)
