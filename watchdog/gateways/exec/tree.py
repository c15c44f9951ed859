"""The command's tree as exec sees it, and how it is taken down.

Members are exec's descendants (as a subreaper, the whole tree, setsid'd and double-forked
ones included) and, where the run has a cgroup, every process in it. Taking the tree down:
SIGTERM (and SIGCONT, so a stopped process can act on it) to every member, new members too
as they appear, for up to `grace_s`; then `cgroup.kill` where exec owns the cgroup and
SIGKILL to each member left, until none is.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from watchdog.gateways.exec import reaper as rp
from watchdog.gateways.exec.cgroup import Placement

KILL_WAIT_S = 10.0  # after SIGKILL: only an uninterruptible process takes longer
POLL_S = 0.02


class Tree:
    def __init__(self, reaper: rp.Reaper, placement: Placement | None):
        self.reaper = reaper
        self.placement = placement

    def members(self) -> list[psutil.Process]:
        found = {p.pid: p for p in rp.descendants()}
        if self.placement is not None and self.placement.path:
            me = os.getpid()
            for pid in self.placement.pids():
                if pid in found or pid == me:
                    continue
                try:
                    p = psutil.Process(pid)
                    if p.status() != psutil.STATUS_ZOMBIE:
                        found[pid] = p
                except psutil.Error:
                    continue
        return list(found.values())

    def forward(self, sig: int) -> int:
        """A signal the user sent exec, to every member once."""
        return rp.signal_all(self.members(), sig)

    def take_down(self, grace_s: float) -> tuple[int, int]:
        """(members that got SIGTERM, that needed SIGKILL); returns once none is left (or the
        SIGKILL wait ran out: an uninterruptible process)."""
        termed: set[tuple[int, float]] = set()
        deadline = time.monotonic() + max(0.0, grace_s)
        while True:
            self.reaper.reap()
            left = self.members()
            for p in left:
                key = _key(p)
                if key is not None and key not in termed:
                    termed.add(key)
                    rp.signal_process(p, signal.SIGTERM)
                    rp.signal_process(p, signal.SIGCONT)
            if not left or time.monotonic() >= deadline:
                break
            _nap()
        killed: set[tuple[int, float]] = set()
        end = time.monotonic() + KILL_WAIT_S
        while left and time.monotonic() < end:
            if self.placement is not None:
                self.placement.kill()
            for p in left:
                if rp.signal_process(p, signal.SIGKILL):
                    key = _key(p)
                    if key is not None:
                        killed.add(key)
            _nap()
            self.reaper.reap()
            left = self.members()
        self.reaper.reap()
        return len(termed), len(killed)


def _key(p: psutil.Process) -> tuple[int, float] | None:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return None


def _nap() -> None:
    """Wait for a SIGCHLD (blocked: waited for synchronously), at most POLL_S."""
    try:
        signal.sigtimedwait([signal.SIGCHLD], POLL_S)
    except (OSError, InterruptedError):
        time.sleep(POLL_S)
