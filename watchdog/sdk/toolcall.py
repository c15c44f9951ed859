"""`Run.tool_call`: the one choke point every tool call of an agent goes through.

Order matters:

1. stop requested → RunKilled (no I/O);
2. guards admit the call (wall-clock, tool-call budget, identical calls,
   oscillation) → RunKilled, recorded as the run's stop reason;
3. dedupe: a read-only call already answered in this run (or within the
   profile's `dedupe_window_s`) returns the cached result; writes never;
4. circuit: open → ToolUnavailable without calling the tool (recorded as a
   failed tool event); half-open → exactly one call, across all processes, is
   the probe (one attempt, no retries);
5. the one retry policy: each attempt is its own tool event; between attempts
   the budgets and the circuit are checked again.

Guards come before the circuit so that a half-open probe, once claimed, always
runs (a guard refusing it afterwards would leave the circuit waiting for a probe
that never happens), and so that an agent retrying a failing-fast tool with the
same arguments still trips loop detection. Agent retries and tool retries never
multiply: the tool retries here, and the agent sees one result or one exception.
"""

from __future__ import annotations

import time

from watchdog.sdk.circuitview import PROBE
from watchdog.errors import ToolUnavailable
from watchdog.core.records import hash_args, validate_amount

_clock = time.monotonic  # the dedupe window's clock (tests replace it)
_sleep = time.sleep  # the backoff's sleep (tests replace it)


def call_tool(run, name: str, args: dict, fn, *, read_only: bool = False, retries: int = 0,
              retry_on=(Exception,), backoff_s: float = 0.5):
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a tool name, got {name!r}")
    if not isinstance(args, dict):
        raise ValueError(f"args of tool {name!r}: expected a dict of keyword arguments, got {type(args).__name__}")
    if not callable(fn):
        raise ValueError(f"fn of tool {name!r}: expected a callable, got {type(fn).__name__}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries: expected an integer >= 0, got {retries!r}")
    retry_on = _exception_types(retry_on)
    backoff_s = validate_amount("backoff_s", backoff_s)
    args_hash = hash_args(args, tool=name)
    run.check()

    guard = run.guard
    key = (name, args_hash)
    if guard is not None:
        hit = _cached(run, key, guard) if read_only else None
        run._guarded(lambda: guard.before_tool(name, args_hash, run._elapsed_s(), cached=hit is not None))
        if hit is not None:
            # A repeat served from the cache: counted for loops (above), neither run nor recorded.
            return hit[1]

    last_exc: Exception | None = None
    attempt = 0
    while True:
        attempt += 1
        if attempt > 1:
            _sleep(backoff_s * (2 ** (attempt - 2)))
            run.check()
            if guard is not None:
                run._guarded(lambda: guard.before_retry(run._elapsed_s()))
        probe = _admit(run, name, args, guard, last_exc)
        t0 = time.perf_counter()
        token = run.wd.inflight.started(run, name)  # names the tool if it never returns
        try:
            result = fn(**args)
        except Exception as exc:
            run.wd.inflight.finished(token)
            duration_s = time.perf_counter() - t0
            if guard is not None:
                guard.count_tool_call()
            run.record_tool(name, args, ok=False, error=exc, duration_s=duration_s)
            if probe or attempt > retries or not isinstance(exc, retry_on) or isinstance(exc, ToolUnavailable):
                raise
            last_exc = exc
            continue
        except BaseException:
            run.wd.inflight.finished(token)
            raise
        run.wd.inflight.finished(token)
        duration_s = time.perf_counter() - t0
        if guard is not None:
            guard.count_tool_call()
            if read_only:
                _dedupe_cache(run)[key] = (_clock(), result)
        run.record_tool(name, args, ok=True, duration_s=duration_s)
        return result


def _admit(run, name: str, args: dict, guard, cause: Exception | None) -> bool:
    """Consult the tool's circuit; True when this attempt is the half-open probe.

    Fails fast with ToolUnavailable (recorded as a failed tool event) while the
    circuit refuses the call.
    """
    gate = run.wd.circuit_for(name)
    if gate is None:
        return False
    verdict = gate.admit(run.id)
    if verdict is not None:
        return verdict == PROBE
    exc = ToolUnavailable(name, gate.message(name))
    if guard is not None:
        guard.count_tool_call()
    run.record_tool(name, args, ok=False, error=exc, duration_s=0.0)
    raise exc from cause


def _cached(run, key, guard):
    """(stored_at, result) of a still-valid dedupe entry, or None."""
    entry = _dedupe_cache(run).get(key)
    if entry is None:
        return None
    window_s = guard.budgets.get("dedupe_window_s") or 0
    if window_s and _clock() - entry[0] > window_s:
        return None
    return entry


def _dedupe_cache(run) -> dict:
    cache = getattr(run, "_dedupe", None)
    if cache is None:
        cache = run._dedupe = {}
    return cache


def _exception_types(retry_on) -> tuple:
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    if not all(isinstance(t, type) and issubclass(t, Exception) for t in types):
        raise ValueError(
            f"retry_on: expected an Exception subclass or a tuple of them (() retries nothing), got {retry_on!r}")
    return types
