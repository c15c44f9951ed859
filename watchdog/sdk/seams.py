"""What the SDK's helpers ask of a run and of its Watchdog, as protocols.

`Run` (watchdog.sdk.run) is built from helpers — child runs (children), the pause gate
(pause), the tool choke point (toolcall), a tool's deadline (deadline), the in-flight
poll (inflight) — and `Watchdog` (watchdog.sdk.client) makes runs. The helpers sit below
both and name them only through these protocols, so no module of the SDK imports one
that imports it back (issue 34: no import cycle, a type-only import included). Nothing
here runs: a protocol is a type.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Protocol

if TYPE_CHECKING:
    from watchdog.core import budgets as bud
    from watchdog.core.config import Config
    from watchdog.errors import RunKilled
    from watchdog.sdk.circuits import CircuitGate, Circuits
    from watchdog.sdk.guards import Guard
    from watchdog.store.agent_writes import Writer
    from watchdog.store.lineage import Lineage


class Inflight(Protocol):
    """The in-flight marker of tool calls (watchdog.sdk.inflight.InflightTools)."""

    def started(self, run: RunLike, tool: str) -> int: ...

    def finished(self, token: int) -> None: ...


class WatchdogLike(Protocol):
    """The agent's Watchdog (watchdog.sdk.client.Watchdog) as the helpers of a run use it."""

    @property
    def writer(self) -> Writer: ...

    @property
    def closed(self) -> bool: ...

    @property
    def inflight(self) -> Inflight: ...

    @property
    def circuits(self) -> Circuits: ...

    def config(self) -> Config: ...

    def circuit_for(self, tool: str) -> CircuitGate | None: ...


class RunLike(Protocol):
    """One run (watchdog.sdk.run.Run) as its helpers use it."""

    @property
    def id(self) -> str: ...

    @property
    def wd(self) -> WatchdogLike: ...

    @property
    def budgets(self) -> bud.Budgets: ...

    @property
    def profile(self) -> bud.Budgets: ...

    @property
    def lineage(self) -> Lineage: ...

    @property
    def guard(self) -> Guard | None: ...

    @property
    def cancelled(self) -> threading.Event: ...

    @property
    def dedupe_cache(self) -> dict[tuple[str, str], tuple[float, Any]]: ...

    @property
    def steps(self) -> int: ...

    @property
    def tool_calls(self) -> int: ...

    @property
    def tokens_in(self) -> int: ...

    @property
    def tokens_out(self) -> int: ...

    @property
    def cost_eur(self) -> float: ...

    @property
    def elapsed_s(self) -> float: ...

    @property
    def stop_requested(self) -> RunKilled | None: ...

    def check(self) -> None: ...

    def cancel(self, stop: RunKilled) -> None: ...

    def raise_stop(self, stop: RunKilled) -> NoReturn: ...

    def guarded(self, check: Callable[[], None]) -> None: ...

    def set_budgets(self, budgets: bud.Budgets) -> None: ...

    def watch_cancel(self, event: threading.Event) -> None: ...

    def unwatch_cancel(self, event: threading.Event) -> None: ...

    def record_tool(self, name: str, args: object = None, *, ok: bool = True, error: BaseException | str | None = None,
                    duration_s: float | None = None, attempt: int = 1) -> None: ...
