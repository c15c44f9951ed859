"""The one home of every budget: key, unit, type, validation, merge with a profile,
comparison and rendering. Everything else (config parsing, the `runs` columns, the
SDK's guards, the daemon's policies and pre-filter, alerts, `show`, `top`, JSON)
iterates over `BUDGETS`, so a new budget is one entry here plus its column (and its typed field
in `Budgets`, and in `RunBudgets` when a run may ask for it: a unit test holds them in step).

A *profile* (`Budgets`) is one agent's limits plus the few settings that go with
them (`on_rate`, `dedupe_window_s`, `runs_may_raise`). A run may ask for lower
budgets than its profile (the `runs` columns named after each budget), never
higher unless the profile says `runs_may_raise = true`.

Pure: imports nothing of ours but the lifecycle vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypedDict

from watchdog.core.lifecycle import StopReason


@dataclass(frozen=True)
class Totals:
    """What a run has used, as the budgets measure it. Built by the SDK from its own
    counters and by the daemon from the run row and its folded events."""

    steps: int = 0
    tool_calls: int = 0
    cost_eur: float = 0.0
    tokens: int = 0  # in + out
    age_s: float = 0.0  # since the run started
    silent_s: float = 0.0  # since its last record
    identical_calls: int = 0  # the most repeated (tool, args hash)
    calls_last_min: int = 0


@dataclass(frozen=True)
class Budget:
    key: str  # config key, `runs` column, JSON field of "budgets"
    reason: StopReason  # the stop reason when it trips
    measure: str  # the Totals field it limits
    label: str  # how alerts and `show` name the measure
    unit: str  # "" (a count), "s", "EUR"
    integer: bool
    default: float
    per_run: bool = True  # a run may ask to lower it (it has a `runs` column)
    at_limit: bool = False  # trips when the measure reaches the limit (N identical calls are a loop)
    clock: bool = False  # measured on the wall clock: not judged across a clock jump
    counted_on: str | None = None  # the SDK record kind that adds to it ("step" / "tool"): guarded before it
    # `agent-watchdog resume RUN --<add_option> N` raises it: a breach of it may pause (on_breach).
    add_option: str | None = None

    def over(self, value: float, limit: float | None) -> bool:
        if limit is None:
            return False
        return value >= limit if self.at_limit else value > limit

    def fmt(self, value: float, limit: float | None = None) -> str:
        if self.unit == "EUR":
            digits = 2 if (limit if limit is not None else value) >= 1 else 4
            return f"{value:.{digits}f}"
        if self.unit == "s":
            return f"{value:.0f}" if limit is not None else f"{value:g}"
        return f"{int(value)}"

    def against(self, value: float, limit: float | None) -> str:
        """`13/12 ← OVER` style: the value against its limit, with its unit."""
        unit = f" {self.unit}" if self.unit else ""
        lim = "-" if limit is None else (f"{limit:g}" if self.unit == "s" else self.fmt(limit, limit))
        mark = "  ← OVER" if self.over(value, limit) and not self.at_limit else ""
        return f"{self.fmt(value, limit)}/{lim}{unit}{mark}"

    def detail(self, value: float, limit: float) -> str:
        """One line for the stop reason: "steps 13/12"."""
        if self.measure == "identical_calls":
            return f"called {int(value)}× with identical arguments ({self.key} {int(limit)})"
        if self.measure == "age_s":
            return f"running {value:.0f} s > {self.key} {limit:g} s"
        if self.measure == "silent_s":
            return f"silent for {value:.0f} s > {self.key} {limit:g} s"
        if self.measure == "calls_last_min":
            return f"{int(value)} tool calls/min > {int(limit)}"
        return f"{self.label} {self.fmt(value, limit)}/{self.fmt(limit, limit)}{' ' + self.unit if self.unit else ''}"

    def validate(self, value: Any) -> float:
        """The value as a budget (> 0, finite, an integer where counted), or ValueError saying why."""
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.integer and not isinstance(value, int)):
            raise ValueError(f"expected {kind} > 0, got {value!r}")
        if not math.isfinite(value) or value <= 0:  # a NaN or infinite budget would never trip
            raise ValueError(f"expected {kind} > 0, got {value!r}")
        return value if self.integer else float(value)


# In the order alerts and `show` list them.
BUDGETS: tuple[Budget, ...] = (
    Budget("max_steps", StopReason.MAX_STEPS, "steps", "steps", "", True, 12, counted_on="step",
           add_option="add-steps"),
    Budget("max_tool_calls", StopReason.MAX_TOOL_CALLS, "tool_calls", "tool calls", "", True, 40,
           counted_on="tool", add_option="add-tool-calls"),
    Budget("max_cost_eur", StopReason.MAX_COST, "cost_eur", "cost", "EUR", False, 2.0, counted_on="step",
           add_option="add-eur"),
    # The price-independent backstop: a model no table prices still cannot run away.
    Budget("max_tokens", StopReason.MAX_TOKENS, "tokens", "tokens", "", True, 2_000_000, counted_on="step"),
    Budget("max_wall_s", StopReason.WALL_CLOCK, "age_s", "duration", "s", False, 300.0, clock=True,
           add_option="add-s"),
    Budget("max_identical_calls", StopReason.LOOP_DETECTED, "identical_calls", "identical calls", "", True, 3,
           at_limit=True),
    Budget("heartbeat_timeout_s", StopReason.HEARTBEAT_TIMEOUT, "silent_s", "silent", "s", False, 120.0,
           clock=True),
    # The per-run tool-call rate: an alarm first; it stops only with on_rate = "stop".
    Budget("max_tool_calls_per_min", StopReason.TOOL_RATE, "calls_last_min", "tool calls/min", "", True, 15,
           per_run=False),
)
BY_KEY: dict[str, Budget] = {b.key: b for b in BUDGETS}
RUN_BUDGETS: tuple[Budget, ...] = tuple(b for b in BUDGETS if b.per_run)
RUN_BUDGET_KEYS: tuple[str, ...] = tuple(b.key for b in RUN_BUDGETS)
# Budgets that stop a run whenever they trip (the rate stops only with on_rate = "stop").
STOPPING_BUDGETS: tuple[Budget, ...] = tuple(b for b in BUDGETS if b.reason != StopReason.TOOL_RATE)
RATE = BY_KEY["max_tool_calls_per_min"]

ON_RATE_CHOICES = ("alert", "stop")
ON_BREACH_CHOICES = ("stop", "pause")
# The budgets a breach of which may pause the run instead of stopping it (resume can raise them).
PAUSABLE: tuple[Budget, ...] = tuple(b for b in BUDGETS if b.add_option)


@dataclass(frozen=True)
class Setting:
    """A profile key that is not a budget."""

    key: str
    default: Any
    kind: str  # "choice" | "bool" | "names" | "seconds>=0" | "seconds>0" | "eur>=0" | "fraction" | "on_breach"
    choices: tuple[str, ...] = ()

    def validate(self, value: Any) -> Any:
        if self.kind == "fraction":
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or not 0 < value <= 1):
                raise ValueError(f"expected a number in (0, 1], got {value!r}")
            return float(value)
        if self.kind == "choice":
            if value not in self.choices:
                raise ValueError(f"expected one of {', '.join(repr(c) for c in self.choices)}, got {value!r}")
            return value
        if self.kind == "on_breach":
            return _on_breach(value)
        if self.kind == "names":
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
                    isinstance(v, str) and v for v in value):
                raise ValueError(f"expected a list of names, got {value!r}")
            return tuple(value)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"expected a number >= 0, got {value!r}")
        if self.kind == "seconds>0" and value == 0:
            raise ValueError(f"expected a number > 0, got {value!r}")
        return float(value)


def _on_breach(value: object) -> str | dict[str, str]:
    """`"stop"` / `"pause"` for every pausable budget, or a table naming the budgets that pause
    (`{ max_steps = "pause", max_cost_eur = "stop" }`; a budget it does not name stops)."""
    if isinstance(value, str):
        if value not in ON_BREACH_CHOICES:
            raise ValueError(f"expected \"stop\", \"pause\" or a table of budget = \"stop\" | \"pause\", got {value!r}")
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"expected \"stop\", \"pause\" or a table of budget = \"stop\" | \"pause\", got {value!r}")
    keys = tuple(b.key for b in PAUSABLE)
    out: dict[str, str] = {}
    for key, action in value.items():
        if key not in keys:
            raise ValueError(f"{key!r} cannot pause (only {', '.join(keys)} can: loops, silence and a "
                             "vanished process always stop)")
        if action not in ON_BREACH_CHOICES:
            raise ValueError(f"{key}: expected \"stop\" or \"pause\", got {action!r}")
        out[key] = action
    return out


SETTINGS: tuple[Setting, ...] = (
    Setting("on_rate", "alert", "choice", ON_RATE_CHOICES),
    Setting("dedupe_window_s", 0.0, "seconds>=0"),  # 0 = the whole run
    Setting("runs_may_raise", False, "bool"),
    # Who may run under this profile (PostgreSQL login roles, Unix users of attested runs);
    # empty = anyone. A run whose owner it does not name is judged by [defaults] (issue 20).
    Setting("owners", (), "names"),
    # Period budgets: shared by every run of the agent over a calendar day / month in
    # [pricing] budget_tz (watchdog.core.periods judges them; 0 = no budget for that period).
    Setting("max_cost_eur_per_day", 50.0, "eur>=0"),
    Setting("max_cost_eur_per_month", 500.0, "eur>=0"),
    Setting("warn_at", 0.8, "fraction"),  # the warning alert, once per period, at this share of it
    Setting("on_breach", "stop", "on_breach"),  # "stop" | "pause" | {budget key = "stop" | "pause"}
    Setting("approval_timeout_s", 900.0, "seconds>0"),  # a paused run nobody answers is stopped then
)
PERIOD_BUDGET_KEYS = ("max_cost_eur_per_day", "max_cost_eur_per_month")
PROFILE_KEYS: tuple[str, ...] = tuple(b.key for b in BUDGETS) + tuple(s.key for s in SETTINGS)


def _count(key: str) -> int:
    return int(BY_KEY[key].default)


def _amount(key: str) -> float:
    return float(BY_KEY[key].default)


def _setting(key: str) -> Any:
    """A setting's default, typed by the field it initialises."""
    return next(s.default for s in SETTINGS if s.key == key)


