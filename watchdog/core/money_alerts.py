"""Alert texts about money that no single run owns: period budgets and unpriced models. Pure.

(The run alerts, watchdog.core.messages, add the forecast lines of watchdog.core.messages.)
"""

from __future__ import annotations

import datetime as dt

from watchdog.core import messages
from watchdog.core.text import ident, marked
from watchdog.core.periods import PeriodState


MAX_NAMES = 10  # agents named in one unpriced-model alert


def _eur(v: float) -> str:
    return f"{v:.2f}"


def shown(name: str, max_chars: int = 128) -> str:
    """A name from the store (a model, an agent: anyone may write one) as one printable line."""
    text = "".join(c if c.isprintable() else "?" for c in str(name))
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def period_alert(s: PeriodState, kind: str, now: dt.datetime, tz: dt.tzinfo, stopped: list[str]
                 ) -> tuple[str, str]:
    """kind "warning" (warn_at reached) or "closed" (spent: runs stopped, new runs refused)."""
    spent = f"{_eur(s.spent_eur)}/{_eur(s.budget_eur)} EUR"
    share = 100 * s.spent_eur / s.budget_eur if s.budget_eur else 0
    if kind == "closed":
        title = f"agent-watchdog: a {s.adjective} budget is spent — {spent}"
        what = (f"action stopped {len(stopped)} running run{'s' if len(stopped) != 1 else ''} ({s.reason}); "
                f"new runs are refused until {messages.when(s.end, now, tz)}")
    else:
        title = f"agent-watchdog: a {s.adjective} budget at {share:.0f}% — {spent}"
        what = f"action alert only (warn_at {s.warn_at:g}); at {100:.0f}% running runs are stopped ({s.reason})"
    lines = [messages.period_line(s, now, tz, mark=True), "",
             f"scope {s.scope.kind} {marked(s.scope.name)}   period {s.period} {s.key} "
             f"({messages.when(s.start, now, tz)} → {messages.when(s.end, now, tz)})",
             f"spent {spent} ({share:.0f}%)", what]
    if stopped:
        lines.append("stopped " + " ".join(ident(r[:8]) for r in stopped[:20]) + (" …" if len(stopped) > 20 else ""))
    lines += ["", "agent-watchdog budgets"]
    return title, "\n".join(lines)


def unpriced_alert(model: str, agents: list[str], tokens: int, steps: int, no_model: bool) -> tuple[str, str]:
    """"a model has no price: cost budgets are not enforced" (title); the body names the model and
    its agents (marked: a writer chose them) and the [prices."MODEL"] table to add."""
    names = [marked(a) for a in agents[:MAX_NAMES]]
    more = f" (+{len(agents) - MAX_NAMES} more)" if len(agents) > MAX_NAMES else ""
    who = (f"agent {names[0]}" if len(names) == 1 else f"agents {', '.join(names)}") + more
    if no_model:
        title = "steps recorded without a model have no price: cost budgets are not enforced"
        head = f"{title} for {who}"
        # Said for every way a step is recorded: the SDK's own calls, and the integrations, which
        # read the model from the framework (issue 19: not "run.step()" to a LangChain user).
        fix = ["", "how the steps get their model:",
               "- the SDK: run.step(model=\"...\") (or cost_eur=...)",
               "- LangChain / LangGraph and the OpenAI Agents SDK: the model name the chat model or agent "
               "is configured with (model=...); a model object without one is recorded without",
               "- a plain-SQL writer: the events' model column"]
    else:
        title = "a model has no price: cost budgets are not enforced"
        head = f'model {marked(model)} has no price: cost budgets are not enforced for {who}; add [prices."MODEL"]'
        fix = ["", "in the daemon's config (EUR per million tokens), MODEL the model's name above:",
               '[prices."MODEL"]', "input_eur_per_mtok = ...", "output_eur_per_mtok = ..."]
    body = [head, "",
            f"{tokens} tokens in {steps} step{'s' if steps != 1 else ''} so far are recorded with no cost "
            "(cost_unpriced_tokens in `show --json`)",
            "the max_tokens budget (in + out per run) still stops a runaway run", *fix]
    return f"agent-watchdog: {title}", "\n".join(body)
