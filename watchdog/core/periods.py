"""Time: the wall clock (timezone-aware UTC) and the calendar periods of the period budgets.

Period budgets: calendar days and months in `[pricing] budget_tz`, who a budget covers,
and the state of one budget from its spend. Pure: the tick passes spend and clock in.

Attribution: a run's cost counts in the period in which the run ends; while it runs,
in the current period. So the ledger books each run once, at its end, and the tick
adds the active runs' live cost on top (see watchdog.store.ledger).

The wall clock, always timezone-aware UTC: every side takes `now` from here (or is given it).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from watchdog.core.budgets import Budgets


DAY = "day"
MONTH = "month"
PERIODS = (DAY, MONTH)
WARN_AT = 0.8  # the documented default of warn_at
# Stop reasons of the period budgets (the same strings as watchdog.core.lifecycle).
REASON = {DAY: "daily_budget", MONTH: "monthly_budget"}
ADJECTIVE = {DAY: "daily", MONTH: "monthly"}
BUDGET_KEY = {DAY: "max_cost_eur_per_day", MONTH: "max_cost_eur_per_month"}
# The settings rows the daemon publishes: the spent budgets (the SDK reads it at every run
# start) and every period budget's spend, burn rate and run-out time (for `budgets` and `top`).
CLOSED_KEY = "budget_closed"
STATE_KEY = "budget_state"


def zone(name: str) -> dt.tzinfo:
    """The tzinfo of a budget_tz name; ValueError naming it when unknown."""
    if name.upper() == "UTC":
        return dt.timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as \"UTC\" or \"Europe/Paris\")") from None


def period_bounds(period: str, now: dt.datetime, tz: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of the calendar day or month containing `now`, as aware UTC datetimes."""
    day = now.astimezone(tz).date()
    if period == DAY:
        first, after = day, day + dt.timedelta(days=1)
    else:
        first = day.replace(day=1)
        after = (first + dt.timedelta(days=32)).replace(day=1)
    # Local midnights built from the date: across a DST change their UTC offsets differ.
    start = dt.datetime(first.year, first.month, first.day, tzinfo=tz)
    end = dt.datetime(after.year, after.month, after.day, tzinfo=tz)
    return start.astimezone(dt.timezone.utc), end.astimezone(dt.timezone.utc)


def period_key(period: str, at: dt.datetime, tz: dt.tzinfo) -> str:
    """"2025-01-31" for a day, "2025-01" for a month, in the budget's time zone."""
    local = at.astimezone(tz)
    return f"{local:%Y-%m-%d}" if period == DAY else f"{local:%Y-%m}"


def scope_agent(agent: str) -> str:
    return f"agent:{agent}"


def scope_labels(labels: Mapping[str, str]) -> str:
    return "labels:" + json.dumps(dict(labels), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class LabelBudget:
    """One `[[budgets]]` entry: period budgets shared by every run whose labels include `labels`."""

    labels: Mapping[str, str]
    max_cost_eur_per_day: float = 0.0  # 0 = no budget for that period
    max_cost_eur_per_month: float = 0.0
    warn_at: float = WARN_AT
    scope: str = field(default="", compare=False)  # scope_labels(labels), computed once

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", scope_labels(self.labels))

    @property
    def name(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))

    def matches(self, run_labels: object) -> bool:
        return labels_match(self.labels, run_labels)


def labels_match(want: Mapping[str, str], run_labels: object) -> bool:
    if not isinstance(run_labels, dict):
        return False
    return all(k in run_labels and str(run_labels[k]) == v for k, v in want.items())


