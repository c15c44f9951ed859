"""Who sent a request, as the kernel says: the loopback TCP peer's socket owner, never the spans' word.

`/proc/net/tcp` and `/proc/net/tcp6` list every socket with its owner uid and inode (readable by
anyone). The peer's socket is the one whose local address is the peer's address and whose
remote address is ours, and it is open (a closed one's line, timewait or orphaned, has inode 0
and, as timewait, uid 0 whoever made it: never taken for root's). Which process holds that
inode is readable only for one's own processes (or as root / with CAP_SYS_PTRACE): where the
daemon can read a process's fds, it believes nothing less than the inode being there.

Two questions are asked of it (watchdog.daemon.otlp.ingest):
- `confirm_claim`: is the claimed `process.pid` the sender? (its uid is the socket's owner and,
  where readable, it holds the socket) → that process is pinned by pid + create time.
- `inside_tree`: is the sender inside exec's tree? (a process holding the socket, or the claimed
  pid of the socket's owner uid, whose ancestry reaches exec's attested pid + create time).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

import psutil

from watchdog.core.procid import CREATE_TIME_TOLERANCE_S

PROC_NET = ("/proc/net/tcp", "/proc/net/tcp6")
MAX_ANCESTRY = 64  # parents walked up at most
MAX_TREE = 2048  # processes of exec's tree examined at most


@dataclass(frozen=True)
class Peer:
    """The kernel's view of one TCP peer; uid / inode None when the socket was not found (not local)."""

    address: tuple[str, int]
    uid: int | None
    inode: int | None
    closed: bool = False  # not found open, but the kernel lists it closed: a local peer that left (nobody's)


@dataclass(frozen=True)
class Pinned:
    pid: int
    create_time: float
    uid: int


def _parse_addr(text: str) -> tuple[ipaddress._BaseAddress, int]:
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(port, 16)


def _norm(host: str) -> ipaddress._BaseAddress:
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip


def peer(client: tuple[str, int], server: tuple[str, int]) -> Peer:
    """The socket of `client` (host, port) connected to `server` (host, port), from /proc/net."""
    address = (str(client[0]), int(client[1]))
    try:
        want_local = (_norm(client[0]), int(client[1]))
        want_remote = (_norm(server[0]), int(server[1]))
    except ValueError:
        return Peer(address, None, None)
    closed = False
    for path in PROC_NET:
        try:
            with open(path, encoding="ascii") as f:
                next(f, None)  # header
                for line in f:
                    parts = line.split()
                    if len(parts) < 10:
                        continue
                    try:
                        if _parse_addr(parts[1]) != want_local or _parse_addr(parts[2]) != want_remote:
                            continue
                        if parts[9] == "0":  # no live socket (closed: timewait, orphan): its uid is 0, no owner's
                            closed = True
                            continue
                        return Peer(address, int(parts[7]), int(parts[9]))
                    except ValueError:
                        continue
        except OSError:
            continue
    return Peer(address, None, None, closed)


def holds(pid: int, inode: int) -> bool | None:
    """Whether process `pid` has socket `inode` open; None when its fds cannot be read (another
    user's process without ptrace rights) or it is gone."""
    target = f"socket:[{inode}]"
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except (PermissionError, FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    for fd in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def _pin(pid: int) -> Pinned | None:
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return Pinned(pid, p.create_time(), p.uids().real)
    except psutil.Error:
        return None


def confirm_claim(p: Peer, claimed_pid: int | None) -> tuple[Pinned | None, str]:
    """The claimed process pinned, if the kernel confirms it sent this request; else (None, why)."""
    if p.uid is None or p.inode is None:
        return None, "the sender is not a local TCP socket the kernel lists"
    if claimed_pid is None:
        return None, "the spans claim no process.pid"
    pinned = _pin(claimed_pid)
    if pinned is None:
        return None, f"the claimed process.pid {claimed_pid} does not exist"
    if pinned.uid != p.uid:
        return None, f"the claimed process.pid {claimed_pid} is not the socket owner's (uid {p.uid})"
    if holds(claimed_pid, p.inode) is False:
        return None, f"the claimed process.pid {claimed_pid} does not hold the sending socket"
    return pinned, ""


def _descends(pid: int, root_pid: int, root_create: float) -> bool:
    try:
        p = psutil.Process(pid)
        for _ in range(MAX_ANCESTRY):
            if p.pid == root_pid:
                return bool(abs(p.create_time() - root_create) <= CREATE_TIME_TOLERANCE_S)  # psutil: Any
            if p.pid <= 1:
                return False
            parent = p.parent()
            if parent is None:
                return False
            p = parent
    except psutil.Error:
        return False
    return False


def inside_tree(p: Peer, claimed_pid: int | None, root_pid: int, root_create: float) -> bool:
    """Whether the kernel places the sender inside the tree rooted at exec's attested process."""
    if p.uid is None or p.inode is None:
        return False
    try:
        root = psutil.Process(root_pid)
        if abs(root.create_time() - root_create) > CREATE_TIME_TOLERANCE_S:
            return False
        tree = [root, *root.children(recursive=True)[:MAX_TREE]]
    except psutil.Error:
        return False
    unreadable = False
    for proc in tree:
        held = holds(proc.pid, p.inode)
        if held:
            return True
        unreadable = unreadable or held is None
    if not unreadable:
        return False  # every process of the tree was read and none holds the socket
    # Without the right to read the tree's fds: the socket's owner must be the claimed
    # process.pid's user, and that process must descend from exec's.
    if claimed_pid is None:
        return False
    pinned = _pin(claimed_pid)
    return pinned is not None and pinned.uid == p.uid and _descends(claimed_pid, root_pid, root_create)
