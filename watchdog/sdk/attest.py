"""The agent's side of attestation: name our run to the daemon over its Unix socket.

The daemon learns who we are from the kernel (SO_PEERCRED), not from us; we
only say which run is ours. A run the daemon has not attested is still watched
and stopped cooperatively, never signalled, so a daemon that is down when the
run starts costs nothing but that: the run asks again, at most once every
`RETRY_S`, on its next records. Stdlib only; one short connection per attempt.
"""

from __future__ import annotations

import json
import os
import socket
import time

ENV_SOCKET = "AGENT_WATCHDOG_SOCKET"
DEFAULT_SOCKET = "/run/agent-watchdog/attest.sock"
TIMEOUT_S = 2.0
RETRY_S = 30.0
REPLY_MAX_BYTES = 1024


def socket_path(explicit: str | None = None) -> str:
    """`explicit`, else where DESIGN.md says an agent finds the daemon (watchdog.core.paths:
    $AGENT_WATCHDOG_SOCKET, /run/agent-watchdog, $XDG_RUNTIME_DIR, the user's state dir);
    "" = never attest."""
    if explicit is not None:
        return explicit
    from watchdog.core.paths import agent_socket

    return agent_socket(os.environ, os.path.expanduser("~"))


_warned = False


def warn_unattested(run_id: str, kill_mode: str, why: str) -> str:
    """Once per process, on stderr: a process/tree run the daemon could not attest is stopped
    cooperatively only, never signalled. Returns the note recorded on the run."""
    global _warned
    note = (f"not attested ({why[:160]}): kill_mode {kill_mode} needs the daemon's socket; "
            "this run can only be stopped cooperatively")
    if not _warned:
        _warned = True
        import sys

        print(f"agent-watchdog: run {run_id[:8]} {note}; set AGENT_WATCHDOG_SOCKET to the daemon's "
              "[daemon] socket (retried every 30 s)", file=sys.stderr, flush=True)
    return note


def request(path: str, run_id: str, kill_mode: str, timeout_s: float = TIMEOUT_S,
            cgroup: str | None = None) -> tuple[bool, str]:
    """Ask the daemon at `path` to attest run `run_id`: (attested, why not). `cgroup`: the
    run's own cgroup (agent-watchdog exec), which the daemon checks against the kernel."""
    ok, why, _key = request_key(path, run_id, kill_mode, timeout_s, cgroup=cgroup)
    return ok, why


def request_key(path: str, run_id: str, kill_mode: str, timeout_s: float = TIMEOUT_S,
                cgroup: str | None = None) -> tuple[bool, str, bytes | None]:
    """`request`, and the run's evidence key from the reply (None from a daemon that hands none
    out): the run MACs its records with it (watchdog.core.evidence_mac). Kept in memory only."""
    ok, why, key, _otlp = request_reply(path, run_id, kill_mode, timeout_s, cgroup=cgroup)
    return ok, why, key


def request_reply(path: str, run_id: str, kill_mode: str | None, timeout_s: float = TIMEOUT_S,
                  cgroup: str | None = None,
                  otlp_only: bool = False) -> tuple[bool, str, bytes | None, dict[str, str] | None]:
    """`request_key`, and what the daemon says of its OTLP receiver: {"endpoint", "token"} (the
    run's own bearer token), None when it has none on. `otlp_only`: ask for that alone, not to be
    attested (exec in a systemd scope, before its command runs)."""
    if not path:
        return False, "attestation is off (empty socket path)", None, None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(path)
        req: dict[str, object] = {"run": run_id}
        if otlp_only:
            req["otlp_only"] = True
        else:
            req["kill_mode"] = kill_mode
        if cgroup is not None:
            req["cgroup"] = cgroup
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while b"\n" not in buf and len(buf) < REPLY_MAX_BYTES:
            chunk = s.recv(REPLY_MAX_BYTES - len(buf))
            if not chunk:
                break
            buf += chunk
    except OSError as exc:
        return False, f"no daemon at {path} ({exc.strerror or type(exc).__name__})", None, None
    finally:
        s.close()
    try:
        reply = json.loads(buf.split(b"\n", 1)[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False, "unreadable reply from the daemon", None, None
    if isinstance(reply, dict) and reply.get("ok") is True:
        key = reply.get("key")
        try:
            raw = bytes.fromhex(key) if isinstance(key, str) and len(key) == 64 else None
        except ValueError:
            raw = None
        otlp = reply.get("otlp")
        got = None
        if isinstance(otlp, dict) and isinstance(otlp.get("endpoint"), str) and isinstance(otlp.get("token"), str):
            got = {"endpoint": otlp["endpoint"], "token": otlp["token"]}
        return True, "", raw, got
    return False, str(reply.get("error") if isinstance(reply, dict) else reply)[:200], None, None


class Attester:
    """Per run: attest at start, and again on a later record if that failed (rate-limited)."""

    __slots__ = ("path", "run_id", "kill_mode", "attested", "why", "next_try", "key")

    def __init__(self, path: str, run_id: str, kill_mode: str):
        self.path = path
        self.run_id = run_id
        self.kill_mode = kill_mode
        self.attested = False
        self.why = "not asked yet"
        self.next_try = 0.0
        self.key: bytes | None = None  # the run's evidence key, once attested

    def due(self) -> bool:
        """The per-record check: cheap (one comparison) while nothing is due."""
        return not self.attested and time.monotonic() >= self.next_try

    def attempt(self) -> bool:
        self.next_try = time.monotonic() + RETRY_S
        self.attested, self.why, self.key = request_key(self.path, self.run_id, self.kill_mode)
        return self.attested