# One field per key of PROFILE_KEYS, in its order, defaults from the registries above: the
# class is spelled out so that type checkers see each limit (tests/unit/test_budget_types.py
# checks that it and RunBudgets below stay in step with BUDGETS and SETTINGS).
@dataclass(frozen=True)
class Budgets:
    """One agent profile: the limits a run of that agent is held to (fields: PROFILE_KEYS)."""

    max_steps: int = _count("max_steps")
    max_tool_calls: int = _count("max_tool_calls")
    max_cost_eur: float = _amount("max_cost_eur")
    max_tokens: int = _count("max_tokens")
    max_wall_s: float = _amount("max_wall_s")
    max_identical_calls: int = _count("max_identical_calls")
    heartbeat_timeout_s: float = _amount("heartbeat_timeout_s")
    max_tool_calls_per_min: int = _count("max_tool_calls_per_min")
    on_rate: str = _setting("on_rate")
    dedupe_window_s: float = _setting("dedupe_window_s")
    runs_may_raise: bool = _setting("runs_may_raise")
    owners: tuple[str, ...] = _setting("owners")
    max_cost_eur_per_day: float = _setting("max_cost_eur_per_day")
    max_cost_eur_per_month: float = _setting("max_cost_eur_per_month")
    warn_at: float = _setting("warn_at")
    on_breach: str | Mapping[str, str] = _setting("on_breach")  # "stop" | "pause" | {budget key: "stop" | "pause"}
    approval_timeout_s: float = _setting("approval_timeout_s")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def limit(self, key: str) -> float:
        """The limit of the budget `key` (a key of BUDGETS)."""
        value: float = getattr(self, key)
        return value


