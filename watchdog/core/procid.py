"""Light process identity: who am I, where, and since when.

Imported by the agent SDK, so it must not import psutil. The create time
is computed with psutil's own Linux formula so that an identity reported
by the SDK compares equal to what the daemon later reads with psutil.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Mapping

_PROCFS = "/proc"

# psutil's create time has one clock tick (10 ms) of resolution and is
# computed identically each time, so 1 ms only absorbs float noise.
CREATE_TIME_TOLERANCE_S = 1e-3

# Why an identity no longer names a running process (the daemon's killer reports them):
GONE = "process gone"
ZOMBIE = "zombie"
RECYCLED = "create time differs (pid recycled)"
# For these the process the identity names no longer runs: that is success.
GONE_REASONS = frozenset({GONE, ZOMBIE, RECYCLED})


@dataclass(frozen=True)
class ProcessIdentity:
    """A process by its full identity, never a bare pid: a recycled pid has another create time."""

    host: str
    pid: int
    create_time: float
    # The uid the daemon attested (SO_PEERCRED) for a run's own process; None for
    # processes the killer found itself (children), which are held to allowed_users only.
    uid: int | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"host": self.host, "pid": self.pid, "create_time": self.create_time}
        if self.uid is not None:
            d["uid"] = self.uid
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProcessIdentity":
        uid = d.get("uid")
        return cls(host=str(d["host"]), pid=int(d["pid"]), create_time=float(d["create_time"]),
                   uid=None if uid is None else int(uid))


def hostname() -> str:
    return socket.gethostname()


def _boot_time_s() -> float:
    # psutil re-reads btime on every create_time() call (it is not cached),
    # and returns it as float(int seconds); we do the same.
    with open(f"{_PROCFS}/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.strip().split()[1])
    raise RuntimeError(f"line 'btime' not found in {_PROCFS}/stat")


def _starttime_ticks(pid: int | str) -> str:
    with open(f"{_PROCFS}/{pid}/stat", "rb") as f:
        data = f.read()
    # The command name sits in parentheses and may itself contain spaces
    # and ')', so split after the LAST ')' exactly like psutil does.
    fields = data[data.rfind(b")") + 2 :].split()
    # fields[0] is field 3 (state) of proc(5), so field 22 (starttime) is [19].
    return fields[19].decode()


def create_time(pid: int | str = "self") -> float | None:
    """Create time of `pid` in seconds since the epoch, bit-for-bit equal to
    psutil.Process(pid).create_time() on Linux; None elsewhere or if gone."""
    if not sys.platform.startswith("linux"):
        return None
    # Only a positive pid or "self" names a /proc entry: "1/../self" would read another one.
    if isinstance(pid, bool) or not (pid == "self" or (str(pid).isdigit() and int(pid) > 0)):
        return None
    try:
        ticks_per_s = os.sysconf("SC_CLK_TCK")
        # Same operations as psutil: (float(ticks) / CLK_TCK) + float(btime),
        # no rounding. Dividing the sum instead would differ in the last bits.
        since_boot_s = float(_starttime_ticks(pid)) / ticks_per_s
        return since_boot_s + _boot_time_s()
    except (OSError, ValueError, IndexError, RuntimeError):
        return None


def current_create_time() -> float | None:
    return create_time("self")
