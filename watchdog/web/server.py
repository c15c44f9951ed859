"""`agent-watchdog web`: the view served on 127.0.0.1 by a threaded stdlib WSGI server.

The store is opened read-only (SQLite `mode=ro`; PostgreSQL sessions read-only by default, and
meant to log in as the viewer role of sql/postgres-roles.sql, which can write nothing).
"""

from __future__ import annotations

import ipaddress
import logging
import socketserver
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from watchdog.core.config import Config
from watchdog.web.app import WebApp
from watchdog.web.auth import Credentials

if TYPE_CHECKING:
    from watchdog.store.engine import Engine

log = logging.getLogger("watchdog.web")
REQUEST_TIMEOUT_S = 30.0  # a client that stalls mid-request holds one thread that long, never the server


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def bound(self) -> tuple[str, int]:
        """The host and port it listens on (asked for port 0: the one the kernel chose)."""
        host, port = self.socket.getsockname()[:2]
        return str(host), int(port)


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 — the stdlib's name
        log.info("%s %s", self.address_string(), format % args)


def open_store(url: str) -> Engine:
    """An engine that cannot write: SQLite read-only; PostgreSQL with read-only transactions."""
    from watchdog.store.access import open_read_only

    return open_read_only(url)


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--listen {listen!r}: give HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """Only this machine can reach `host` (127.0.0.0/8, ::1, `localhost`); any other name may resolve elsewhere."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make(url: str, config: Config, *, config_from_file: bool, listen: str,
         allowed_hosts: tuple[str, ...] = (), auth: Credentials | None = None, owner: str | None = None) -> _Server:
    host, port = parse_listen(listen)
    if auth is None and not is_loopback(host):
        # Private by default: past loopback a view without authentication shows every run to the network.
        raise ValueError(f"--listen {listen} is beyond loopback: give --auth-file FILE (docs/howto/web.md), "
                         "or listen on 127.0.0.1 behind a proxy that authenticates")
    app = WebApp(open_store(url), config, config_from_file=config_from_file, auth=auth, owner=owner)
    server = make_server(host, port, app, server_class=_Server, handler_class=_Handler)
    # The port bound (port 0: the one the kernel chose) is the one a Host header names.
    app.allowed_hosts = {h.lower() for h in _hosts(host, server.bound()[1], allowed_hosts)}
    return server


def _hosts(host: str, port: int, extra: tuple[str, ...]) -> tuple[str, ...]:
    """Host headers to accept: the listen address and localhost, plus the reverse proxy's names.
    On 0.0.0.0 / :: any (the operator chose to expose it; the proxy in front checks names)."""
    if host in ("0.0.0.0", "::") and not extra:
        return ()
    names = {host, "localhost", "127.0.0.1", "[::1]", *extra}
    return tuple(n for h in names for n in (h, f"{h}:{port}"))