class RunBudgets(TypedDict, total=False):
    """The budgets a run may ask for itself (RUN_BUDGET_KEYS, typed): `wd.run(..., max_steps=5)`,
    `run.child(...)`. None (or leaving one out) keeps the profile's."""

    max_steps: int | None
    max_tool_calls: int | None
    max_cost_eur: float | None
    max_tokens: int | None
    max_wall_s: float | None
    max_identical_calls: int | None
    heartbeat_timeout_s: float | None


def validate_profile_value(key: str, value: Any) -> Any:
    """A profile key's value, checked; ValueError says why (the caller names file and section)."""
    if key in BY_KEY:
        return BY_KEY[key].validate(value)
    for s in SETTINGS:
        if s.key == key:
            return s.validate(value)
    raise KeyError(key)


def profile(values: Mapping[str, Any], base: Budgets | None = None) -> Budgets:
    """A profile from checked values over `base` (the built-in defaults when None)."""
    return dataclasses.replace(base if base is not None else Budgets(), **values)


def profile_from_json(raw: object, base: Budgets | None = None) -> Budgets | None:
    """The profile a daemon published (or a row written by hand): None when unusable.
    Keys this version does not know are ignored; a bad value drops the whole profile,
    so a half-parsed profile never judges a run."""
    if not isinstance(raw, dict):
        return None
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in PROFILE_KEYS:
            continue
        try:
            values[key] = validate_profile_value(key, value)
        except ValueError:
            return None
    return profile(values, base)


