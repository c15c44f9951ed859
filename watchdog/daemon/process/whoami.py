"""What a daemon publishes about itself for `agent-watchdog status` (issue 36): its receivers'
addresses and whom it can signal, under the settings key `daemon:<host>` (watchdog.store.settings).

Written by the daemon's login only (on PostgreSQL the agents' roles cannot write settings), at
start once its receivers listen and with the other published settings after that; shown by
the CLI, never obeyed by anyone.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Protocol

from watchdog.core.periods import utcnow
from watchdog.core.config import Config
from watchdog.store.settings import publish_self
from watchdog.store.engine import Engine

if TYPE_CHECKING:
    from watchdog.daemon.stops.attest import AttestServer
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.otlp.server import OtlpServer
    from watchdog.daemon.stops.signalcheck import Signalable

log = logging.getLogger("watchdog.daemon")


class Daemon(Protocol):
    """What this module reads of the running daemon (watchdog.daemon.process.service.Daemon, which
    publishes it: a protocol, so this module never imports the service back)."""

    engine: Engine
    config: Config
    killer: Killer
    signalable: Signalable
    attest_server: AttestServer | None
    otlp_server: OtlpServer | None


def describe(d: Daemon) -> dict[str, Any]:
    otlp = None
    if d.otlp_server is not None:
        host, port = d.otlp_server.address
        otlp = f"http://{host}:{port}/v1/traces" if ":" not in host else f"http://[{host}]:{port}/v1/traces"
    return {
        "pid": os.getpid(),
        "uid": os.geteuid(),
        "tick_s": d.config.daemon.tick_s,
        "socket": d.config.daemon.socket if d.attest_server is not None else None,
        "otlp": otlp,
        "metrics": d.config.metrics_listen or None,
        "allowed_users": sorted(d.killer.allowed_users),
        "signals": d.signalable.to_json(),
    }


def publish(d: Daemon) -> None:
    """Best effort: a failure is logged and retried with the next publication."""
    try:
        with d.engine.begin() as conn:
            publish_self(conn, d.killer.host, describe(d), utcnow())
    except Exception as exc:  # noqa: BLE001 — status is a view; the daemon's work goes on
        log.debug("could not publish this daemon's status: %s", type(exc).__name__)
