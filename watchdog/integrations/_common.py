"""What the framework integrations share: the run they record on, JSON-safe tool arguments, the pre-checks.

Pure SDK code, no framework import: each framework module adapts its own events
to these helpers.
"""

from __future__ import annotations

import json
import logging
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from watchdog.sdk.toolcall import PendingTool

if TYPE_CHECKING:
    from watchdog.sdk.client import Watchdog
    from watchdog.sdk.run import Run

log = logging.getLogger("watchdog.integrations")


class RunBinding:
    """Opens (or joins) the watchdog run a framework's callbacks record on, and ends it once.

    Owned runs start on the first event and, once ended, a later event opens a new
    one (a handler reused for another invocation). A joined run (`run=`) is never ended
    here: its owner does that. Inside `with handler:` the block bounds the run.
    """

    run: Run | None  # the run events are recorded on (None: a child binding before its first event)

    def _bind(self, wd: Watchdog | None, agent: str | None, run: Run | None, estimated_cost_eur: float,
              run_kwargs: dict[str, Any], parent: RunBinding | None = None) -> None:
        name = type(self).__name__
        self._parent = parent
        if parent is not None:
            # A nested agent (a sub-agent run as a tool): a child run of the parent binding's
            # current run, opened at the nested agent's first event, ended at its final output.
            if wd is not None or run is not None or not agent:
                raise ValueError(f"{name}: a child binding takes parent= and agent= (and the child's budgets)")
            self._owns = True
            self.run = None
        elif run is not None:
            if wd is not None or agent is not None or run_kwargs:
                raise ValueError(f"{name}: give either run= (join a run) or wd and agent= (open one)")
            self._owns = False
            self.run = run
        else:
            if wd is None or agent is None:
                raise ValueError(f"{name}: give a Watchdog and agent=, or run= to join a started run")
            self._owns = True
            self.run = wd.run(agent=agent, **run_kwargs)  # validates the budgets now, starts on the first event
        self._wd = wd
        self._agent = agent or ""  # a joined run (run=) has none and never opens one
        self._run_kwargs = run_kwargs
        self._estimated = float(estimated_cost_eur)
        self._lock = threading.RLock()
        self._ended = False
        self._managed = False  # inside `with handler:` the block's end ends the run

    def _open(self) -> Run:
        """The run to record on, started (or re-opened after it ended) if it is ours."""
        with self._lock:
            run = self.run
            if self._owns:
                if self._parent is not None and (run is None or self._ended):
                    run = self.run = self._parent._open().child(self._agent, **self._run_kwargs)
                    self._ended = False
                elif self._ended and self._wd is not None:  # an owned run without a parent has its wd
                    run = self.run = self._wd.run(agent=self._agent, **self._run_kwargs)
                    self._ended = False
            if run is None:
                raise RuntimeError(f"{type(self).__name__}: no run to record on")
            if self._owns and run.started_at is None:
                run.start()
            return run

    def _forget(self) -> None:
        """Drop per-invocation state when the run ends (called under the lock)."""

    def end(self, error: BaseException | None = None) -> None:
        """End the run now (completed, or from `error`: failed / killed). Idempotent; no-op on a joined run."""
        with self._lock:
            run = self.run
            if not self._owns or self._ended or run is None or run.started_at is None:
                return
            self._ended = True
            self._forget()
        try:
            if error is None:
                run.__exit__(None, None, None)  # completed, or killed if a stop was seen and swallowed
            else:
                run.__exit__(type(error), error, error.__traceback__)
        except Exception:  # noqa: BLE001 - ending must never replace the agent's own outcome
            log.exception("agent-watchdog: could not end run %s", run.id)

    def __enter__(self) -> Self:
        self._managed = True
        self._open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self._managed = False
        self.end(exc)
        return False


def json_safe(value: object) -> Any:
    """The value as plain JSON data; objects a framework passes along become their str()."""
    try:
        return json.loads(json.dumps(value, default=str, allow_nan=False))
    except (TypeError, ValueError):
        return str(value)


def tool_args(value: object) -> dict[str, Any]:
    """Tool arguments as a dict: a dict as is, a JSON object string parsed, anything else under "input"."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value) if value.strip() else {}
        except ValueError:
            parsed = None
        value = parsed if isinstance(parsed, dict) else {"input": value}
    elif not isinstance(value, dict):
        value = {"input": value}
    return json_safe(value)


def before_tool(run: Run, name: str, args: dict[str, Any], *, circuits: bool) -> PendingTool:
    """`Run.before_tool` for a framework that runs the tool itself (the same choke point as
    `Run.tool_call`): raises RunKilled, or with `circuits` ToolUnavailable, before the tool runs."""
    return run.before_tool(name, args, circuits=circuits)


def after_tool(run: Run, pending: PendingTool, *, ok: bool, error: BaseException | str | None = None) -> None:
    """`Run.after_tool`: count the call for the guards and record it (raises RunKilled if the
    daemon asked to stop)."""
    run.after_tool(pending, ok=ok, error=error)
