"""Where the daemon keeps its own files, and where agents find its socket.

Pure functions of the environment, the effective uid and the home directory (passed in),
so that the rule is written once and tested without touching host paths. The order is
DESIGN.md's (`[daemon] state_dir`, `socket`, `key_file`):

- state_dir: configured, else $STATE_DIRECTORY (systemd's StateDirectory=), else
  /var/lib/agent-watchdog as root, else $XDG_STATE_HOME/agent-watchdog, else
  ~/.local/state/agent-watchdog.
- socket: configured, else $RUNTIME_DIRECTORY/attest.sock (systemd's RuntimeDirectory=),
  else /run/agent-watchdog/attest.sock as root, else $XDG_RUNTIME_DIR/agent-watchdog/attest.sock,
  else state_dir/attest.sock.
- key_file: configured, else state_dir/attest.key.

Agents (the SDK, exec) look for the socket: $AGENT_WATCHDOG_SOCKET, else
/run/agent-watchdog/attest.sock if it exists (an agent user under the shipped unit has
no $XDG_RUNTIME_DIR), else $XDG_RUNTIME_DIR/agent-watchdog/attest.sock, else
~/.local/state/agent-watchdog/attest.sock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

ENV_SOCKET = "AGENT_WATCHDOG_SOCKET"
SYSTEM_STATE_DIR = "/var/lib/agent-watchdog"
SYSTEM_SOCKET = "/run/agent-watchdog/attest.sock"
APP_DIR = "agent-watchdog"
SOCKET_NAME = "attest.sock"
KEY_NAME = "attest.key"
# sockaddr_un.sun_path is 108 bytes with its terminating NUL.
SOCKET_MAX_BYTES = 107


def _first(value: str | None) -> str:
    # systemd passes a colon-separated list when a unit names several directories.
    return (value or "").split(":")[0]


def state_dir(configured: str, env: Mapping[str, str], euid: int, home: str) -> str:
    if configured:
        return configured
    if _first(env.get("STATE_DIRECTORY")):
        return _first(env.get("STATE_DIRECTORY"))
    if euid == 0:
        return SYSTEM_STATE_DIR
    base = env.get("XDG_STATE_HOME") or os.path.join(home, ".local", "state")
    return os.path.join(base, APP_DIR)


def daemon_socket(configured: str, env: Mapping[str, str], euid: int, state: str) -> str:
    if configured:
        return configured
    if _first(env.get("RUNTIME_DIRECTORY")):
        return os.path.join(_first(env.get("RUNTIME_DIRECTORY")), SOCKET_NAME)
    if euid == 0:
        return SYSTEM_SOCKET
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], APP_DIR, SOCKET_NAME)
    return os.path.join(state, SOCKET_NAME)


def key_file(configured: str, state: str) -> str:
    return configured or os.path.join(state, KEY_NAME)


def socket_too_long(path: str) -> str | None:
    """Why a Unix socket cannot live at `path`, or None."""
    n = len(os.fsencode(path))
    if n > SOCKET_MAX_BYTES:
        return f"{n} bytes, a Unix socket path holds at most {SOCKET_MAX_BYTES}"
    return None


def agent_socket(env: Mapping[str, str], home: str, exists: Callable[[str], bool] = os.path.exists) -> str:
    """The socket an agent attests on (the order in the module's docstring); "" = never attest."""
    if ENV_SOCKET in env:
        return env[ENV_SOCKET]
    if exists(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    if env.get("XDG_RUNTIME_DIR"):
        candidate = os.path.join(env["XDG_RUNTIME_DIR"], APP_DIR, SOCKET_NAME)
        if exists(candidate):
            return candidate
    # A user's own daemon without $XDG_RUNTIME_DIR keeps it in its state_dir ($XDG_STATE_HOME too).
    for base in filter(None, (env.get("XDG_STATE_HOME"), os.path.join(home, ".local", "state"))):
        candidate = os.path.join(base, APP_DIR, SOCKET_NAME)
        if exists(candidate):
            return candidate
    return SYSTEM_SOCKET  # nothing found: the packaged default, so the warning names a real place
