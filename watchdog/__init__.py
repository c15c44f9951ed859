"""agent-watchdog: an out-of-process watchdog that stops runaway LLM agent runs.

    from watchdog import Watchdog, RunKilled

The SDK's names are loaded on first use (PEP 562): `agent-watchdog hook`, which a coding CLI starts
for every tool call, imports a submodule of this package and must not pay for the SDK's imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from watchdog.errors import ConfigError, RunKilled, StoreMisconfigured, ToolTimeout, ToolUnavailable

if TYPE_CHECKING:
    from watchdog.sdk.client import Watchdog
    from watchdog.sdk.run import Run

__all__ = ["Watchdog", "Run", "RunKilled", "ToolUnavailable", "ToolTimeout", "ConfigError", "StoreMisconfigured"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Watchdog":
        from watchdog.sdk.client import Watchdog

        return Watchdog
    if name == "Run":
        from watchdog.sdk.run import Run

        return Run
    raise AttributeError(f"module 'watchdog' has no attribute {name!r}")
