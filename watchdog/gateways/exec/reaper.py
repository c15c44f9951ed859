"""exec's own process tree: child subreaper, reaping, and signalling every member.

As PR_SET_CHILD_SUBREAPER, descendants that double-fork or `setsid` are reparented to exec,
not to init, so "every descendant of exec" is the command's whole tree whatever it did to
its process group or session. The command's own status is taken by its pid; orphans are
peeked (WNOWAIT) before they are reaped, so an orphan reap never steals the command's status.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

import psutil

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER, 1): orphans of our tree are reparented to us."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Reaper:
    """Reaps exec's children; keeps the command's wait status when it comes."""

    def __init__(self, command_pid: int):
        self.command_pid = command_pid
        self.status: int | None = None  # the command's wait status (os.waitstatus_to_exitcode)

    def reap(self) -> None:
        """Reap whatever has exited, without blocking."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            try:
                _pid, status = os.waitpid(info.si_pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if info.si_pid == self.command_pid and self.status is None:
                self.status = status

    @property
    def command_done(self) -> bool:
        return self.status is not None

    def command_running(self) -> bool:
        """Reap what has exited first, so a command that just exited does not count as running."""
        self.reap()
        return not self.command_done


def exit_code(status: int) -> int:
    """timeout(1)'s convention: the command's own code, 128+N when it died of signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def descendants() -> list[psutil.Process]:
    """Every live descendant of exec (as a subreaper: the command's whole tree)."""
    try:
        return [p for p in psutil.Process(os.getpid()).children(recursive=True) if _alive(p)]
    except psutil.Error:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def signal_process(proc: psutil.Process, sig: int) -> bool:
    """Send `sig` to exactly `proc` (pinned by a pidfd after checking its create time)."""
    me = os.getpid()
    if proc.pid in (0, 1, me, os.getppid()):
        return False
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return False
    try:
        if not proc.is_running():  # psutil compares the create time: a recycled pid fails
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except (OSError, psutil.Error):
        return False
    finally:
        os.close(fd)


def signal_all(procs, sig: int) -> int:
    return sum(signal_process(p, sig) for p in procs)
