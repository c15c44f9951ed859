"""exec's exit statuses of its own and its one voice on stderr (`agent-watchdog exec: ...`).

Below the supervisor and its watch loop, which both speak and exit with these (so neither
imports the other back).
"""

from __future__ import annotations

import sys

EXIT_STOPPED = 124  # the run was stopped (by the daemon, the CLI, a guard, exec's own backstop)
EXIT_FAILED = 125  # exec itself failed (its one line says why)
PREFIX = "agent-watchdog exec"


def say(msg: str) -> None:
    print(f"{PREFIX}: {msg}", file=sys.stderr, flush=True)
