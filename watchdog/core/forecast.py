"""Burn rates and run-out times, for alerts and `top`. Pure: numbers and clocks in, text out.

"at 0.41 EUR/min this run reaches its 2.00 EUR budget in 3 min"
"support-bot's daily budget runs out at 16:40 UTC"
"""

from __future__ import annotations

import datetime as dt
from collections import deque

from watchdog.core.periods import DAY, PeriodState

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
    `mark`: for an alert (the scope's name marked as a writer's, watchdog.core.marked)."""
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
