"""The `agent-watchdog` command line. Thin: parse, call one function, print.

Every error is one line on stderr and a non-zero exit; `--debug` shows the traceback.
The group lives in `app`; importing the command modules registers them on it.
"""

from watchdog.cli import alerts_cmd, pause_cmds, budgets_cmd, daemon_cmds, demo_cmd, report_cmds, store_cmds  # noqa: F401 — registers the commands
from watchdog.cli import web_cmd  # noqa: F401,E402 — `agent-watchdog web` (issue 24)
from watchdog.cli import exec_cmd  # noqa: F401 — registers `exec`
from watchdog.cli import files_cmd  # noqa: F401 — issue 19: `files unit|config|roles`
from watchdog.cli import hook_cmd  # noqa: F401 — issue 33: `hook claude-code|codex|gemini`, `hook install`
from watchdog.cli import status_cmd  # noqa: F401 — issue 36: `status`
from watchdog.cli.app import main

__all__ = ["main"]
