"""Alert texts. Pure: numbers in, title and body out.

An alert must let the on-call human act from the phone: which agent, which run,
which tool it was stuck on, the numbers against the budgets, what was done, and
the command to look closer. What the run's writer chose (its agent's name, its tools',
its host, its texts) appears only in the body, marked (watchdog.core.marked); a title
is the daemon's own words.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets, Totals, counter_lines
from watchdog.core.marked import TEXT_CHARS, ident, marked, reason_ref, run_ref, show_command


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
    partial: str | None = None  # what the run stored with run.partial(): kept across a stop
    top_child: str | None = None  # a parent run: its child run that spent most, as one line
    reason: str | None = None  # why it stopped, for the partial-answer line


def top_tool_line(f: RunFacts) -> str:
    if not f.top_tool:
        return "top tool: none (no tool calls)"
    name, calls, errors = f.top_tool
    share = 100 * calls // f.tool_calls if f.tool_calls else 0
    line = f"top tool: {marked(name)} ×{calls} ({share}%), {errors} errors"
    if f.last_error:
        line += f" — last error: {marked(f.last_error, TEXT_CHARS)}"
    return line


def totals(f: RunFacts) -> Totals:
    return Totals(steps=f.steps, tool_calls=f.tool_calls, cost_eur=f.cost_eur, tokens=f.tokens, age_s=f.duration_s)


def counters(f: RunFacts, b: Budgets) -> list[str]:
    """The run's numbers against its budgets, one line each (the registry says which and how)."""
    return counter_lines(totals(f), b, f.tool_errors)


def reason_of(reason: str | None) -> str:
    """A stop reason in a body: the daemon's own word as is, any other marked (a writer chose it)."""
    return reason if isinstance(reason, str) and reason in lc.STOP_REASONS else marked(reason)


def title_reason(reason: str | None) -> str:
    return reason_ref(reason, lc.STOP_REASONS)


def _body(f: RunFacts, b: Budgets, lines: list[str]) -> str:
    kill_mode = f.kill_mode if f.kill_mode in lc.KILL_MODES else marked(f.kill_mode, 16)
    head = [f"agent {marked(f.agent)}   run {ident(f.id)}",
            f"host {marked(f.host)}   pid {f.pid if f.pid else '-'}   kill_mode {kill_mode}"]
    tail = ["", *counters(f, b), top_tool_line(f)]
    if f.top_child:
        tail.append(f"child that spent most: {marked(f.top_child, TEXT_CHARS)}")
    if f.unpriced_tokens:
        tail.append(f"unpriced: {f.unpriced_tokens} tokens of models no price table knows (not in the cost)")
    tail += list(f.forecast)
    if f.progress:
        tail.append(f"last progress: {marked(f.progress, TEXT_CHARS)}")
    if f.partial:
        at = f"stopped at {reason_of(f.reason)} " if f.reason else ""
        tail.append(f"{at}with a partial answer: {marked(f.partial, 300)}")
    tail += ["", show_command(f.id)]  # only an id of the generated form is pasted into a command
    return "\n".join(head + lines + tail)


body = _body  # the layout every alert shares, for alert texts composed elsewhere (pause)


# The plans and ladder outcomes that mean no signal follows: the run was asked to stop and goes
# on until it obeys (issue 36): the title says so, never "stopped".
NOT_SIGNALLED = "not signalled"


def _asked_only(said: str) -> bool:
    return NOT_SIGNALLED in said


def stop_alert(f: RunFacts, b: Budgets, reason: str, detail: str, action: str) -> tuple[str, str]:
    verb = f"{run_ref(f.id)} asked to stop; not signalled" if _asked_only(action) else f"stopped {run_ref(f.id)}"
    title = f"agent-watchdog: {verb} — {title_reason(reason)}"
    if f.partial and not f.reason:
        f = dataclasses.replace(f, reason=reason)
    return title, _body(f, b, [f"reason {reason_of(reason)}: {detail}", f"action {action}"])