@dataclass(frozen=True)
class Scope:
    """Whom a period budget covers: one agent, or the runs matching a label set."""

    key: str  # scope_agent(...) / scope_labels(...)
    name: str  # "support-bot" / "tenant=acme"
    kind: str  # "agent" | "labels"
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True)
class PeriodState:
    scope: Scope
    period: str  # DAY | MONTH
    key: str  # "2025-01-31"
    start: dt.datetime
    end: dt.datetime
    spent_eur: float
    budget_eur: float
    warn_at: float
    rate_eur_per_min: float | None = None
    runs_out_at: dt.datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def closed(self) -> bool:
        """Spent: running runs of the scope are stopped, new runs refused until `end`."""
        return self.budget_eur > 0 and self.spent_eur >= self.budget_eur

    @property
    def warned(self) -> bool:
        return self.budget_eur > 0 and self.spent_eur >= self.warn_at * self.budget_eur

    @property
    def reason(self) -> str:
        return REASON[self.period]

    @property
    def label(self) -> str:
        """"support-bot's daily budget" / "tenant=acme's monthly budget"."""
        return f"{self.scope.name}'s {ADJECTIVE[self.period]} budget"

    @property
    def marked_label(self) -> str:
        """The label as an alert shows it: an agent's scope is named by its runs' writers (marked)."""
        from watchdog.core.text import marked

        return f"the {ADJECTIVE[self.period]} budget of {self.scope.kind} {marked(self.scope.name)}"

    @property
    def adjective(self) -> str:
        return ADJECTIVE[self.period]

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope.kind, "name": self.scope.name, "labels": dict(self.scope.labels or {}) or None,
            "period": self.period, "key": self.key, "start": self.start.isoformat(), "end": self.end.isoformat(),
            "spent_eur": round(self.spent_eur, 6), "budget_eur": self.budget_eur, "warn_at": self.warn_at,
            "closed": self.closed, "reason": self.reason if self.closed else None,
            "rate_eur_per_min": None if self.rate_eur_per_min is None else round(self.rate_eur_per_min, 6),
            "runs_out_at": self.runs_out_at.isoformat() if self.runs_out_at else None,
        }


def runs_out_at(spent_eur: float, budget_eur: float, rate_eur_per_min: float | None, now: dt.datetime,
                end: dt.datetime) -> dt.datetime | None:
    """When the budget is spent at this rate, if before the period ends (else None: it lasts)."""
    if budget_eur <= 0 or not rate_eur_per_min or rate_eur_per_min <= 0:
        return None
    if spent_eur >= budget_eur:
        return now
    left_min = (budget_eur - spent_eur) / rate_eur_per_min
    if left_min >= (end - now).total_seconds() / 60:  # (a huge budget at a tiny rate: no overflow either)
        return None
    return now + dt.timedelta(minutes=left_min)


def closed_entry(state: PeriodState) -> dict[str, Any]:
    """What the SDK reads at run start (settings "budget_state"): scope, reason, until."""
    return {"scope": state.scope.kind, "name": state.scope.name,
            "labels": dict(state.scope.labels) if state.scope.labels else None,
            "reason": state.reason, "until": state.end.isoformat(),
            "detail": f"{state.label} is spent: {state.spent_eur:.2f}/{state.budget_eur:.2f} EUR "
                      f"({state.key}); new runs are refused until {state.end:%Y-%m-%d %H:%M} UTC"}


def refusal(closed: object, agent: str, labels: object, now: dt.datetime) -> tuple[str, str] | None:
    """(reason, detail) when a closed period budget covers a new run of `agent` with `labels`.

    `closed`: the published entries (closed_entry); a malformed or expired entry is ignored."""
    if not isinstance(closed, list):
        return None
    for entry in closed:
        if not isinstance(entry, dict):
            continue
        try:
            until = dt.datetime.fromisoformat(str(entry.get("until")))
        except ValueError:
            continue
        if until.tzinfo is None or until <= now:
            continue  # the period is over: the next tick republishes
        if entry.get("scope") == "agent" and entry.get("name") == agent:
            pass
        elif entry.get("scope") == "labels" and isinstance(entry.get("labels"), dict) and entry["labels"] \
                and labels_match(entry["labels"], labels):
            pass
        else:
            continue
        reason = entry.get("reason")
        if not isinstance(reason, str) or reason not in REASON.values():
            continue
        return reason, str(entry.get("detail") or reason)[:500]
    return None


class EndedRun(Protocol):
    """What `end_of` reads of a run row."""

    @property
    def ended_at(self) -> dt.datetime | None: ...
    @property
    def last_seen_at(self) -> dt.datetime: ...


def end_of(row: EndedRun) -> dt.datetime:
    """When an ended run ended (a row written by hand may lack ended_at)."""
    return row.ended_at or row.last_seen_at


