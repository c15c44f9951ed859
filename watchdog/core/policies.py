"""The judge's pure rules: a run snapshot and its budgets in, verdicts out; which breaches pause and what
`resume` grants.

Pure policy functions: a run snapshot + its effective budgets + now → verdicts.

No database, no OS, no clock of their own: the tick passes everything in, so
each policy is tested with plain values. There is one policy per budget of the
registry (watchdog.core.budgets), and they all compare the same way the SDK's
guards do: `Budget.over`.

Pause and approve: which breaches pause, what `resume` grants, and what the alerts say.

With `on_breach = "pause"` a run over a budget that `resume` can raise (steps, tool
calls, money, wall clock) is held instead of stopped, and a human decides:
`agent-watchdog resume RUN --add-steps N` or `agent-watchdog kill RUN`. Loops,
silence and a vanished process never pause: they stop. Nobody answers within
`approval_timeout_s`: the run is stopped with the reason it paused for.

Pure: numbers in, decisions and texts out.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Callable, TYPE_CHECKING, Mapping, Sequence

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import BUDGETS, BY_KEY, RATE, Budget, Budgets, Totals, PAUSABLE
from watchdog.core.text import marked, command_id, run_ref
from watchdog.core.messages import RunFacts, body
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
    # stored as the stop's detail and quoted in its alert (watchdog.core.text).
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


# -- Pause and approve: which breaches pause, what `resume` grants, and what the alerts say ------------------------

BY_REASON: dict[str, Budget] = {b.reason: b for b in PAUSABLE}
# `resume` option → the budget it raises ("add-steps" → max_steps).
BY_OPTION: dict[str, Budget] = {b.add_option: b for b in PAUSABLE if b.add_option}


def pauses(prof: Budgets, reason: str) -> bool:
    """A breach of `reason` pauses this profile's run (else it stops)."""
    budget = BY_REASON.get(reason)
    if budget is None:
        return False
    on = prof.on_breach
    if isinstance(on, Mapping):
        return on.get(budget.key) == "pause"
    return on == "pause"


def decide(verdicts: Sequence[Verdict], prof: Budgets) -> tuple[str, Verdict]:
    """("pause" | "stop", the verdict acted on) for a running run's verdicts (most specific first).
    A run pauses only when every budget it broke pauses: one that stops (a loop, silence) wins."""
    for v in verdicts:
        if not pauses(prof, v.reason):
            return "stop", v
    return "pause", verdicts[0]


