"""Pure policy functions: a run snapshot + its effective budgets + now → verdicts.

No database, no OS, no clock of their own: the tick passes everything in, so
each policy is tested with plain values.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from watchdog.core import lifecycle as lc
from watchdog.core.config import Budgets


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
    lc.MAX_TOOL_CALLS,
    lc.MAX_STEPS,
    lc.TOOL_RATE,
    lc.WALL_CLOCK,
    lc.HEARTBEAT_TIMEOUT,
)


def wall_clock(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    age_s = (now - s.started_at).total_seconds()
    if age_s > b.max_wall_s:
        return Verdict(lc.WALL_CLOCK, age_s, b.max_wall_s, f"running {age_s:.0f} s > max_wall_s {b.max_wall_s:g} s")
    return None


def max_steps(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    if s.steps > b.max_steps:
        return Verdict(lc.MAX_STEPS, s.steps, b.max_steps, f"steps {s.steps}/{b.max_steps}")
    return None


def max_tool_calls(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    if s.tool_calls > b.max_tool_calls:
        return Verdict(lc.MAX_TOOL_CALLS, s.tool_calls, b.max_tool_calls,
                       f"tool calls {s.tool_calls}/{b.max_tool_calls}")
    return None


def max_cost(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    if s.cost_eur > b.max_cost_eur:
        digits = 2 if b.max_cost_eur >= 1 else 4
        return Verdict(lc.MAX_COST, s.cost_eur, b.max_cost_eur,
                       f"cost {s.cost_eur:.{digits}f}/{b.max_cost_eur:.{digits}f} EUR")
    return None


def loop_detected(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    if s.top_signature and s.top_signature[1] >= b.max_identical_calls:
        tool, count = s.top_signature
        return Verdict(lc.LOOP_DETECTED, count, b.max_identical_calls,
                       f"{tool} called {count}× with identical arguments (max_identical_calls {b.max_identical_calls})")
    return None


def heartbeat_timeout(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    silent_s = (now - s.last_seen_at).total_seconds()
    if silent_s > b.heartbeat_timeout_s:
        return Verdict(lc.HEARTBEAT_TIMEOUT, silent_s, b.heartbeat_timeout_s,
                       f"silent for {silent_s:.0f} s > heartbeat_timeout_s {b.heartbeat_timeout_s:g} s")
    return None


def tool_rate(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    if s.calls_last_min > b.max_tool_calls_per_min:
        top = f", top {s.top_tool_last_min[0]} ×{s.top_tool_last_min[1]}" if s.top_tool_last_min else ""
        return Verdict(lc.TOOL_RATE, s.calls_last_min, b.max_tool_calls_per_min,
                       f"{s.calls_last_min} tool calls/min > {b.max_tool_calls_per_min}{top}")
    return None


BUDGET_POLICIES = (loop_detected, max_cost, max_tool_calls, max_steps, wall_clock, heartbeat_timeout)


def evaluate(s: RunSnapshot, b: Budgets, now: dt.datetime) -> list[Verdict]:
    """Every verdict against the run, the most specific first. The rate only stops with on_rate = "stop"."""
    verdicts = [v for p in BUDGET_POLICIES if (v := p(s, b, now))]
    if b.on_rate == "stop" and (v := tool_rate(s, b, now)):
        verdicts.append(v)
    return sorted(verdicts, key=lambda v: PRIORITY.index(v.reason))


def rate_alarm(s: RunSnapshot, b: Budgets, now: dt.datetime) -> Verdict | None:
    """The tool-rate alarm: alert first (and stop only with on_rate = "stop")."""
    return tool_rate(s, b, now)
