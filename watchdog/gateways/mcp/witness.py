"""The run side of the MCP proxy: which run a `tools/call` belongs to, whether it may go to the
server, and what is recorded once the server answered. Synchronous (the relay calls it off the
event loop); one `ToolWitness` per client (the stdio client, or one HTTP session).

Two ways to witness a run:

- its own run (no --run, no $AGENT_WATCHDOG_RUN): created and written through the SDK's write
  path (`source = "mcp"`), with the SDK's guards and circuits; it ends by silence — a call after
  `heartbeat_timeout_s` without one, or once the daemon ended it so, starts a new run — and when
  the client leaves;
- a run another writer owns (exec's, the SDK's): its row is read, never written; each call is
  appended as an event marked `source = "mcp"`, judged by the same guards against the larger of
  the proxy's own count and the run's (watchdog.sdk.joined, shared with the LiteLLM callback).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from watchdog.core import lifecycle as lc
from watchdog.core.lifecycle import error_fields, hash_args
from watchdog.errors import RunKilled, ToolUnavailable
from watchdog.sdk.client import Watchdog
from watchdog.sdk.joined import JoinedRuns
from watchdog.sdk.run import Run
from watchdog.sdk.toolcall import PendingTool
from watchdog.store import joined
from watchdog.store.engine import GATEWAY_ROLE, gateway_misconfiguration, row_locked

from watchdog.gateways.mcp import wording

log = logging.getLogger("watchdog.gateways.mcp")

DEFAULT_AGENT = "mcp-proxy"
SOURCE = lc.Source.MCP


class ToolFailed(Exception):
    """What the server answered a call with, when it failed (its class is what circuits count)."""


class ServerError(Exception):
    """A JSON-RPC error the server answered a tools/call with."""


@dataclass
class Admitted:
    """A call that may go to the server; `finish` records it."""

    name: str
    args: dict
    call_id: str
    run_id: str | None
    pending: PendingTool | None = None  # own run: the SDK's pending attempt
    probe: bool = False  # joined run: this call is the circuit's half-open probe
    t0: float = field(default_factory=time.perf_counter)


class ToolWitness:
    """The run(s) of one MCP client, as the proxy witnesses them."""

    def __init__(self, wd: Watchdog, *, agent: str | None, run_id: str | None, tag: str | None = None):
        self.wd = wd
        self.agent = agent or DEFAULT_AGENT
        self.joined_id = run_id  # a run another writer owns, or None: the proxy's own runs
        self.tag = tag or uuid.uuid4().hex[:8]  # names this client in call ids
        self.run: Run | None = None
        self.joined = JoinedRuns(wd, SOURCE)  # the joined run, and the proxy's own view of its calls
        self.last_call = 0.0  # monotonic time of the last tools/call (silence ends an own run)
        self._lock = threading.Lock()
        self._warned = False
        self._misconfigured = False
        self.runs_started = 0

    # -- admission ---------------------------------------------------------------

    def admit(self, name: str, args: dict, request_id: object) -> Admitted | str:
        """An Admitted call, or the refusal text the model is to read."""
        call_id = f"mcp:{self.tag}:{request_id}"[:128]
        with self._lock:
            try:
                if self.joined_id is not None:
                    return self._admit_joined(name, args, call_id)
                return self._admit_own(name, args, call_id)
            except Exception as exc:  # noqa: BLE001 — fail open, said (the SDK raises a misconfigured store)
                if row_locked(exc):  # not an outage: another session holds the run's row (fail closed)
                    return wording.locked(name)
                self.outage(exc)
                return Admitted(name, args, call_id, None)  # nothing to record it in
            finally:
                self.last_call = time.monotonic()

    def _admit_own(self, name: str, args: dict, call_id: str) -> Admitted | str:
        run = self._current_run()
        status = self._status(run.id)
        if status is not None:
            st, reason, detail = status
            if st in lc.END_STATUSES and (st == lc.COMPLETED or reason == lc.HEARTBEAT_TIMEOUT):
                run = self._new_run()  # ended by silence: the next call is a new run
            elif st == lc.PAUSED:
                return wording.paused(name, run.id)
            elif st not in lc.ACTIVE_STATUSES or st == lc.STOPPING:
                run.cancel(RunKilled(reason or st, detail or f"the run is {st}"))
        try:
            pending = run.before_tool(name, args)
        except RunKilled as stop:
            return wording.stopped(name, run.id, stop.reason, stop.detail)
        except ToolUnavailable as exc:
            return wording.unavailable(name, str(exc))
        return Admitted(name, args, call_id, run.id, pending=pending)

    def _admit_joined(self, name: str, args: dict, call_id: str) -> Admitted | str:
        rid = self.joined_id
        assert rid is not None
        try:
            state = self.joined.state(rid)
        except Exception as exc:  # noqa: BLE001 — a store outage fails open
            self.outage(exc)
            return Admitted(name, args, call_id, rid)
        if state is None:
            return wording.no_run(name, rid)
        if state.status == lc.PAUSED:
            return wording.paused(name, rid)
        if state.status != lc.RUNNING:
            return wording.stopped(name, rid, state.stop_reason or state.status, state.stop_detail)
        guard = self.joined.guard(state)  # the larger of the proxy's count and the run's
        try:
            guard.before_tool(name, hash_args(args, tool=name), self.joined.elapsed_s(state))
        except RunKilled as stop:
            return wording.stopped(name, rid, stop.reason, stop.detail)
        gate = self.wd.circuit_for(name)
        probe = False
        if gate is not None:
            verdict = gate.admit(rid)
            if verdict is None:
                msg = gate.message(name)
                self._append(Admitted(name, args, call_id, rid), ok=False,
                             error=ToolUnavailable(name, msg), duration_s=0.0)
                return wording.unavailable(name, msg)
            probe = verdict == "probe"
        return Admitted(name, args, call_id, rid, probe=probe)

    # -- the answer --------------------------------------------------------------

    def finish(self, call: Admitted, *, ok: bool, error: Exception | None = None) -> None:
        """Record a call the server answered (ok, or failed with `error`)."""
        with self._lock:
            try:
                if call.pending is not None and self.run is not None and self.run.id == call.run_id:
                    try:
                        self.run.after_tool(call.pending, ok=ok, error=error)
                    except RunKilled:
                        pass  # stopped meanwhile: the next call is refused
                    return
                if call.run_id is None:
                    return
                guard = self.joined.known(call.run_id)
                if guard is not None:
                    guard.count_tool_call()
                self._append(call, ok=ok, error=error, duration_s=max(0.0, time.perf_counter() - call.t0))
                if call.probe and ok:
                    self.wd.circuits.probe_succeeded(call.name, call.run_id)
            except Exception as exc:  # noqa: BLE001 — recording never breaks the relay
                self.outage(exc)

    def _append(self, call: Admitted, *, ok: bool, error: Exception | None, duration_s: float) -> None:
        cls, msg = error_fields(error, self.wd.record_errors) if not ok and error is not None else (None, None)
        if not ok and cls is None:
            cls = "Error"
        try:
            self.joined.append(
                call.run_id or "", kind=lc.EV_TOOL, call_id=call.call_id, tool=call.name,
                args_hash=hash_args(call.args, tool=call.name), ok=ok, error_class=cls,
                error_msg=msg[:500] if msg else None, duration_s=duration_s)
        except Exception as exc:  # noqa: BLE001
            self.outage(exc)

    # -- own runs ----------------------------------------------------------------

    def _current_run(self) -> Run:
        run = self.run
        if run is None:
            return self._new_run()
        silence_s = run.budgets.heartbeat_timeout_s
        if silence_s and self.last_call and time.monotonic() - self.last_call > silence_s:
            return self._new_run()  # silent for longer than a heartbeat: that run is over
        return run

    def _new_run(self) -> Run:
        self._end_own()
        run = self.wd.run(self.agent)
        run.source = SOURCE
        # A gateway never waits inside a call for a human to answer a pause (the client would see
        # a hung call and the relay would fail open): see Run.never_hold.
        run.never_hold()
        run.start()
        self.run = run
        self.runs_started += 1
        log.info("agent-watchdog mcp-proxy: run %s (agent %s)", run.id, self.agent)
        return run

    def _end_own(self) -> None:
        run, self.run = self.run, None
        if run is None or run.status in lc.END_STATUSES:
            return
        try:
            stop = run.stop_requested
            if stop is not None:
                run.end(lc.KILLED, stop.reason, stop.detail)
            else:
                run.end(lc.COMPLETED, None, None)
        except Exception as exc:  # noqa: BLE001
            self.outage(exc)

    def _status(self, run_id: str) -> tuple[str, str | None, str | None] | None:
        try:
            return joined.own_status(self.wd.writer, run_id)
        except Exception as exc:  # noqa: BLE001 — a store outage fails open
            self.outage(exc)
            return None

    def outage(self, exc: BaseException) -> None:
        """Fail open, said once: a store that is down or slow is an outage; one that refuses this
        login (a missing grant) will refuse every call until fixed, and is said once on its own
        with the fix, even after an outage was (a warning said once must not hide the other)."""
        wrong = gateway_misconfiguration(exc, self.wd.url)
        if wrong is not None:
            if not self._misconfigured:
                self._misconfigured = True
                log.error("agent-watchdog mcp-proxy: %s; tool calls pass unrecorded and unguarded until then", wrong)
            return
        if not self._warned:
            self._warned = True
            log.warning("agent-watchdog mcp-proxy: the store failed (%s: %s); tool calls pass unguarded "
                        "while it does", type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")

    def close(self) -> None:
        """The client left: the proxy's own run ends (a joined run is its writer's to end)."""
        with self._lock:
            self._end_own()

