"""The one choke point every tool call of an agent goes through.

`Run.tool_call` (the SDK runs the tool) and every framework integration (the
framework runs it) use the same two functions, through `Run.before_tool` and
`Run.after_tool`, so a rule added here holds for both:

1. stop requested → RunKilled (no I/O);
2. guards admit the call (wall-clock, tool-call budget, identical calls,
   oscillation) → RunKilled, recorded as the run's stop reason;
3. dedupe (`call_tool` only): a read-only call already answered in this run (or
   within the profile's `dedupe_window_s`) returns the cached result; writes never;
4. circuit: open → ToolUnavailable without calling the tool (recorded as a
   failed tool event and counted as a call); half-open → exactly one call,
   across all processes, is the probe (one attempt, no retries); a successful
   probe closes the circuit at once;
5. the one retry policy (`call_tool` only): each attempt is its own tool event,
   marked as a retry (the daemon does not count retries as identical calls);
   between attempts the budgets and the circuit are checked again.

Guards come before the circuit so that a half-open probe, once claimed, always
runs (a guard refusing it afterwards would leave the circuit waiting for a probe
that never happens), and so that an agent retrying a failing-fast tool with the
same arguments still trips loop detection. Agent retries and tool retries never
multiply: the tool retries here, and the agent sees one result or one exception.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, TypedDict, TypeVar

from watchdog.core.lifecycle import hash_args, validate_amount
from watchdog.errors import RunKilled, ToolUnavailable
from watchdog.sdk import deadline
from watchdog.sdk.circuits import PROBE

if TYPE_CHECKING:
    from watchdog.sdk.seams import RunLike

T = TypeVar("T")
# `retry_on`: an Exception subclass, or a tuple of them (() retries nothing).
RetryOn = type[Exception] | tuple[type[Exception], ...]


class ToolPolicy(TypedDict, total=False):
    """The keywords of `run.tool_call(...)` beyond the call itself (see `call_tool`)."""

    retries: int
    retry_on: RetryOn
    backoff_s: float
    timeout_s: float | None

_clock = time.monotonic  # the dedupe window's clock (tests replace it)
_sleep = time.sleep  # the backoff's sleep (tests replace it)


class PendingTool:
    """One attempt of a tool call that was admitted: what it is, since when, whether it probes."""

    __slots__ = ("name", "args", "args_hash", "t0", "token", "probe", "attempt", "error")

    def __init__(self, name: str, args: dict[str, Any], args_hash: str | None = None, attempt: int = 1):
        self.name = name
        self.args = args
        self.args_hash = args_hash or hash_args(args, tool=name)
        self.t0 = time.perf_counter()
        self.token: int | None = None  # the in-flight marker (names the tool if it hangs)
        self.probe = False
        self.attempt = attempt
        self.error: BaseException | None = None

    @property
    def duration_s(self) -> float:
        return max(0.0, time.perf_counter() - self.t0)


def before_tool(run: RunLike, name: str, args: dict[str, Any], *, circuits: bool = True, cached: bool = False,
                args_hash: str | None = None, attempt: int = 1) -> PendingTool:
    """Admit one attempt of a tool call, or raise RunKilled / ToolUnavailable. The tool has not run.

    `cached`: the call is served from a dedupe cache (it counts for loops, not for the
    tool-call budget, and is neither run nor recorded). `attempt` > 1: a retry of an
    admitted call (the budgets and the circuit are checked again, the signature is not
    counted twice)."""
    pending = PendingTool(name, args, args_hash, attempt)
    run.check()
    guard = run.guard
    if guard is not None:
        if attempt == 1:
            run.guarded(lambda: guard.before_tool(name, pending.args_hash, run.elapsed_s, cached=cached))
        else:
            run.guarded(lambda: guard.before_retry(run.elapsed_s))
    if cached:
        return pending
    if circuits:
        gate = run.wd.circuit_for(name)
        if gate is not None:
            verdict = gate.admit(run.id)
            if verdict is None:
                exc = ToolUnavailable(name, gate.message(name))
                if guard is not None:
                    guard.count_tool_call()
                run.record_tool(name, args, ok=False, error=exc, duration_s=0.0, attempt=attempt)
                raise exc
            pending.probe = verdict == PROBE
    pending.token = run.wd.inflight.started(run, name)
    pending.t0 = time.perf_counter()
    return pending


def after_tool(run: RunLike, pending: PendingTool, *, ok: bool, error: BaseException | str | None = None,
               duration_s: float | None = None) -> None:
    """Count and record one admitted attempt (raises RunKilled if the daemon asked to stop)."""
    if pending.token is not None:
        run.wd.inflight.finished(pending.token)
        pending.token = None
    duration_s = pending.duration_s if duration_s is None else duration_s
    if run.guard is not None:
        run.guard.count_tool_call()
    if pending.probe:
        # A circuit breaker closes on a successful probe: the next call goes through at once.
        # A failed probe leaves the circuit half-open with its probe used: the daemon reopens it.
        if ok and not error:
            run.wd.circuits.probe_succeeded(pending.name, run.id)
    if isinstance(error, RunKilled):
        # The tool itself was stopped: record the call, the stop is already on its way up.
        try:
            run.record_tool(pending.name, pending.args, ok=False, error=error, duration_s=duration_s,
                            attempt=pending.attempt)
        except RunKilled:
            pass
        return
    run.record_tool(pending.name, pending.args, ok=ok, error=error, duration_s=duration_s, attempt=pending.attempt)


def call_tool(run: RunLike, name: str, args: dict[str, Any], fn: Callable[..., T], *, read_only: bool = False,
              retries: int = 0, retry_on: RetryOn = (Exception,), backoff_s: float = 0.5,
              timeout_s: float | None = None) -> T:
    """`fn(**args)` through the choke point (see the module's docstring); returns what `fn` returns."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a tool name, got {name!r}")
    if not isinstance(args, dict):
        raise ValueError(f"args of tool {name!r}: expected a dict of keyword arguments, got {type(args).__name__}")
    if not callable(fn):
        raise ValueError(f"fn of tool {name!r}: expected a callable, got {type(fn).__name__}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries: expected an integer >= 0, got {retries!r}")
    retry_types = _exception_types(retry_on)
    backoff_s = validate_amount("backoff_s", backoff_s)
    if timeout_s is not None and (validate_amount("timeout_s", timeout_s) <= 0):
        raise ValueError(f"timeout_s: expected a number > 0, got {timeout_s!r}")
    args_hash = hash_args(args, tool=name)
    run.check()

    key = (name, args_hash)
    hit = _cached(run, key) if read_only and run.guard is not None else None
    if hit is not None:
        # A repeat served from the cache: counted for loops, neither run nor recorded.
        before_tool(run, name, args, args_hash=args_hash, cached=True)
        cached: T = hit[1]  # what fn returned for these arguments
        return cached

    last_exc: Exception | None = None
    attempt = 0
    while True:
        attempt += 1
        if attempt > 1:
            _sleep(backoff_s * (2 ** (attempt - 2)))
        try:
            pending = before_tool(run, name, args, args_hash=args_hash, attempt=attempt)
        except ToolUnavailable as exc:
            if last_exc is not None:
                raise exc from last_exc
            raise
        try:
            result = fn(**args) if timeout_s is None else deadline.call(run, name, fn, args, timeout_s)
        except RunKilled as stop:  # stopped while the tool ran (timeout_s, or the tool raised it)
            after_tool(run, pending, ok=False, error=stop)
            raise
        except Exception as exc:
            after_tool(run, pending, ok=False, error=exc)
            if pending.probe or attempt > retries or not isinstance(exc, retry_types) or isinstance(exc, ToolUnavailable):
                raise
            last_exc = exc
            continue
        except BaseException:
            if pending.token is not None:
                run.wd.inflight.finished(pending.token)
            raise
        if read_only and run.guard is not None:
            run.dedupe_cache[key] = (_clock(), result)
        after_tool(run, pending, ok=True)
        return result


def _cached(run: RunLike, key: tuple[str, str]) -> tuple[float, Any] | None:
    """(stored_at, result) of a still-valid dedupe entry, or None."""
    entry = run.dedupe_cache.get(key)
    if entry is None:
        return None
    guard = run.guard  # (there is one: only a guarded run caches)
    window_s = (guard.budgets.get("dedupe_window_s") or 0) if guard is not None else 0
    if window_s and _clock() - entry[0] > window_s:
        return None
    return entry


def _exception_types(retry_on: object) -> tuple[type[Exception], ...]:
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    if not all(isinstance(t, type) and issubclass(t, Exception) for t in types):
        raise ValueError(
            f"retry_on: expected an Exception subclass or a tuple of them (() retries nothing), got {retry_on!r}")
    return types
