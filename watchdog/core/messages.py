"""Alert texts and the numbers they quote: a run's facts, titles and bodies, burn rates and run-out times.

Alert texts. Pure: numbers in, title and body out.

An alert must let the on-call human act from the phone: which agent, which run,
which tool it was stuck on, the numbers against the budgets, what was done, and
the command to look closer. What the run's writer chose (its agent's name, its tools',
its host, its texts) appears only in the body, marked (watchdog.core.text); a title
is the daemon's own words.

Burn rates and run-out times, for alerts and `top`. Pure: numbers and clocks in, text out.

"at 0.41 EUR/min this run reaches its 2.00 EUR budget in 3 min"
"support-bot's daily budget runs out at 16:40 UTC"
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import deque
from dataclasses import dataclass

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets, Totals, counter_lines
from watchdog.core.text import TEXT_CHARS, ident, marked, reason_ref, run_ref, show_command
from watchdog.core.periods import DAY, PeriodState


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
    forecast: tuple[str, ...] = ()  # burn-rate lines (watchdog.core.messages): the run's, its period budgets'
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


# -- Burn rates and run-out times, for alerts and `top`. Pure: numbers and clocks in, text out ---------------------

RATE_WINDOW_S = 900.0  # a period budget's burn rate: its spend over the last 15 minutes
MIN_SPAN_S = 60.0  # below this much history, the rate is the period's average


def per_min(cost_eur: float, elapsed_s: float) -> float | None:
    if elapsed_s <= 0 or cost_eur <= 0:
        return None
    return cost_eur * 60.0 / elapsed_s


def duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    if s < 86400:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m:02d} min" if m else f"{h} h"
    return f"{s / 86400:.1f} days"


def _eur(v: float, budget: float) -> str:
    return f"{v:.{2 if budget >= 1 else 4}f}"


def run_line(cost_eur: float, budget_eur: float, elapsed_s: float) -> str | None:
    """A run's burn rate against its max_cost_eur; None before it has spent anything."""
    rate = per_min(cost_eur, elapsed_s)
    if rate is None or budget_eur <= 0:
        return None
    head = f"at {rate:.{2 if rate >= 0.1 else 4}f} EUR/min this run"
    if cost_eur >= budget_eur:
        return f"{head} reached its {_eur(budget_eur, budget_eur)} EUR budget in {duration(elapsed_s)}"
    left_s = (budget_eur - cost_eur) / rate * 60.0
    return f"{head} reaches its {_eur(budget_eur, budget_eur)} EUR budget in {duration(left_s)}"


def when(at: dt.datetime, now: dt.datetime, tz: dt.tzinfo) -> str:
    local, today = at.astimezone(tz), now.astimezone(tz)
    zone = local.tzname() or "UTC"
    if local.date() == today.date():
        return f"{local:%H:%M} {zone}"
    return f"{local:%Y-%m-%d %H:%M} {zone}"


def period_line(state: PeriodState, now: dt.datetime, tz: dt.tzinfo, *, mark: bool = False) -> str:
    """One line on a period budget: spent, running out at some time, or lasting the period.
    `mark`: for an alert (the scope's name marked as a writer's, watchdog.core.text)."""
    label = state.marked_label if mark else state.label
    spent = f"{_eur(state.spent_eur, state.budget_eur)}/{_eur(state.budget_eur, state.budget_eur)} EUR"
    rate = state.rate_eur_per_min
    rate_txt = f" at {rate:.{2 if rate >= 0.1 else 4}f} EUR/min" if rate else ""
    if state.closed:
        return f"{label} is spent ({spent}): new runs refused until {when(state.end, now, tz)}"
    if state.runs_out_at is not None:
        return f"{label} runs out at {when(state.runs_out_at, now, tz)}{rate_txt} ({spent})"
    rest = "the day" if state.period == DAY else "the month"
    return f"{label} lasts {rest}{rate_txt} ({spent})"


class RateTracker:
    """Per scope and period, recent (time, spend) samples: the burn rate over RATE_WINDOW_S.

    In memory only: after a restart the rate is the period's average until enough
    samples exist again (nothing is lost that the ledger does not hold)."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self._samples: dict[tuple[str, str], tuple[str, deque[tuple[dt.datetime, float]]]] = {}

    def rate(self, scope: str, period: str, key: str, spent_eur: float, now: dt.datetime,
             period_start: dt.datetime) -> float | None:
        """Record this tick's spend and return EUR/min (None when nothing is being spent)."""
        known = self._samples.get((scope, period))
        if known is None or known[0] != key:
            known = (key, deque())
            self._samples[(scope, period)] = known
        samples = known[1]
        if samples and now < samples[-1][0]:
            samples.clear()  # the clock jumped back: start over rather than divide by a negative span
        samples.append((now, spent_eur))
        horizon = now - dt.timedelta(seconds=self.window_s)
        while len(samples) > 2 and samples[1][0] <= horizon:
            samples.popleft()
        t0, s0 = samples[0]
        span_s = (now - t0).total_seconds()
        if span_s >= MIN_SPAN_S:
            return per_min(spent_eur - s0, span_s)
        return per_min(spent_eur, (now - period_start).total_seconds())

    def forget(self, keep: set[tuple[str, str]]) -> None:
        for k in [k for k in self._samples if k not in keep]:
            del self._samples[k]
