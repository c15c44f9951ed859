"""The kernel's word on cgroups, read once for exec (which makes a run's cgroup) and the daemon
(which checks and kills it): where cgroup2 is mounted, which cgroup a process is in, which
processes a cgroup holds. Small reads of /proc and cgroupfs, no process table (psutil) and no
store; what the texts mean is watchdog.core.cgroups' (pure)."""

from __future__ import annotations

import os

from watchdog.core import cgroups as rules

MOUNTINFO = "/proc/self/mountinfo"


def read_text(path: str) -> str:
    """A /proc or cgroupfs file's text (a byte that does not decode reads as U+FFFD: never raises for it)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def mount_point() -> str | None:
    """Where this process sees the cgroup2 hierarchy mounted (hybrid layouts too), or None."""
    try:
        return rules.cgroup2_mount(read_text(MOUNTINFO))
    except OSError:
        return None


def cgroup_of(pid: int | str = "self") -> str | None:
    """The cgroup v2 path of a process ("/a/b"), or None (gone, or no cgroup2)."""
    try:
        return rules.unified_path(read_text(f"/proc/{pid}/cgroup"))
    except OSError:
        return None


def cgroup_pids(directory: str | None) -> list[int]:
    """Every pid in the cgroup directory and its sub-cgroups (a sub-cgroup that goes meanwhile: skipped)."""
    found: list[int] = []
    if not directory:
        return found
    for dirpath, _dirs, _files in os.walk(directory):
        try:
            found += [int(x) for x in read_text(os.path.join(dirpath, "cgroup.procs")).split()]
        except (OSError, ValueError):
            continue
    return found
