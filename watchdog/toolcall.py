"""`Run.tool_call`: the one choke point every tool call of an agent goes through.

Order matters: stop requested → circuit open (fail fast) → guards (budgets,
loops) → dedupe (read-only only) → call with the one retry policy → record
each attempt. Agent retries and tool retries therefore never multiply.
"""

from __future__ import annotations

import time

from .errors import ToolUnavailable
from .records import hash_args, validate_amount


def call_tool(run, name: str, args: dict, fn, *, read_only: bool = False, retries: int = 0,
              retry_on: tuple = (Exception,), backoff_s: float = 0.5):
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a tool name, got {name!r}")
    if not isinstance(args, dict):
        raise ValueError(f"args of tool {name!r}: expected a dict of keyword arguments, got {type(args).__name__}")
    if not callable(fn):
        raise ValueError(f"fn of tool {name!r}: expected a callable, got {type(fn).__name__}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries: expected an integer >= 0, got {retries!r}")
    backoff_s = validate_amount("backoff_s", backoff_s)
    args_hash = hash_args(args, tool=name)
    run.check()

    circuit = run.wd.circuit_for(name)
    if circuit is not None and circuit.refuses(run.id):
        exc = ToolUnavailable(name, circuit.message(name))
        run.record_tool(name, args, ok=False, error=exc, duration_s=0.0)
        raise exc

    cache = _dedupe_cache(run)
    key = (name, args_hash)
    if run.guard:
        run._guarded(lambda: run.guard.before_tool(name, args_hash, run._elapsed_s()))
        if read_only and key in cache:
            hit_at, result = cache[key]
            window_s = run.guard.budgets.get("dedupe_window_s") or 0
            if not window_s or time.monotonic() - hit_at <= window_s:
                # A repeat served from the cache: counted (loops still trip), not re-run.
                run.guard.after_tool(name, args_hash)
                return result

    attempt = 0
    while True:
        attempt += 1
        t0 = time.perf_counter()
        try:
            result = fn(**args)
        except Exception as exc:
            duration_s = time.perf_counter() - t0
            if run.guard:
                run.guard.after_tool(name, args_hash)
            run.record_tool(name, args, ok=False, error=exc, duration_s=duration_s)
            if attempt > retries or not isinstance(exc, retry_on):
                raise
            time.sleep(backoff_s * (2 ** (attempt - 1)))
            run.check()
            if run.guard:
                run._guarded(lambda: run.guard.before_tool(name, args_hash, run._elapsed_s()))
            continue
        duration_s = time.perf_counter() - t0
        if run.guard:
            run.guard.after_tool(name, args_hash)
        if read_only:
            cache[key] = (time.monotonic(), result)
        run.record_tool(name, args, ok=True, duration_s=duration_s)
        return result


def _dedupe_cache(run) -> dict:
    cache = getattr(run, "_dedupe", None)
    if cache is None:
        cache = run._dedupe = {}
    return cache
