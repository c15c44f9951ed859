"""`watchdog.client`: the agent SDK's entry point, kept at this path for scripts that import it.

The SDK lives in `watchdog.sdk`; this module only re-exports it (and stays as light).
"""

from watchdog.errors import RunKilled, ToolUnavailable
from watchdog.sdk.client import Watchdog

__all__ = ["Watchdog", "RunKilled", "ToolUnavailable"]
