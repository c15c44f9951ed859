"""`run.tool_call(..., timeout_s=30)`: a tool with a deadline, and a stop that does not wait for it.

Python cannot kill a thread: the tool runs in a worker thread and the agent's thread
waits for it, for at most `timeout_s`, or until the run is stopped (`run.cancelled`).
On the deadline the call fails with ToolTimeout (recorded as the tool's error, retried
like any error when retries are asked for); on a stop RunKilled is raised at once. In
both cases the worker is left to finish on its own (a daemon thread: it never keeps
the process alive). A tool that can stop early polls `run.cancelled` itself.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from watchdog.errors import ToolTimeout

if TYPE_CHECKING:
    from watchdog.sdk.seams import RunLike

T = TypeVar("T")


def call(run: RunLike, name: str, fn: Callable[..., T], args: dict[str, Any], timeout_s: float) -> T:
    """`fn(**args)` in a worker thread: its result, its exception, ToolTimeout, or the run's stop."""
    done = threading.Event()
    box: dict[str, Any] = {}  # "result": what fn returned, or "error": what it raised

    def work() -> None:
        try:
            box["result"] = fn(**args)
        except BaseException as exc:  # noqa: BLE001 — handed to the agent's thread as it is
            box["error"] = exc
        finally:
            done.set()

    run.watch_cancel(done)  # a stop sets it too
    try:
        threading.Thread(target=work, name=f"agent-watchdog-tool-{name}"[:60], daemon=True).start()
        finished = done.wait(timeout_s)
    finally:
        run.unwatch_cancel(done)
    if "error" in box:
        raise box["error"]
    if "result" in box:
        result: T = box["result"]
        return result
    if finished and run.stop_requested is not None:
        raise run.stop_requested  # stopped while the tool ran: do not wait for it
    raise ToolTimeout(name, timeout_s)
