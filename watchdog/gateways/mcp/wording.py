"""What a refused `tools/call` tells the model: what was refused, why, and what to do instead.

Worded from reasons and identifiers the proxy or the daemon chose, never from another run's
error text (a stop detail written by an agent is cut to one bounded line)."""

from __future__ import annotations

from watchdog.core import lifecycle as lc
from watchdog.core.text import scrub, one_line

PREFIX = "agent-watchdog:"
DETAIL_MAX_CHARS = 200

_WHAT_NEXT: dict[str, str] = {  # by stop reason (a StopReason is its str)
    lc.LOOP_DETECTED: "it was repeating the same call with the same arguments; use the results you already "
                      "have and answer, do not call tools again",
    lc.MAX_TOOL_CALLS: "it used its tool-call budget; answer with what you have",
}
_DEFAULT_NEXT = "no further tool calls will run; answer with what you have, or tell the user the task was stopped"


def stopped(tool: str, run_id: str, reason: str, detail: str | None) -> str:
    why = f"run stopped: {reason}"
    if detail:
        why += f" ({one_line(scrub(detail), DETAIL_MAX_CHARS)})"
    what = _WHAT_NEXT.get(reason, _DEFAULT_NEXT)
    return (f"{PREFIX} {why}. The call to tool {tool!r} was refused and not run (run {run_id[:8]}); "
            f"this run is stopped: {what}.")


def paused(tool: str, run_id: str) -> str:
    return (f"{PREFIX} run paused: it is waiting for a human to approve more budget. The call to tool {tool!r} "
            f"was refused and not run (run {run_id[:8]}). Do not retry now; wait or tell the user.")


def unavailable(tool: str, message: str) -> str:
    return (f"{PREFIX} tool unavailable: the call to tool {tool!r} was refused and not run, its circuit "
            f"breaker is open. {one_line(message, DETAIL_MAX_CHARS)}. Use another tool or answer without it.")


def no_run(tool: str, run_id: str) -> str:
    return (f"{PREFIX} run {run_id[:32]!r} is not in the store; the call to tool {tool!r} was refused and not "
            f"run. Tell the user the watchdog is misconfigured (--run / $AGENT_WATCHDOG_RUN).")


def locked(tool: str) -> str:
    return (f"{PREFIX} run stopped: its row is locked in the store by another session's open transaction, so "
            f"the call to tool {tool!r} cannot be judged; it was refused and not run. Retry later or answer "
            f"with what you have.")
