"""Minimal sd_notify(3) client, standard library only.

The daemon runs as ``Type=notify`` under systemd: it sends ``READY=1`` once
the store is open and the scheduler is running, and ``WATCHDOG=1`` after each
completed tick, so a hung tick gets the service restarted.

Nothing here may take the daemon down: when ``$NOTIFY_SOCKET`` is unset (not
run by systemd, or ``NotifyAccess`` excludes us) or the send fails (systemd
restarted, socket gone, buffer full), :func:`notify` returns ``False`` and
logs at debug level.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

__all__ = ["notify", "watchdog_interval_s"]

log = logging.getLogger("watchdog.sdnotify")


def notify(*fields: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``fields`` (e.g. ``"READY=1"``, ``"STATUS=..."``) as one datagram.

    Returns ``True`` when the datagram was sent, ``False`` when there is no
    notification socket or the send failed. Never raises for a socket error.
    """
    env = os.environ if env is None else env
    address = env.get("NOTIFY_SOCKET", "")
    if not address or not fields:
        return False
    if address[0] == "@":
        # Abstract namespace socket (Linux): leading NUL byte instead of "@".
        address = "\0" + address[1:]
    elif address[0] != "/":
        # sd_notify also accepts vsock:... addresses; systemd never hands
        # those to a plain system service, so they are not supported here.
        log.debug("sd_notify: unsupported NOTIFY_SOCKET %r", address)
        return False
    payload = "\n".join(fields).encode("utf-8")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(payload)
    except OSError as exc:
        log.debug("sd_notify to %r failed: %s", address, exc)
        return False
    return True


def watchdog_interval_s(env: Mapping[str, str] | None = None) -> float | None:
    """The service watchdog interval in seconds, or ``None`` if not enabled.

    Read from ``$WATCHDOG_USEC``; ignored when ``$WATCHDOG_PID`` is set to
    another process's pid (the variables were inherited, not meant for us).
    Callers should ping at about half this interval.
    """
    env = os.environ if env is None else env
    pid = env.get("WATCHDOG_PID", "").strip()
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(env.get("WATCHDOG_USEC", "").strip())
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000
