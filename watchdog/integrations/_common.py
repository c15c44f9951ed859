"""What the framework integrations share: the run they record on, JSON-safe tool arguments, the pre-checks.

Pure SDK code, no framework import: each framework module adapts its own events
to these helpers.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from watchdog.errors import RunKilled, ToolUnavailable
from watchdog.core.records import hash_args

log = logging.getLogger("watchdog.integrations")


class RunBinding:
    """Opens (or joins) the watchdog run a framework's callbacks record on, and ends it once.

    Owned runs start on the first event and, once ended, a later event opens a new
    one (a handler reused for another invocation). A joined run (`run=`) is never ended
    here: its owner does that. Inside `with handler:` the block bounds the run.
    """

    def _bind(self, wd, agent, run, estimated_cost_eur: float, run_kwargs: dict) -> None:
        name = type(self).__name__
        if run is not None:
            if wd is not None or agent is not None or run_kwargs:
                raise ValueError(f"{name}: give either run= (join a run) or wd and agent= (open one)")
            self._owns = False
            self.run = run
        else:
            if wd is None:
                raise ValueError(f"{name}: give a Watchdog and agent=, or run= to join a started run")
            self._owns = True
            self.run = wd.run(agent=agent, **run_kwargs)  # validates the budgets now, starts on the first event
        self._wd = wd
        self._agent = agent
        self._run_kwargs = run_kwargs
        self._estimated = float(estimated_cost_eur)
        self._lock = threading.RLock()
        self._ended = False
        self._managed = False  # inside `with handler:` the block's end ends the run

    def _open(self):
        """The run to record on, started (or re-opened after it ended) if it is ours."""
        with self._lock:
            if self._owns:
                if self._ended:
                    self.run = self._wd.run(agent=self._agent, **self._run_kwargs)
                    self._ended = False
                if self.run.started_at is None:
                    self.run.start()
            return self.run

    def _forget(self) -> None:
        """Drop per-invocation state when the run ends (called under the lock)."""

    def end(self, error: BaseException | None = None):
        """End the run now (completed, or from `error`: failed / killed). Idempotent; no-op on a joined run."""
        with self._lock:
            if not self._owns or self._ended or self.run.started_at is None:
                return
            self._ended = True
            self._forget()
        try:
            if error is None:
                self.run.__exit__(None, None, None)  # completed, or killed if a stop was seen and swallowed
            else:
                self.run.__exit__(type(error), error, error.__traceback__)
        except Exception:  # noqa: BLE001 - ending must never replace the agent's own outcome
            log.exception("agent-watchdog: could not end run %s", self.run.id)

    def __enter__(self):
        self._managed = True
        self._open()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._managed = False
        self.end(exc)
        return False


def json_safe(value):
    """The value as plain JSON data; objects a framework passes along become their str()."""
    try:
        return json.loads(json.dumps(value, default=str, allow_nan=False))
    except (TypeError, ValueError):
        return str(value)


def tool_args(value) -> dict:
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


class PendingTool:
    """A tool call the framework started: what it was, since when, and how it ended."""

    __slots__ = ("name", "args", "args_hash", "t0", "error", "token")

    def __init__(self, name: str, args: dict):
        self.name = name
        self.args = args
        self.args_hash = hash_args(args, tool=name)
        self.t0 = time.perf_counter()
        self.error = None
        self.token = None  # the SDK's in-flight tool marker (names the tool if it hangs)

    @property
    def duration_s(self) -> float:
        return max(0.0, time.perf_counter() - self.t0)


def before_tool(run, pending: PendingTool, *, circuits: bool) -> None:
    """The checks `Run.tool_call` makes before a tool runs, for a framework that runs it itself.

    Raises RunKilled (stop requested, or a guard refuses the call: budgets, identical
    calls, oscillation) or, with `circuits`, ToolUnavailable when the tool's circuit is
    open (the refusal is recorded as a failed call, like `Run.tool_call` does).
    """
    run.check()
    # The guards first: a guard refusing a call after it won the half-open probe would hold
    # the probe slot, and the circuit would stay half-open until the daemon freed it.
    if run.guard:
        run._guarded(lambda: run.guard.before_tool(pending.name, pending.args_hash, run._elapsed_s()))
    if circuits:
        circuit = run.wd.circuit_for(pending.name)
        if circuit is not None and circuit.refuses(run.id):
            exc = ToolUnavailable(pending.name, circuit.message(pending.name))
            run.record_tool(pending.name, pending.args, ok=False, error=exc, duration_s=0.0)
            raise exc
    pending.token = run.wd.inflight.started(run, pending.name)


def after_tool(run, pending: PendingTool, *, ok: bool, error=None) -> None:
    """Count the call for the guards and record it (raises RunKilled if the daemon asked to stop)."""
    if pending.token is not None:
        run.wd.inflight.finished(pending.token)
    if run.guard:
        run.guard.after_tool(pending.name, pending.args_hash)
    if isinstance(error, RunKilled):
        # The tool itself was stopped: record the call, the stop is already on its way up.
        try:
            run.record_tool(pending.name, pending.args, ok=False, error=error, duration_s=pending.duration_s)
        except RunKilled:
            pass
        return
    run.record_tool(pending.name, pending.args, ok=ok, error=error, duration_s=pending.duration_s)
