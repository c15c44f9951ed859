"""What a config needs from this host, checked before the daemon starts and by `check-config`.

Parsing (core/config.py) is pure and runs wherever the SDK reads a config; these
checks are about the daemon's host: the extras a key needs are installed, the users
named in allowed_users exist. Each problem is one line naming the key and the fix.
"""

from __future__ import annotations

import importlib.util
import os
import pwd

from watchdog.core.config import Config
from watchdog.errors import ConfigError
from watchdog.store.engine import EXTRA_HINT


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def problems(config: Config) -> list[str]:
    where = config.path or "(built-in defaults)"
    found = []
    url = config.store.url or ""
    if url.startswith(("postgresql", "postgres:")) and _missing("psycopg"):
        found.append(f"{where}: store.url is a PostgreSQL URL: it needs the `postgres` extra (psycopg 3): "
                     + EXTRA_HINT.format(extra="postgres"))
    if config.metrics_listen and _missing("prometheus_client"):
        found.append(f"{where}: metrics.listen needs the `metrics` extra (prometheus_client): "
                     + EXTRA_HINT.format(extra="metrics"))
    if config.otlp.listen and _missing("opentelemetry.proto"):  # [otlp]
        found.append(f"{where}: otlp.listen needs the `otlp` extra (opentelemetry-proto): "
                     + EXTRA_HINT.format(extra="otlp"))
    for user in config.daemon.allowed_users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            found.append(f"{where}: daemon.allowed_users: no user {user!r} on this host "
                         "(create it, or name the user the agents run as)")
    return found


def check(config: Config) -> None:
    """ConfigError (one line, every problem) if this host cannot run the daemon with `config`."""
    found = problems(config)
    if found:
        raise ConfigError(found[0] if len(found) == 1 else "; ".join(found))


def check_allowed_users(config: Config) -> None:
    """Root with no allowed_users would default to signalling root's own processes: refuse."""
    if os.geteuid() == 0 and not config.daemon.allowed_users:
        where = f" in {config.path}" if config.path else ""
        raise ConfigError(f"[daemon] allowed_users is not set{where} and the daemon runs as root: set "
                          "allowed_users = [\"USER\", ...] to the users whose agent processes it may signal "
                          "(root and system accounts only if named), or run it as its own user (see the unit)")
