"""Runs another writer owns (exec's, the SDK's), as a gateway witnesses them: one helper for the
MCP proxy and the LiteLLM callback, which each wrote it (issue 34).

A joined run's row is read, never written (on PostgreSQL rows belong to their writer); each
call the gateway sees is appended as an event marked with the gateway's `source`
(watchdog.store.joined: the daemon folds it into its own counters, one call counted once). The
gateway judges the run with the SDK's guards on the run's budgets (its profile's, lowered by its
own columns) and against the larger of the gateway's own count and the run's, never their sum:
both saw the same calls. Not imported by the SDK itself (watchdog.client stays light).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from watchdog.core import budgets as bud
from watchdog.core.periods import utcnow
from watchdog.sdk.guards import Guard
from watchdog.store import joined
from watchdog.store.joined import RunState

if TYPE_CHECKING:
    from watchdog.sdk.client import Watchdog

__all__ = ["JoinedRuns", "RunState"]


class JoinedRuns:
    """The joined runs one gateway witnesses, and its guard of each. Thread-safe."""

    def __init__(self, wd: Watchdog, source: str) -> None:
        self.wd = wd
        self.source = source  # events.source of what this gateway appends (watchdog.core.lifecycle.Source)
        self.guards: dict[str, Guard] = {}  # run id -> this gateway's view of its calls
        self._lock = threading.Lock()

    def state(self, run_id: str) -> RunState | None:
        """The run's row (status, counters, own budgets), or None when the store has no such run."""
        return joined.run_state(self.wd.engine, run_id)

    def guard(self, state: RunState) -> Guard:
        """This gateway's guard of the run: on its budgets as they stand now (a resume may have
        raised them), with its counters raised to the run's (watchdog.sdk.guards.Guard.at_least)."""
        limits = bud.for_run(self.wd.config().profile(state.agent), state.row()).to_json()
        with self._lock:
            guard = self.guards.setdefault(state.id, Guard(limits))
        guard.budgets.update(limits)
        guard.at_least(steps=state.steps, tool_calls=state.tool_calls, tokens=state.tokens, cost_eur=state.cost_eur)
        return guard

    def known(self, run_id: str | None) -> Guard | None:
        """The guard of a run this gateway judged already, else None."""
        if run_id is None:
            return None
        with self._lock:
            return self.guards.get(run_id)

    @staticmethod
    def elapsed_s(state: RunState) -> float:
        """Seconds since the run started, on the store's clock (0 for a run not started yet)."""
        started = state.started_at or utcnow()  # aware UTC, as the store reads it
        return max(0.0, (utcnow() - started).total_seconds())

    def append(self, run_id: str, *, kind: str, call_id: str | None, **fields: Any) -> int:
        """Append one call this gateway saw to the run (never touching its row); the event's seq."""
        return joined.append_witness_event(self.wd.engine, run_id, source=self.source, kind=kind, at=utcnow(),
                                           call_id=call_id, **fields)
