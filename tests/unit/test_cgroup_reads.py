"""The kernel's word on cgroups is read by one rule (hostile review, low): exec, which makes a
run's cgroup, and the daemon, which checks and kills it, read the cgroup2 mount, a process's
cgroup and a cgroup's processes through watchdog.core.cgroupfs, never a copy of their own that
could drift (a hybrid layout, an escaped mount path read one way by exec and another by the daemon)."""

from __future__ import annotations

import pathlib

from watchdog.core import cgroupfs
from watchdog.daemon.stops import runtree
from watchdog.gateways.exec import cgroup as exec_cgroup

PACKAGE = pathlib.Path(cgroupfs.__file__).parents[1]
# The reads as code spells them (a docstring or a message naming the file is no read).
READS = ('"/proc/self/mountinfo"', '/cgroup")', '"cgroup.procs")).split()')


def test_exec_and_the_daemon_read_cgroups_by_the_same_functions() -> None:
    assert runtree.mount_point is exec_cgroup.mount_point is cgroupfs.mount_point
    assert runtree.cgroup_pids is cgroupfs.cgroup_pids
    assert exec_cgroup.cgroup_of is cgroupfs.cgroup_of


def test_only_core_cgroupfs_reads_mountinfo_or_a_cgroup_file() -> None:
    readers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if any(s in p.read_text(encoding="utf-8") for s in READS))
    assert readers == ["core/cgroupfs.py"], readers


def test_a_cgroups_pids_are_read_from_it_and_its_sub_cgroups(tmp_path: pathlib.Path) -> None:
    (tmp_path / "cgroup.procs").write_text("10\n11\n")
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "cgroup.procs").write_text("12\n")
    (tmp_path / "gone").mkdir()  # a sub-cgroup removed between the walk and the read: skipped
    assert sorted(cgroupfs.cgroup_pids(str(tmp_path))) == [10, 11, 12]
    assert cgroupfs.cgroup_pids(None) == [] and cgroupfs.cgroup_pids("") == []
