"""agent-watchdog: an out-of-process watchdog that stops runaway LLM agent runs.

    from watchdog import Watchdog, RunKilled
"""

from watchdog.sdk.client import Watchdog
from watchdog.errors import ConfigError, RunKilled, StoreMisconfigured, ToolTimeout, ToolUnavailable
from watchdog.sdk.run import Run

__all__ = ["Watchdog", "Run", "RunKilled", "ToolUnavailable", "ToolTimeout", "ConfigError", "StoreMisconfigured"]
__version__ = "0.1.0"
