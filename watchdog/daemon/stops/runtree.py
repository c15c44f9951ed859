"""An exec'd run's process tree as the daemon knows it: its cgroup, and what it remembers.

- The cgroup is taken ONLY from exec's sealed attestation, and checked by the kernel's word at
  attestation (named `agent-watchdog-run-<id>`, a directory under the cgroup2 mount found in
  /proc/self/mountinfo, exec's process or its child inside it) and again, for the name and
  the mount, every time it is used. A row cannot point the daemon at `system.slice`.
- Tree mode (no cgroup): each tick the daemon pins the descendants it sees of each attested
  exec and of what it pinned before (watchdog.daemon.stops.exectree), so when exec is gone —
  SIGKILLed, its orphans reparented away — the tree it left is still attributable to the root.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Protocol

import psutil

from watchdog.core import cgroups as rules
from watchdog.core.cgroupfs import cgroup_of as _cgroup_of, cgroup_pids as cgroup_pids, mount_point as mount_point
from watchdog.core.procid import CREATE_TIME_TOLERANCE_S, GONE_REASONS, ProcessIdentity


class Killer(Protocol):
    """What a run tree asks of the daemon's killer (watchdog.daemon.stops.killer.Killer, which builds on
    this module: a protocol, so this module never imports it)."""

    def identity(self, pid: int) -> ProcessIdentity | None: ...

    def refusal(self, ident: ProcessIdentity) -> str | None: ...

    def alive(self, idents: Iterable[ProcessIdentity]) -> list[ProcessIdentity]: ...


def directory(run_id: str, path: str | None, mount: str | None = None) -> str | None:
    """The run's cgroup directory when `path` (the directory, from a verified attestation)
    still passes the rules and exists as itself (no symlink); else None."""
    if path is None:
        return None
    mount = mount if mount is not None else mount_point()
    if rules.run_cgroup_error(path, run_id, mount) is not None:
        return None
    d = os.path.normpath(path)
    if os.path.realpath(d) != d or not os.path.isdir(d):
        return None
    return d


def attest_refusal(run_id: str, path: str, exec_pid: int, exec_create_time: float) -> str | None:
    """Why exec's claimed cgroup is not the run's (None: it is). exec's process, or a child it
    started after itself, must be in it by /proc/PID/cgroup."""
    mount = mount_point()
    err = rules.run_cgroup_error(path, run_id, mount)
    if err is not None:
        return err
    if mount is None:  # refused by run_cgroup_error already: said again for the type
        return "this host has no cgroup2 mount"
    d = directory(run_id, path, mount)
    if d is None:
        return f"{path!r} is not a cgroup directory under {mount}"
    where = _cgroup_of(exec_pid)
    if where is not None and rules.is_inside(where, mount, d):
        return None
    try:
        kids = psutil.Process(exec_pid).children()
    except psutil.Error:
        kids = []
    for kid in kids:
        try:
            if kid.create_time() + CREATE_TIME_TOLERANCE_S < exec_create_time:
                continue
            where = _cgroup_of(kid.pid)
            if where is not None and rules.is_inside(where, mount, d) and kid.ppid() == exec_pid:
                return None
        except psutil.Error:
            continue
    return f"neither your process nor a child of it is in {path!r}"


def cgroup_kill(d: str | None) -> bool:
    """Write cgroup.kill where the daemon may (never under ProtectControlGroups=yes)."""
    if not d:
        return False
    path = os.path.join(d, "cgroup.kill")
    if not os.access(path, os.W_OK):
        return False
    try:
        with open(path, "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def remove_empty(d: str | None) -> None:
    """rmdir the run's cgroup (and its empty sub-cgroups) once its tree is gone and exec, which
    would have removed it, is gone too. The kernel refuses to remove a cgroup with a process in
    it, so this never takes a process's cgroup away."""
    if not d:
        return
    for dirpath, _dirs, _files in sorted(os.walk(d), key=lambda t: -len(t[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            return


def cgroup_members(killer: Killer, d: str | None) -> list[ProcessIdentity]:
    """Identities (pid + create time now) of the processes in cgroup directory `d`."""
    found: list[ProcessIdentity] = []
    for pid in cgroup_pids(d):
        ident = killer.identity(pid)
        if ident is not None:
            found.append(ident)
    return found


def guarded_cgroup_kill(killer: Killer, d: str | None) -> bool:
    """cgroup.kill, only where the daemon may write it and every process in the cgroup is one
    the killer may signal anyway (cgroup.kill spares nobody: root, other users, the daemon)."""
    members = cgroup_members(killer, d)
    if not members or any(killer.refusal(m) not in (None, *GONE_REASONS) for m in members):
        return False
    return cgroup_kill(d)


def remaining(killer: Killer, idents: Iterable[ProcessIdentity], d: str | None = None) -> list[ProcessIdentity]:
    """The live ones of `idents`, plus whatever is in the run's cgroup directory `d` now."""
    seen = {i.pid: i for i in killer.alive(idents)}
    for m in killer.alive(cgroup_members(killer, d)):
        seen.setdefault(m.pid, m)
    return list(seen.values())
