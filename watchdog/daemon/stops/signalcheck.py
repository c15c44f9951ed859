"""Can this daemon signal the users it is told to (`[daemon] allowed_users`)? Asked once at start.

A daemon without CAP_KILL gets EPERM for every process of another user: its stops would all be
refused, found out only at the first runaway. The kernel lets a process signal another when
their uids match, or when it holds CAP_KILL in its effective set (root normally does, but not
under `setpriv --inh-caps=-all` or a unit that drops it). Pure reading of /proc/self/status.
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger("watchdog.daemon")

CAP_KILL_BIT = 5  # linux/capability.h
PROC_STATUS = "/proc/self/status"

FIX = ("give the daemon CAP_KILL: the shipped unit has AmbientCapabilities=CAP_KILL; outside systemd start it "
       "with `setpriv --reuid USER --inh-caps +kill --ambient-caps +kill agent-watchdog run ...` (or as root)")


def has_cap_kill(path: str = PROC_STATUS) -> bool | None:
    """Whether CAP_KILL is in this process's effective set; None when the kernel does not say."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_KILL_BIT & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class Signalable:
    """Which of the allowed users this daemon can signal, and which not."""

    cap_kill: bool | None
    can: tuple[str, ...]
    cannot: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"cap_kill": self.cap_kill, "can": list(self.can), "cannot": list(self.cannot)}

    def sentence(self) -> str:
        if not self.can and not self.cannot:
            return "signals nobody (allowed_users is empty)"
        if not self.cannot:
            return f"can signal {', '.join(self.can)}"
        head = f"cannot signal {', '.join(self.cannot)} (no CAP_KILL)"
        return f"{head}; can signal {', '.join(self.can)}" if self.can else head


def signalable(users: Iterable[str], euid: int | None = None, cap_kill: bool | None = None) -> Signalable:
    """Each allowed user, by whether this process's signals reach it (own uid, or CAP_KILL)."""
    euid = os.geteuid() if euid is None else euid
    cap = has_cap_kill() if cap_kill is None else cap_kill
    can: list[str] = []
    cannot: list[str] = []
    for user in sorted(set(users)):
        try:
            uid: int | None = pwd.getpwnam(user).pw_uid
        except KeyError:
            uid = None  # no such user here: it has no processes to refuse
        (can if cap is not False or uid is None or uid == euid else cannot).append(user)
    return Signalable(cap, tuple(can), tuple(cannot))


def warn_at_start(users: Iterable[str]) -> Signalable:
    """One line at start when some allowed user cannot be signalled, naming the fix."""
    s = signalable(users)
    if s.cannot:
        log.warning("cannot signal the processes of %s: this daemon (uid %d) lacks CAP_KILL, so their stops would "
                    "be refused (retried each tick until it has it); %s", ", ".join(s.cannot), os.geteuid(), FIX)
    return s
