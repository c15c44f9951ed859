"""The rules about a run's cgroup, written once for exec (which makes it) and the daemon (which checks it).

Pure: texts in (what /proc/self/mountinfo and /proc/PID/cgroup say), answers out. The I/O lives
in watchdog.core.cgroupfs (the reads), watchdog.gateways.exec.cgroup and watchdog.daemon.stops.runtree.

A run's cgroup is named `agent-watchdog-run-<run id>`; made by `systemd-run --user --scope`
it is the scope unit's cgroup, `agent-watchdog-run-<run id>.scope`. It lies under the cgroup2
mount (found in mountinfo: the layout may be hybrid, cgroup2 at /sys/fs/cgroup/unified).
"""

from __future__ import annotations

import os
import re

NAME_PREFIX = "agent-watchdog-run-"
SCOPE_SUFFIX = ".scope"
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


def run_cgroup_name(run_id: str) -> str:
    return f"{NAME_PREFIX}{run_id}"


def scope_unit(run_id: str) -> str:
    """The transient scope unit `systemd-run --user --scope --unit=` makes for the run."""
    return f"{run_cgroup_name(run_id)}{SCOPE_SUFFIX}"


def unescape_mount_path(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup2_mount(mountinfo: str) -> str | None:
    """The mount point of the cgroup2 hierarchy in a mountinfo text, or None (no cgroup v2)."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) >= 5 and rfields and rfields[0] == "cgroup2":
            return unescape_mount_path(fields[4])
    return None


def unified_path(proc_cgroup: str) -> str | None:
    """The cgroup v2 path ("0::/a/b") in a /proc/PID/cgroup text, or None."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def run_cgroup_error(path: str, run_id: str, mount: str | None) -> str | None:
    """Why `path` cannot be run `run_id`'s cgroup (None: it can): named for the run, a real
    directory name under the cgroup2 mount (no '..', no symlink games: the caller resolves)."""
    if mount is None:
        return "this host has no cgroup2 mount"
    if not isinstance(path, str) or not path or "\x00" in path:
        return "no cgroup path"
    if not _RUN_ID.match(run_id or ""):
        return "not a run id"
    norm = os.path.normpath(path)
    if norm != path.rstrip("/") or not os.path.isabs(path):
        return f"{path!r} is not a normalised absolute path"
    root = os.path.normpath(mount)
    if os.path.commonpath([root, norm]) != root or norm == root:
        return f"{path!r} is not under the cgroup2 mount {root}"
    base = os.path.basename(norm)
    if base not in (run_cgroup_name(run_id), scope_unit(run_id)):
        return f"{path!r} is not named {run_cgroup_name(run_id)!r}"
    return None


def fs_path(mount: str, cgroup_path: str) -> str:
    """The directory of cgroup `cgroup_path` (as /proc/PID/cgroup spells it) under `mount`."""
    return os.path.normpath(os.path.join(mount, cgroup_path.lstrip("/")))


def is_inside(member_cgroup: str, mount: str, directory: str) -> bool:
    """Whether a process whose /proc/PID/cgroup path is `member_cgroup` is in `directory` or below."""
    where = fs_path(mount, member_cgroup)
    d = os.path.normpath(directory)
    return where == d or where.startswith(d + os.sep)