def stops_while_paused(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The verdicts that still act on a paused run: those that can never pause (a loop, silence).
    Budgets that pause are not judged again until a human answers."""
    return [v for v in verdicts if v.reason not in BY_REASON]


@dataclass(frozen=True)
class Grant:
    """What `resume` adds: budget key → amount (> 0)."""

    adds: Mapping[str, float]

    @classmethod
    def from_options(cls, **options: float | None) -> "Grant":
        """From `add_steps=5, add_eur=None, ...` (the CLI's option names, "-" as "_")."""
        adds: dict[str, float] = {}
        for name, value in options.items():
            if value is None:
                continue
            budget = BY_OPTION.get(name.replace("_", "-"))
            if budget is None:
                raise ValueError(f"--{name.replace('_', '-')}: not a resume option "
                                 f"(expected one of {', '.join('--' + o for o in BY_OPTION)})")
            try:
                adds[budget.key] = budget.validate(value)
            except ValueError as exc:
                raise ValueError(f"--{budget.add_option}: {exc}") from None
        return cls(adds)

    def columns(self, current: Budgets, paused_s: float) -> dict[str, float]:
        """The run's new budget columns: every run budget pinned at what it is held to now
        (a resumed run's own columns hold, above its profile too), plus the grant. Time spent
        paused does not count against max_wall_s: it is added to it as well."""
        from watchdog.core.budgets import RUN_BUDGETS

        out = {b.key: getattr(current, b.key) for b in RUN_BUDGETS}
        for key, amount in self.adds.items():
            out[key] = out[key] + amount
        if paused_s >= 1:
            out["max_wall_s"] = out["max_wall_s"] + math.ceil(paused_s)
        return {k: (int(v) if BY_KEY[k].integer else float(v)) for k, v in out.items()}

    def describe(self, before: Budgets, after: Mapping[str, float]) -> str:
        """ "max_steps 12 → 17, max_wall_s 300 → 912 (paused 612 s)" """
        parts = []
        for key in after:
            old, new = getattr(before, key), after[key]
            if new != old:
                parts.append(f"{key} {_num(old)} → {_num(new)}")
        return ", ".join(parts)


def still_over(reason: str | None, used: Totals, limits: Mapping[str, float], grant: Grant) -> str | None:
    """Why a resume would not help: the budget the run paused for is still broken with the
    new limits (the run would pause again at once), or None."""
    budget = BY_REASON.get(reason or "")
    if budget is None:
        return None
    value, limit = getattr(used, budget.measure), limits[budget.key]
    if not budget.over(value, limit):
        return None
    need = value - (limit - grant.adds.get(budget.key, 0))  # what --add-... must be at least
    need = math.ceil(need) if budget.integer else round(need + 0.005, 2) if budget.unit == "EUR" else math.ceil(need)
    return (f"the run paused for {reason} ({budget.label} {budget.fmt(value, limit)}); with {budget.key} "
            f"{_num(limit)} it would pause again at once: give --{budget.add_option} {_num(need)} or more")


def suggestion(reason: str, used: Totals, prof: Budgets) -> str:
    """The `--add-...` the pause alert suggests: half the budget again, at least enough to un-breach."""
    budget = BY_REASON[reason]
    limit = getattr(prof, budget.key)
    value = getattr(used, budget.measure)
    need = max(0.0, value - limit)
    amount = max(limit / 2, need * 1.5)
    if budget.integer:
        amount = max(1, math.ceil(amount))
    elif budget.unit == "EUR":
        amount = max(0.01, math.ceil(amount * 100) / 100)
    else:
        amount = max(1, math.ceil(amount))
    return f"--{budget.add_option} {_num(amount)}"


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# --- alert texts ---------------------------------------------------------------------


def _used(f: RunFacts) -> Totals:
    return Totals(steps=f.steps, tool_calls=f.tool_calls, cost_eur=f.cost_eur, tokens=f.tokens, age_s=f.duration_s)


def _rid(f: RunFacts) -> str:
    # Only an id of the generated form goes into a command to paste; any other is RUN (see `runs`).
    return command_id(f.id) or "RUN"


def resume_command(f: RunFacts, prof: Budgets, reason: str) -> str:
    """How to resume this pause, as the operator types it (DESIGN.md: `resume RUN_ID --add-…`)."""
    return f"agent-watchdog resume {_rid(f)} {suggestion(reason, _used(f), prof)}"


def what_to_do(f: RunFacts, prof: Budgets, reason: str) -> list[str]:
    others = ", ".join(f"--{b.add_option} {'X' if b.unit == 'EUR' else 'N'}" for b in PAUSABLE if b.reason != reason)
    lines = [f"to continue: {resume_command(f, prof, reason)}   (or {others})",
             f"to stop:     agent-watchdog kill {_rid(f)}"]
    if command_id(f.id) is None:
        lines.append("RUN: the run's id (agent-watchdog runs --status paused)")
    return lines


def pause_alert(f: RunFacts, prof: Budgets, reason: str, detail: str, by_guard: bool) -> tuple[str, str]:
    title = f"agent-watchdog: paused {run_ref(f.id)} — {reason}: to resume, {resume_command(f, prof, reason)}"
    held = ("its in-process guard held it before the call that would exceed the budget" if by_guard else
            "held at its next record: no model or tool call goes through")
    lines = [f"reason {reason}: {detail}",
             f"action paused, waiting for a human ({held}); stopped with {reason} if nobody answers "
             f"within {_num(prof.approval_timeout_s)} s",
             "", *what_to_do(f, prof, reason)]
    return title, body(f, prof, lines)


def resume_alert(f: RunFacts, prof: Budgets, reason: str | None, granted: str, by: str) -> tuple[str, str]:
    title = f"agent-watchdog: resumed {run_ref(f.id)}" + (f" — {reason}" if reason else "")
    return title, body(f, prof, [f"resumed by {by}: {granted}"])


def measured_detail(reason: str, f: RunFacts, prof: Budgets) -> str:
    """The one line a pause or a timed-out pause says, from the daemon's numbers: never the
    row's stop_detail, which any writer of the row chose (issue 20)."""
    budget = BY_REASON.get(reason)
    if budget is None:
        return "paused without a budget that pauses"
    value = {"steps": f.steps, "tool_calls": f.tool_calls, "cost_eur": f.cost_eur, "tokens": f.tokens,
             "age_s": f.duration_s}.get(budget.measure, 0)
    limit = getattr(prof, budget.key, None)
    return budget.detail(value or 0, limit) if limit is not None else budget.key


def timeout_plan(prof: Budgets, plan: str) -> str:
    return f"nobody answered within approval_timeout_s {_num(prof.approval_timeout_s)} s of the pause; {plan}"


def waited_s(now: dt.datetime, since_s: float | None, paused_at: dt.datetime | None) -> float | None:
    """How long a paused run has waited for a human: since the daemon paused it or confirmed the
    pause (`since_s`, epoch seconds from its state file), else since the row's paused_at."""
    if since_s is not None:
        return now.timestamp() - since_s
    return (now - paused_at).total_seconds() if paused_at is not None else None


def approval_expired(paused_at: dt.datetime | None, reason: str | None, waited: float | None,
                     approval_timeout_s: float) -> bool:
    """A paused run is stopped: nobody answered within approval_timeout_s, or nobody could
    answer (no pause time, or a reason no `resume` option raises)."""
    if paused_at is None or reason not in BY_REASON:
        return True
    return waited is not None and waited >= approval_timeout_s
