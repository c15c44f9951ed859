"""agent-watchdog: an out-of-process watchdog that stops runaway LLM agent runs.

    from watchdog import Watchdog, RunKilled
"""

from .client import Watchdog
from .errors import ConfigError, RunKilled, ToolUnavailable
from .run import Run

__all__ = ["Watchdog", "Run", "RunKilled", "ToolUnavailable", "ConfigError"]
__version__ = "0.1.0"