def asked(row: object) -> dict[str, float]:
    """The budgets a run asked for itself: its non-NULL budget columns (a row or a dict)."""
    get: Callable[[str], Any] = row.get if isinstance(row, Mapping) else (lambda k: getattr(row, k, None))
    return {k: v for k in RUN_BUDGET_KEYS if (v := get(k)) is not None}


def effective(prof: Budgets, run_asked: Mapping[str, float | None], raised: bool = False) -> Budgets:
    """The profile lowered (never raised, unless the profile allows it) by the run's own request.
    What a run is held to, in the SDK and in the daemon alike. `raised`: an operator resumed the
    run with more (`resume --add-...`): its own columns hold, above its profile too."""
    changes: dict[str, Any] = {}  # budget key → limit (int or float by key)
    for key, value in run_asked.items():
        if key not in RUN_BUDGET_KEYS or value is None:
            continue
        changes[key] = value if (raised or prof.runs_may_raise) else min(getattr(prof, key), value)
    return dataclasses.replace(prof, **changes) if changes else prof


def for_run(prof: Budgets, row: object) -> Budgets:
    """`effective` for a run row (or dict) holding its own budget columns (and `resumes`)."""
    get: Callable[[str], Any] = row.get if isinstance(row, Mapping) else (lambda k: getattr(row, k, None))
    return effective(prof, asked(row), raised=bool(get("resumes")))


effective_budgets = for_run  # the name the read models and tests have always used


def request_error(key: str, value: object, prof: Budgets, agent: str) -> str | None:
    """Why a run's requested budget is not acceptable, or None."""
    if key not in RUN_BUDGET_KEYS:
        return f"{key}: not a run budget (expected one of {', '.join(RUN_BUDGET_KEYS)})"
    try:
        limit = BY_KEY[key].validate(value)
    except ValueError as exc:
        return f"{key}: {exc}"
    current = getattr(prof, key)
    if not prof.runs_may_raise and limit > current:
        return (f"{key}={limit} is above the {agent!r} profile's {current}; "
                "a run may only lower its budgets (set runs_may_raise = true in the profile to allow it)")
    return None


def counter_lines(totals: Totals, prof: Budgets, tool_errors: int = 0) -> list[str]:
    """The numbers against their budgets, one line each, for alerts and `show`."""
    lines = []
    for b in BUDGETS:
        if b.measure in ("identical_calls", "calls_last_min", "silent_s"):
            continue  # named in the reason line when they trip; not a running total
        text = f"{b.label} {b.against(getattr(totals, b.measure), getattr(prof, b.key))}"
        if b.measure == "tool_calls":
            text += f" ({tool_errors} errors)"
        lines.append(text)
    return lines