def escalation_alert(f: RunFacts, b: Budgets, reason: str, outcome: str, failed: bool) -> tuple[str, str]:
    if _asked_only(outcome) and "any more" not in outcome:  # "any more": a SIGTERM went out before
        verb = f"{run_ref(f.id)} asked to stop; not signalled"
    else:
        verb = f"{'could not stop' if failed else 'signalled'} {run_ref(f.id)}"
    title = f"agent-watchdog: {verb} — {title_reason(reason)}"
    return title, _body(f, b, [f"reason {reason_of(reason)}", f"ladder {outcome}"])


def lost_alert(f: RunFacts, b: Budgets, detail: str) -> tuple[str, str]:
    title = f"agent-watchdog: lost {run_ref(f.id)} — process_gone"
    return title, _body(f, b, [f"reason process_gone: {detail}", "action none needed: marked lost"])


def rate_alert(f: RunFacts, b: Budgets, calls_min: int, top: tuple[str, int] | None, stopping: bool) -> tuple[str, str]:
    title = f"agent-watchdog: LOOP? {run_ref(f.id)}: {calls_min} tool calls/min"
    top_txt = f", top {marked(top[0])} ×{top[1]}" if top else ""
    action = "stopping the run (on_rate = \"stop\")" if stopping else "alert only (on_rate = \"alert\")"
    return title, _body(f, b, [f"rate {calls_min} tool calls/min > {b.max_tool_calls_per_min}{top_txt}",
                               f"action {action}"])


def cooperative_alert(f: RunFacts, b: Budgets, reason: str, grace_s: float, sharing: int) -> tuple[str, str]:
    title = f"agent-watchdog: {run_ref(f.id)} did not stop; not signalled — {title_reason(reason)}"
    why = (f"shares its process with {sharing} other run{'s' if sharing != 1 else ''}" if sharing else
           "its kill_mode is cooperative (it does not own its process)")
    lines = [f"reason {reason_of(reason)}",
             f"action none more: did not stop {grace_s:g} s after the cooperative stop and {why}; not signalled"]
    return title, _body(f, b, lines)


def no_daemon_alert(host: str, active_runs: int, last_pid: int | None, last_tick: str | None,
                    by: str) -> tuple[str, str]:
    """A host whose daemon's lease has expired (or that never had one): its runs are adopted."""
    title = "agent-watchdog: a host has no live daemon: its runs cannot be signalled"
    last = (f"last daemon: pid {last_pid}, last tick {last_tick or 'never'}" if last_pid is not None
            else "no daemon of this store ever ran on it")
    lines = [
        f"host {marked(host)}   active runs {active_runs}",
        last,
        f"adopted by {by}: runs over budget get a cooperative stop (they see it on their next write);",
        "no process of that host is signalled (only a host's own daemon may), so a run that ignores the stop goes on",
        "",
        "start agent-watchdog on that host (systemctl start agent-watchdog) to signal them again",
    ]
    return title, "\n".join(lines)
# How an acknowledged store request reads: a sealed alert with these words was not a decision.
ACK_MARK = "(requested in the store:"


def requested_stop_alert(f: RunFacts, b: Budgets, reason: str, plan: str) -> tuple[str, str]:
    """A stop this daemon did not decide (the run's own guard, `agent-watchdog kill`, any store
    writer). Worded from the store's numbers only: the requester's free text is not quoted, so
    whoever can write a row cannot put words in front of the on-call human."""
    verb = f"{run_ref(f.id)} asked to stop; not signalled" if _asked_only(plan) else f"stopped {run_ref(f.id)}"
    title = f"agent-watchdog: {verb} — {title_reason(reason)}"
    return title, _body(f, b, [f"reason {reason_of(reason)} {ACK_MARK} the run's own guard, "
                               "agent-watchdog kill or another store writer; not decided by the daemon)",
                               f"action {plan}"])


def forged_alert(f: RunFacts, b: Budgets, what: str) -> tuple[str, str]:
    """Rows the daemon did not write, that would have named processes to signal."""
    title = f"agent-watchdog: forged rows ignored for {run_ref(f.id)}"
    return title, _body(f, b, [f"forged {what}",
                               "action nothing was signalled on their word; someone who can write the store wrote them"])
