"""exec's reaper keeps its promise (orphans never steal the command's status) and the daemon
writes cgroup.kill only when it may signal every process in the cgroup: real processes, a real
cgroup (the pure rules behind exec: tests/unit/test_exec_rules.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from exec_support import AGENT_WATCHDOG, exec_env


def test_orphans_reaped_around_the_commands_exit_never_steal_its_status(sqlite_url):
    # The command leaves 20 orphans that exit at about the moment it exits itself, again and again.
    script = textwrap.dedent("""
        import os, time
        for _ in range(20):
            if os.fork() == 0:
                if os.fork() == 0:
                    time.sleep(0.3)
                    os._exit(9)
                os._exit(8)
        time.sleep(0.3)
        os._exit(5)
    """)
    for _ in range(2):
        p = subprocess.run([AGENT_WATCHDOG, "--db", sqlite_url, "exec", "--agent", "a", "--", sys.executable, "-c",
                            script], env=exec_env(), capture_output=True, text=True, timeout=120)
        assert p.returncode == 5, p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a cgroup and a second user's process needs root")
def test_cgroup_kill_is_written_only_when_the_daemon_may_signal_every_process_in_it():
    import time

    from attest_support import LocalUsers
    from daemon_support import ME
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.stops.runtree import guarded_cgroup_kill
    from watchdog.gateways.exec import cgroup as cg

    users = LocalUsers()
    d = os.path.join(cg.mount_point(), f"agent-watchdog-run-{os.urandom(8).hex()}")
    os.mkdir(d)
    procs = []
    try:
        other = users.add("cgk")
        mine = subprocess.Popen(["sleep", "600"])
        theirs = subprocess.Popen(["sleep", "600"], user=other)
        procs += [mine, theirs]
        for p in procs:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(p.pid))
        killer = Killer(allowed_users=[ME])
        assert not guarded_cgroup_kill(killer, d)  # a process of a user outside allowed_users is in it
        time.sleep(0.2)
        assert mine.poll() is None and theirs.poll() is None
        theirs.kill()
        theirs.wait()
        assert guarded_cgroup_kill(killer, d)
        assert mine.wait(timeout=30) == -9
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for _ in range(100):
            try:
                os.rmdir(d)
                break
            except OSError:
                time.sleep(0.05)
        users.close()