def scopes_of(agent: str, labels: object, label_budgets: Iterable[LabelBudget]) -> list[str]:
    return [scope_agent(agent)] + [b.scope for b in label_budgets if b.matches(labels)]


def live_by_scope(runs: Iterable[tuple[str, str, float | None]], label_budgets: Sequence[LabelBudget] = (),
                  labels_of: Callable[[str], object] | None = None) -> dict[str, float]:
    """The active runs' live cost per scope: runs = (run id, agent, cost_eur) triples."""
    out: dict[str, float] = {}
    for rid, agent, cost in runs:
        key = "agent:" + agent
        out[key] = out.get(key, 0.0) + (cost or 0.0)
        if label_budgets and labels_of is not None:
            labels = labels_of(rid)
            for b in label_budgets:
                if b.matches(labels):
                    out[b.scope] = out.get(b.scope, 0.0) + (cost or 0.0)
    return out


def sum_spend(ledger_spend: Mapping[tuple[str, str], float],
              unbooked: Iterable[tuple[str, object, float | None, float | None]], live: Mapping[str, float],
              label_budgets: Iterable[LabelBudget] = ()) -> tuple[dict[tuple[str, str], float], set[str]]:
    """Spend per (scope, period) of the current periods, and the agents seen.

    ledger_spend: what the ledger holds for the current period keys; unbooked: the ended runs
    not in it yet, summed per (agent, labels) as (agent, labels, cost ended today, cost ended
    this month); live: the active runs' cost per scope (live_by_scope), counted in the current
    periods. All from one snapshot, so each run counts once."""
    spent: dict[tuple[str, str], float] = dict(ledger_spend)

    def add(scope: str, period: str, cost: float | None) -> None:
        spent[(scope, period)] = spent.get((scope, period), 0.0) + (cost or 0.0)

    agents = {k[0][len("agent:"):] for k in ledger_spend if k[0].startswith("agent:")}
    for agent, labels, day_cost, month_cost in unbooked:
        agents.add(agent)
        for scope in scopes_of(agent, labels, label_budgets):
            add(scope, DAY, day_cost)
            add(scope, MONTH, month_cost)
    for scope, cost in live.items():
        if scope.startswith("agent:"):
            agents.add(scope[len("agent:"):])
        for p in PERIODS:
            add(scope, p, cost)
    return spent, agents


# rate_of(scope key, period, period key, spent, period start): the burn rate in EUR/min, or None.
RateOf = Callable[[str, str, str, float, dt.datetime], float | None]


def build_states(spent: Mapping[tuple[str, str], float], agents: Iterable[str], profile_of: Callable[[str], Budgets],
                 label_budgets: Iterable[LabelBudget], now: dt.datetime, tz: dt.tzinfo,
                 rate_of: RateOf | None = None) -> list[PeriodState]:
    """Every period budget's state: each agent's (from its profile) and each label budget's.

    profile_of(agent) has max_cost_eur_per_day / _per_month / warn_at; rate_of(scope key,
    period, key, spent, period start) gives the burn rate in EUR/min (None: unknown)."""
    out: list[PeriodState] = []

    def one(scope: Scope, period: str, budget: float, warn_at: float) -> None:
        start, end = period_bounds(period, now, tz)
        key = period_key(period, now, tz)
        s = spent.get((scope.key, period), 0.0)
        rate = rate_of(scope.key, period, key, s, start) if rate_of else None
        if budget > 0 or s > 0:
            out.append(PeriodState(scope, period, key, start, end, s, budget, warn_at, rate,
                                   runs_out_at(s, budget, rate, now, end)))

    for agent in sorted(agents):
        profile = profile_of(agent)
        scope = Scope(scope_agent(agent), agent, "agent")
        for p in PERIODS:
            one(scope, p, float(getattr(profile, BUDGET_KEY[p], 0.0) or 0.0), float(getattr(profile, "warn_at", WARN_AT)))
    for b in label_budgets:
        scope = Scope(b.scope, b.name, "labels", b.labels)
        for p in PERIODS:
            one(scope, p, b.max_cost_eur_per_day if p == DAY else b.max_cost_eur_per_month, b.warn_at)
    return out


# -- The wall clock, always timezone-aware UTC: every side takes `now` from here (or is given it) ------------------

def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
