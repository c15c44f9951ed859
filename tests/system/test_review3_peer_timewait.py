"""Hostile review 3: a closed socket's /proc/net/tcp line names root, not its owner.

The HTTP MCP proxy answers only its own Unix user or root (watchdog.gateways.mcp.serve.own_user),
by the peer's line in /proc/net/tcp. A client that sends its request and closes at once is, on
loopback, already in FIN_WAIT2 when the server looks it up: the kernel has made it a timewait
socket, listed with uid 0 and inode 0 whoever made it. So another user's (mallory's, useradd)
request read as root's: the check let it through. A line with inode 0 is no live socket, and
names no owner: peer() now passes over it (not found; own_user refuses a loopback peer it
cannot find).
"""

from __future__ import annotations

import pwd
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from attest_support import LocalUsers
from watchdog.daemon.otlp.sender import peer
from watchdog.gateways.mcp.serve import own_user

CLIENT = textwrap.dedent("""
    import socket, sys
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    print(s.getsockname()[1], flush=True)
    s.sendall(b"POST /mcp HTTP/1.1\\r\\nhost: x\\r\\ncontent-length: 0\\r\\n\\r\\n")
    s.close()  # at once: the server reads the request after this
""")


def fin_wait2(port: int, within_s: float = 10.0) -> bool:
    """Whether 127.0.0.1:`port`'s socket gets to FIN_WAIT2 (the kernel's state 05), as a
    server's read and ACK of the client's FIN bring it there (waited for, bounded)."""
    want = f"0100007F:{port:04X}"
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        with open("/proc/net/tcp", encoding="ascii") as f:
            if any(p[1] == want and p[3] == "05" for p in map(str.split, f) if len(p) > 3):
                return True
        time.sleep(0.01)
    return False


@pytest.fixture
def mallory():
    users = LocalUsers()
    try:
        yield users.add("mallory")
    finally:
        users.close()


def test_a_closed_peer_socket_is_never_taken_for_roots(mallory):
    uid = pwd.getpwnam(mallory).pw_uid
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        port = ls.getsockname()[1]
        done = subprocess.run(["setpriv", f"--reuid={mallory}", f"--regid={mallory}", "--clear-groups",
                               sys.executable, "-c", CLIENT, str(port)], capture_output=True, text=True, timeout=60,
                              cwd="/")
        assert done.returncode == 0, done.stderr
        conn, addr = ls.accept()
        with conn:
            assert conn.recv(4096).startswith(b"POST")
            assert fin_wait2(addr[1]), "the client's socket never reached FIN_WAIT2"
            found = peer(addr, conn.getsockname())
            assert found.uid in (None, uid), found  # never root's: the socket was mallory's
            assert found.closed
            assert not own_user({"client": addr, "server": conn.getsockname()})


def test_a_closed_peer_on_a_non_loopback_address_is_refused_too(mallory):
    """Through the host's own non-loopback address (a proxy listening beyond loopback) a peer the
    kernel does not find counts as a remote one: a closed local socket must not pass as that."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: the route's source address
        host = probe.getsockname()[0]
    if host.startswith("127."):
        host = "127.0.0.1"  # no other address: the loopback case again
    with socket.socket() as ls:
        ls.bind((host, 0))
        ls.listen(1)
        port = ls.getsockname()[1]
        done = subprocess.run(["setpriv", f"--reuid={mallory}", f"--regid={mallory}", "--clear-groups",
                               sys.executable, "-c", CLIENT.replace('"127.0.0.1"', repr(host)), str(port)],
                              capture_output=True, text=True, timeout=60, cwd="/")
        assert done.returncode == 0, done.stderr
        conn, addr = ls.accept()
        with conn:
            assert conn.recv(4096).startswith(b"POST")
            found = peer(addr, conn.getsockname())
            assert found.uid in (None, pwd.getpwnam(mallory).pw_uid), found
            assert not own_user({"client": addr, "server": conn.getsockname()})
