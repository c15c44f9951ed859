"""Alert texts. Pure: numbers in, title and body out.

An alert must let the on-call human act from the phone: which agent, which run,
which tool it was stuck on, the numbers against the budgets, what was done, and
the command to look closer.
"""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.core.budgets import Budgets, Totals, counter_lines


@dataclass(frozen=True)
class RunFacts:
    id: str
    agent: str
    host: str
    pid: int | None
    kill_mode: str
    steps: int
    tool_calls: int
    tool_errors: int
    cost_eur: float
    duration_s: float
    top_tool: tuple[str, int, int] | None  # name, calls, errors
    last_error: str | None = None
    progress: str | None = None  # the last heartbeat's text: for a hung run, where it hangs
    tokens: int = 0  # in + out
    unpriced_tokens: int = 0  # tokens of steps no price table priced: their cost is not in cost_eur
    forecast: tuple[str, ...] = ()  # burn-rate lines (watchdog.core.forecast): the run's, its period budgets'


def top_tool_line(f: RunFacts) -> str:
    if not f.top_tool:
        return "top tool: none (no tool calls)"
    name, calls, errors = f.top_tool
    share = 100 * calls // f.tool_calls if f.tool_calls else 0
    line = f"top tool: {name} ×{calls} ({share}%), {errors} errors"
    if f.last_error:
        line += f" — last error: {f.last_error}"
    return line


def totals(f: RunFacts) -> Totals:
    return Totals(steps=f.steps, tool_calls=f.tool_calls, cost_eur=f.cost_eur, tokens=f.tokens, age_s=f.duration_s)


def counters(f: RunFacts, b: Budgets) -> list[str]:
    """The run's numbers against its budgets, one line each (the registry says which and how)."""
    return counter_lines(totals(f), b, f.tool_errors)


def _body(f: RunFacts, b: Budgets, lines: list[str]) -> str:
    head = [f"agent {f.agent}   run {f.id}", f"host {f.host}   pid {f.pid if f.pid else '-'}   kill_mode {f.kill_mode}"]
    tail = ["", *counters(f, b), top_tool_line(f)]
    if f.unpriced_tokens:
        tail.append(f"unpriced: {f.unpriced_tokens} tokens of models no price table knows (not in the cost)")
    tail += list(f.forecast)
    if f.progress:
        tail.append(f"last progress: {f.progress[:200]}")
    tail += ["", f"agent-watchdog show {f.id[:8]}"]
    return "\n".join(head + lines + tail)


def stop_alert(f: RunFacts, b: Budgets, reason: str, detail: str, action: str) -> tuple[str, str]:
    title = f"agent-watchdog: stopped {f.agent} run {f.id[:8]} — {reason}"
    return title, _body(f, b, [f"reason {reason}: {detail}", f"action {action}"])


def escalation_alert(f: RunFacts, b: Budgets, reason: str, outcome: str, failed: bool) -> tuple[str, str]:
    verb = "could not stop" if failed else "signalled"
    title = f"agent-watchdog: {verb} {f.agent} run {f.id[:8]} — {reason}"
    return title, _body(f, b, [f"reason {reason}", f"ladder {outcome}"])


def lost_alert(f: RunFacts, b: Budgets, detail: str) -> tuple[str, str]:
    title = f"agent-watchdog: lost {f.agent} run {f.id[:8]} — process_gone"
    return title, _body(f, b, [f"reason process_gone: {detail}", "action none needed: marked lost"])


def rate_alert(f: RunFacts, b: Budgets, calls_min: int, top: tuple[str, int] | None, stopping: bool) -> tuple[str, str]:
    top_txt = f", top {top[0]} ×{top[1]}" if top else ""
    title = f"agent-watchdog: LOOP? run {f.id[:8]}: {calls_min} tool calls/min{top_txt}"
    action = "stopping the run (on_rate = \"stop\")" if stopping else "alert only (on_rate = \"alert\")"
    return title, _body(f, b, [f"rate {calls_min} tool calls/min > {b.max_tool_calls_per_min}{top_txt}",
                               f"action {action}"])


def cooperative_alert(f: RunFacts, b: Budgets, reason: str, grace_s: float, sharing: int) -> tuple[str, str]:
    title = f"agent-watchdog: {f.agent} run {f.id[:8]} did not stop — {reason}"
    why = (f"shares its process with {sharing} other run{'s' if sharing != 1 else ''}" if sharing else
           "its kill_mode is cooperative (it does not own its process)")
    lines = [f"reason {reason}",
             f"action none more: did not stop {grace_s:g} s after the cooperative stop and {why}; not signalled"]
    return title, _body(f, b, lines)
