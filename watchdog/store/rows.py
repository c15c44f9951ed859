"""Typed rows of the public tables, as the store hands them to the CLI, the web view and the demo.

Those sides never index a SQLAlchemy Row: a store verb reads, then turns each row into one of
these (`from_mapping`), so a column renamed in the schema fails here, once, and the callers
are checked by mypy. The run's budget columns come from the registry (watchdog.core.budgets):
they are held in `asked` and read as attributes too (`row.max_steps`), so a new budget needs
no field here and `core.budgets.for_run(profile, row)` reads a RunRow as it reads a Row.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from watchdog.core.budgets import RUN_BUDGET_KEYS


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True)
class RunRow:
    """One row of `runs`: every column, the budget columns in `asked` (None = the profile's)."""

    id: str
    agent: str
    status: str
    stop_reason: str | None
    stop_detail: str | None
    kill_mode: str
    host: str
    pid: int | None
    pid_create_time: float | None
    labels: Any
    steps: int
    tool_calls: int
    tool_errors: int
    tokens_in: int
    tokens_out: int
    cost_eur: float
    cached_tokens_in: int
    reasoning_tokens: int
    cost_unpriced_tokens: int
    last_seq: int
    progress: str | None
    started_at: dt.datetime
    last_seen_at: dt.datetime
    stop_requested_at: dt.datetime | None
    signal_stage: str | None
    signalled_at: dt.datetime | None
    ended_at: dt.datetime | None
    booked_at: dt.datetime | None
    parent_id: str | None
    paused_at: dt.datetime | None
    resumes: int
    partial: str | None
    source: str | None
    owner: str | None
    top_tool: str | None
    top_tool_calls: int | None
    top_tool_errors: int | None
    change_seq: int  # the number of its latest change (migration 0012, watchdog.store.changes)
    asked: Mapping[str, float | None] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, m: Mapping[Any, Any]) -> Self:
        return cls(**{k: m[k] for k in _RUN_FIELDS}, asked={k: m[k] for k in RUN_BUDGET_KEYS})

    def __getattr__(self, name: str) -> float | None:
        # Only reached for a name that is not a field: the run's own budget columns.
        if name in RUN_BUDGET_KEYS:
            return self.asked.get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_RUN_FIELDS = tuple(f for f in _fields(RunRow) if f != "asked")


@dataclass(frozen=True)
class EventRow:
    """One row of `events` (without the recorded arguments and the MAC: never shown)."""

    id: int
    run_id: str
    seq: int
    at: dt.datetime
    kind: str
    tool: str | None
    args_hash: str | None
    ok: bool | None
    error_class: str | None
    error_msg: str | None
    duration_s: float | None
    model: str | None
    tokens_in: int | None
    tokens_out: int | None
    cached_tokens_in: int | None
    reasoning_tokens: int | None
    cost_eur: float | None
    progress: str | None
    attempt: int | None
    source: str | None
    call_id: str | None

    @classmethod
    def from_mapping(cls, m: Mapping[Any, Any]) -> Self:
        return cls(**{k: m[k] for k in _EVENT_FIELDS})


_EVENT_FIELDS = _fields(EventRow)


@dataclass(frozen=True)
class InterventionRow:
    """One row of `interventions`: an audited stop, signal, pause, circuit change..."""

    id: int
    at: dt.datetime
    run_id: str | None
    tool: str | None
    action: str
    reason: str | None
    detail: str | None
    outcome: str | None
    actor: str | None

    @classmethod
    def from_mapping(cls, m: Mapping[Any, Any]) -> Self:
        return cls(**{k: m[k] for k in _INTERVENTION_FIELDS})


_INTERVENTION_FIELDS = _fields(InterventionRow)


@dataclass(frozen=True)
class ToolIntervention(InterventionRow):
    """A circuit breaker's intervention (no run): always about one tool."""

    tool: str


@dataclass(frozen=True)
class AlertRow:
    """One row of the outbox (`alerts`) as people read it: what was said and how far it got."""

    id: int
    dedupe_key: str
    created_at: dt.datetime
    run_id: str | None
    intervention_id: int | None
    title: str
    body: str
    attempts: int
    next_attempt_at: dt.datetime | None
    delivered_targets: Any
    delivered_at: dt.datetime | None
    last_error: str | None
    dead_at: dt.datetime | None

    @classmethod
    def from_mapping(cls, m: Mapping[Any, Any]) -> Self:
        return cls(**{k: m[k] for k in _ALERT_FIELDS})


_ALERT_FIELDS = _fields(AlertRow)


@dataclass(frozen=True)
class CircuitRow:
    """One row of `tool_circuits`: a tool's breaker as the daemon left it."""

    tool: str
    state: str
    opened_at: dt.datetime | None
    open_until: dt.datetime | None
    errors_in_window: int
    window_s: float | None
    last_error: str | None
    last_error_class: str | None
    probe_run_id: str | None
    probe_at: dt.datetime | None
    updated_at: dt.datetime

    @classmethod
    def from_mapping(cls, m: Mapping[Any, Any]) -> Self:
        return cls(**{k: m[k] for k in _CIRCUIT_FIELDS})


_CIRCUIT_FIELDS = _fields(CircuitRow)


@dataclass(frozen=True)
class OtherRun:
    """A run seen beside another (the postmortem's "other runs at the same time")."""

    id: str
    agent: str
    status: str
    stop_reason: str | None
