"""The run's own cgroup v2, where exec may make one.

In order: a directory exec may write to make it in — its own cgroup (a delegated subtree, or
anything as root) or, as root, the cgroup2 mount's root — else a transient scope of the
user's systemd manager (`systemd-run --user --scope`), which makes the cgroup and moves the
command into it itself. Where none of these works the run is a `tree` run (subreaper only).
The names and the mount come from watchdog.core.cgroups (the daemon checks the same rules).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from watchdog.core import cgroups as rules
# The kernel's word, read as the daemon reads it (one rule): names kept for exec's callers.
from watchdog.core.cgroupfs import cgroup_of as cgroup_of, cgroup_pids, mount_point as mount_point
SYSTEMD_PROBE_TIMEOUT_S = 10.0
SCOPE_APPEAR_TIMEOUT_S = 10.0

ROOT, DELEGATED, SYSTEMD = "root", "delegated", "systemd-run --user --scope"


class CgroupImpossible(Exception):
    """No cgroup of its own can be made for the run here (the message says why)."""


@dataclass
class Placement:
    """Where the run's command lives: `how` (ROOT, DELEGATED, SYSTEMD), the cgroup's path as
    /proc/PID/cgroup spells it (set for SYSTEMD once the scope exists) and its directory."""

    how: str
    run_id: str
    mount: str
    path: str | None = None

    @property
    def directory(self) -> str | None:
        return rules.fs_path(self.mount, self.path) if self.path else None

    @property
    def systemd(self) -> bool:
        return self.how == SYSTEMD

    def command(self, argv: Sequence[str]) -> list[str]:
        """The argv exec starts: through systemd-run for a scope, else the command itself."""
        if not self.systemd:
            return list(argv)
        return ["systemd-run", "--user", "--scope", "--quiet", "--collect",
                f"--unit={rules.scope_unit(self.run_id)}", "--", *argv]

    def place(self, pid: int) -> None:
        """Move the gated child into the cgroup (ROOT / DELEGATED; the scope places itself)."""
        if self.systemd:
            return
        d = self.directory
        if d is None:  # ROOT and DELEGATED placements are made with their path
            raise CgroupImpossible(f"no cgroup made for run {self.run_id} to place pid {pid} in")
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def locate(self, pid: int, alive) -> str:
        """The scope's cgroup, once systemd-run has moved `pid` into it."""
        want = rules.scope_unit(self.run_id)
        deadline = time.monotonic() + SCOPE_APPEAR_TIMEOUT_S
        while time.monotonic() < deadline:
            path = cgroup_of(pid)
            if path is not None and os.path.basename(path) == want:
                self.path = path
                return path
            if not alive():
                break
            time.sleep(0.02)
        raise CgroupImpossible(f"systemd-run did not put the command into a scope named {want}")

    def pids(self) -> list[int]:
        """Every process in the cgroup and its sub-cgroups."""
        return cgroup_pids(self.directory)

    def owned(self) -> bool:
        """exec may write the cgroup's cgroup.kill (Linux >= 5.14)."""
        d = self.directory
        if not d:
            return False
        return os.access(os.path.join(d, "cgroup.kill"), os.W_OK)

    def kill(self) -> bool:
        """cgroup.kill: SIGKILL to every process of the subtree, forks during the kill included."""
        d = self.directory
        if not d or not self.owned():
            return False
        try:
            with open(os.path.join(d, "cgroup.kill"), "w") as f:
                f.write("1")
            return True
        except OSError:
            return False

    def remove(self) -> None:
        """rmdir the cgroup (and empty sub-cgroups the command made); a scope systemd collects."""
        top = self.directory
        if not top or self.systemd:
            return
        for _ in range(50):  # the kernel empties a killed cgroup asynchronously
            try:
                for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda t: -len(t[0])):
                    os.rmdir(dirpath)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return
                time.sleep(0.02)


def plan(run_id: str) -> Placement:
    """Make the run's cgroup (ROOT / DELEGATED) or find a systemd user manager; raises
    CgroupImpossible naming what was tried."""
    mount = mount_point()
    if mount is None:
        raise CgroupImpossible("no cgroup2 mount in /proc/self/mountinfo")
    name = rules.run_cgroup_name(run_id)
    own = cgroup_of()
    tried: list[str] = []
    parents = []
    if own is not None:
        parents.append(own)
    if os.geteuid() == 0 and "/" not in parents:
        parents.append("/")
    for parent in parents:
        directory = rules.fs_path(mount, parent)
        if not os.access(directory, os.W_OK | os.X_OK):
            tried.append(f"{directory} is not writable")
            continue
        try:
            os.mkdir(os.path.join(directory, name))
        except OSError as exc:
            tried.append(f"cannot create a cgroup in {directory} ({exc.strerror})")
            continue
        path = os.path.join(parent, name) if parent != "/" else "/" + name
        return Placement(ROOT if os.geteuid() == 0 else DELEGATED, run_id, mount, path)
    why = systemd_user_manager()
    if why is None:
        return Placement(SYSTEMD, run_id, mount)
    tried.append(why)
    raise CgroupImpossible("; ".join(tried))


def systemd_user_manager() -> str | None:
    """None when `systemd-run --user --scope` works here, else why not."""
    exe = shutil.which("systemd-run")
    if exe is None:
        return "no systemd-run on PATH"
    try:
        probe = subprocess.run([exe, "--user", "--scope", "--quiet", "--collect", "--", "true"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               timeout=SYSTEMD_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemd-run --user --scope failed ({type(exc).__name__})"
    if probe.returncode != 0:
        first = (probe.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0][:200]
        return f"no systemd user manager (systemd-run --user --scope: {first})"
    return None
