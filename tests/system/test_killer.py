"""The killer against real child processes and real signals.

Nothing here is mocked. To prove a signal was NOT sent without relying on
timing, the "bystander" children block SIGTERM: a blocked signal stays
pending in /proc/<pid>/status, and kill(2)/pidfd_send_signal(2) queue it
before returning, so reading the pending mask right after the call is exact.
"""
from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from watchdog.daemon.stops.killer import Killer, ProcessIdentity, SignalOutcome, default_allowed_users, uid_min

WAIT_S = 10.0  # generous: a loaded 2-core box can be slow to start Pythons
POLL_S = 0.02
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
ME = pwd.getpwuid(os.geteuid()).pw_name  # named explicitly: root is never a default
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starting a child as user nobody needs root")

# A process that announces itself (depth and pid) in a file once its signal
# setup is done, optionally spawns a child of depth-1 running the same code,
# then sleeps. Options: "ignore-all", "ignore-leaf" (only depth 0 ignores
# SIGTERM), "orphan" (depth 1 exits after spawning, orphaning depth 0),
# "nobody-leaf" (depth 0 is `sleep` run as user nobody).
NODE = r"""
import os, signal, subprocess, sys, time
path, depth, opt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if opt == "ignore-all" or (opt == "ignore-leaf" and depth == 0):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if depth == 1 and opt == "nobody-leaf":
    leaf = subprocess.Popen(["sleep", "600"], user="nobody")
    with open(path, "a") as f:
        f.write(f"0 {leaf.pid}\n")
elif depth:
    subprocess.Popen([sys.executable, "-c", os.environ["KILLER_TEST_NODE"], path, str(depth - 1), opt])
with open(path, "a") as f:
    f.write(f"{depth} {os.getpid()}\n")
if depth == 1 and opt == "orphan":
    sys.exit(0)
time.sleep(600)
"""


def wait_until(pred, timeout_s: float = WAIT_S, poll_s: float = POLL_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(poll_s)
    return bool(pred())


def pending(pid: int) -> int:
    """Pending-signal bitmask (thread + process-wide) of pid."""
    mask = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            mask |= int(line.split()[1], 16)
    return mask


def sigterm_pending(pid: int) -> bool:
    return bool(pending(pid) & (1 << (signal.SIGTERM - 1)))


def _block_sigterm():  # preexec_fn: the blocked mask survives exec
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


class Spawner:
    """Starts children and guarantees they are gone after the test."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.popens: list[subprocess.Popen] = []
        self.others: list[psutil.Process] = []  # grandchildren, by identity

    def popen(self, argv, **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, **kw)
        self.popens.append(p)
        return p

    def sleeper(self, *, block_term=False, ignore_term=False, **kw) -> subprocess.Popen:
        code = "import signal, time\n"
        if ignore_term:
            code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        code += "print('ready', flush=True)\ntime.sleep(600)\n"
        p = self.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                       preexec_fn=_block_sigterm if block_term else None, **kw)
        assert p.stdout.readline() == "ready\n"  # signal setup is done
        return p

    def tree(self, depth: int, opt: str = "none", **kw) -> dict[int, int]:
        """Start a chain of depth+1 NODE processes; return {depth: pid}."""
        path = self.tmp / f"tree-{len(self.popens)}"
        env = dict(os.environ, KILLER_TEST_NODE=NODE)
        self.popen([sys.executable, "-c", NODE, str(path), str(depth), opt], env=env, **kw)

        def announced():
            return path.exists() and len(path.read_text().splitlines()) == depth + 1

        assert wait_until(announced), "tree did not start"
        pids = dict(map(int, line.split()) for line in path.read_text().splitlines())
        for d, pid in pids.items():
            if d != depth:
                try:
                    self.others.append(psutil.Process(pid))
                except psutil.NoSuchProcess:
                    pass
        return pids

    def cleanup(self):
        for proc in self.others:
            try:
                proc.kill()  # psutil refuses if the pid was recycled
            except psutil.Error:
                pass
        for p in self.popens:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=WAIT_S)


@pytest.fixture
def spawn(tmp_path):
    s = Spawner(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


@pytest.fixture
def killer():
    return Killer(allowed_users=[ME])


def ident(k: Killer, pid: int) -> ProcessIdentity:
    i = k.identity(pid)
    assert i is not None, f"pid {pid} is gone"
    return i


def orphaned(pid: int, old_parent: int) -> bool:
    # The middle process exited (the leader never reaps it, so it lingers
    # as a zombie child of the leader) and its child was reparented.
    return psutil.Process(pid).ppid() != old_parent


def gone(k: Killer, *idents: ProcessIdentity) -> bool:
    return not k.alive(idents)


# --- basics ---------------------------------------------------------------

def test_identity_json_round_trip(killer):
    i = ident(killer, os.getpid())
    assert ProcessIdentity.from_json(i.to_json()) == i
    assert set(i.to_json()) == {"host", "pid", "create_time"}


def test_bad_mode_raises_value_error_naming_mode(killer, spawn):
    p = spawn.sleeper()
    with pytest.raises(ValueError, match="mode"):
        killer.terminate(ident(killer, p.pid), "group")
    with pytest.raises(ValueError, match="mode"):
        killer.kill(ident(killer, p.pid), "")
    assert p.poll() is None


def test_summary_is_one_line():
    i = ProcessIdentity("h", 4242, 1.0)
    c = [ProcessIdentity("h", n, 1.0) for n in (1, 2)]
    out = SignalOutcome("SIGTERM", (i, *c), (), None, (), i)
    assert out.summary() == "SIGTERM sent to pid 4242 and 2 children"
    out = SignalOutcome("SIGKILL", (), (4242,), "process gone", (), i)
    assert out.summary() == "SIGKILL not sent to pid 4242 (process gone)"


# --- signalling -------------------------------------------------------------

def test_sigterm_stops_a_normal_child(killer, spawn):
    p = spawn.sleeper()
    i = ident(killer, p.pid)
    out = killer.terminate(i, "process")
    assert out.signal_name == "SIGTERM"
    assert out.refused is None and out.targets == (i,)
    assert p.wait(timeout=WAIT_S) == -signal.SIGTERM
    assert killer.alive([i]) == []
    again = killer.kill(i, "process", out.targets)  # late escalation is harmless
    assert again.targets == () and p.pid in again.already_gone


def test_sigterm_ignoring_child_survives_terminate_and_dies_from_kill(killer, spawn):
    p = spawn.sleeper(ignore_term=True)
    i = ident(killer, p.pid)
    out = killer.terminate(i, "process")
    assert out.targets == (i,)
    assert p.poll() is None and killer.alive([i]) == [i]
    out = killer.kill(i, "process", out.targets)
    assert out.signal_name == "SIGKILL" and out.targets == (i,)
    assert p.wait(timeout=WAIT_S) == -signal.SIGKILL


def test_process_mode_kills_child_and_grandchild(killer, spawn):
    pids = spawn.tree(2)
    leader, child, grandchild = (ident(killer, pids[d]) for d in (2, 1, 0))
    out = killer.terminate(leader, "process")
    assert set(out.targets) == {leader, child, grandchild}
    assert out.summary() == f"SIGTERM sent to pid {leader.pid} and 2 children"
    assert spawn.popens[0].wait(timeout=WAIT_S) == -signal.SIGTERM
    # Orphans are reaped lazily by init; alive() already counts zombies as gone.
    assert wait_until(lambda: gone(killer, child, grandchild))


def test_process_mode_kill_reaches_a_reparented_grandchild(killer, spawn):
    pids = spawn.tree(2, "ignore-leaf")
    leader, child, grandchild = (ident(killer, pids[d]) for d in (2, 1, 0))
    term = killer.terminate(leader, "process")
    assert set(term.targets) == {leader, child, grandchild}
    assert spawn.popens[0].wait(timeout=WAIT_S) == -signal.SIGTERM
    assert wait_until(lambda: gone(killer, child))
    # The survivor is no longer below the leader: only `targets` can find it.
    assert killer.alive([grandchild]) == [grandchild]
    assert psutil.Process(grandchild.pid).ppid() != child.pid
    out = killer.kill(leader, "process", term.targets)
    assert out.refused == "process gone" and leader.pid in out.already_gone
    assert out.targets == (grandchild,)
    assert wait_until(lambda: gone(killer, grandchild))


def test_tree_mode_kills_the_whole_process_group(killer, spawn):
    pids = spawn.tree(2, "orphan", start_new_session=True)
    leader, grandchild = ident(killer, pids[2]), ident(killer, pids[0])
    assert wait_until(lambda: orphaned(grandchild.pid, pids[1]))
    # The orphan left the leader's tree but stayed in its process group.
    assert grandchild.pid not in [c.pid for c in psutil.Process(leader.pid).children(recursive=True)]
    assert os.getpgid(grandchild.pid) == leader.pid
    out = killer.terminate(leader, "tree")
    assert set(out.targets) == {leader, grandchild}
    assert spawn.popens[0].wait(timeout=WAIT_S) == -signal.SIGTERM
    assert wait_until(lambda: gone(killer, grandchild))


def test_process_mode_leaves_group_members_outside_the_tree(killer, spawn):
    pids = spawn.tree(2, "orphan", start_new_session=True)
    leader, grandchild = ident(killer, pids[2]), ident(killer, pids[0])
    assert wait_until(lambda: orphaned(grandchild.pid, pids[1]))
    out = killer.terminate(leader, "process")
    assert out.targets == (leader,)
    assert spawn.popens[0].wait(timeout=WAIT_S) == -signal.SIGTERM
    assert killer.alive([grandchild]) == [grandchild]


# --- safety -----------------------------------------------------------------

def test_create_time_mismatch_is_not_signalled(killer, spawn):
    p = spawn.sleeper(block_term=True)
    real = ident(killer, p.pid)
    fake = ProcessIdentity(real.host, real.pid, real.create_time + 5)
    assert "create time" in killer.refusal(fake)
    assert killer.alive([fake]) == []
    out = killer.terminate(fake, "tree")
    assert "create time" in out.refused and out.targets == ()
    assert not sigterm_pending(p.pid)
    killer.terminate(real, "process")  # control: the probe does see a signal
    assert sigterm_pending(p.pid)


def test_refuses_other_host_pid1_self_and_parent(killer, spawn):
    p = spawn.sleeper(block_term=True)
    elsewhere = ProcessIdentity("elsewhere.example", p.pid, ident(killer, p.pid).create_time)
    assert killer.refusal(elsewhere) == "on another host (elsewhere.example)"
    assert killer.terminate(elsewhere, "process").refused == "on another host (elsewhere.example)"
    assert killer.kill(elsewhere, "tree").refused == "on another host (elsewhere.example)"
    assert not sigterm_pending(p.pid)
    for pid, reason in [(1, "pid 1"), (os.getpid(), "is the watchdog itself"),
                        (os.getppid(), "is the watchdog's parent")]:
        i = ident(killer, pid)
        assert killer.refusal(i) == reason
        for send in (killer.terminate, killer.kill):
            out = send(i, "tree")
            assert out.refused == reason and out.targets == ()


def test_tree_mode_skips_the_watchdog_inside_the_group(killer, spawn):
    # A daemon that shares its run's process group must not signal itself.
    p = spawn.sleeper(process_group=0)
    leader = ident(killer, p.pid)
    own_pgid = os.getpgid(0)
    os.setpgid(0, p.pid)
    try:
        out = killer.terminate(leader, "tree")
    finally:
        os.setpgid(0, 0 if own_pgid == os.getpid() else own_pgid)
    assert os.getpgid(0) == own_pgid
    assert out.targets == (leader,)
    assert out.skipped == ((os.getpid(), "is the watchdog itself"),)
    assert p.wait(timeout=WAIT_S) == -signal.SIGTERM


@needs_root
def test_other_users_process_is_refused_unless_allowed(spawn):
    blocked = spawn.popen(["sleep", "600"], user="nobody", preexec_fn=_block_sigterm)
    # Identity can only be taken once exec is done (uid switch precedes it).
    assert wait_until(lambda: psutil.Process(blocked.pid).name() == "sleep")
    k_root = Killer(allowed_users=["root"])
    i = ident(k_root, blocked.pid)
    assert k_root.refusal(i) == "user 'nobody' not in allowed_users ['root']"
    out = k_root.terminate(i, "process")
    assert out.refused.startswith("user 'nobody'") and out.targets == ()
    assert not sigterm_pending(blocked.pid)

    victim = spawn.popen(["sleep", "600"], user="nobody")
    assert wait_until(lambda: psutil.Process(victim.pid).name() == "sleep")
    k_nobody = Killer(allowed_users=["nobody"])
    out = k_nobody.terminate(ident(k_nobody, victim.pid), "process")
    assert out.refused is None
    assert victim.wait(timeout=WAIT_S) == -signal.SIGTERM


@needs_root
def test_root_is_signalled_only_when_named(spawn):
    # No allowed_users, the daemon running as root: nobody, root least of all.
    assert default_allowed_users() == frozenset()
    k = Killer()
    mine = spawn.sleeper(block_term=True)
    assert k.refusal(ident(k, mine.pid)) == "user 'root' not in allowed_users []"
    assert k.terminate(ident(k, mine.pid), "process").targets == ()
    assert not sigterm_pending(mine.pid)
    nobodys = spawn.popen(["sleep", "600"], user="nobody")
    assert wait_until(lambda: psutil.Process(nobodys.pid).name() == "sleep")
    assert k.refusal(ident(k, nobodys.pid)) == "user 'nobody' not in allowed_users []"
    # Named explicitly, root is allowed; nobody (a system account, uid < UID_MIN) still is not.
    named = Killer(allowed_users=["root"])
    assert named.refusal(ident(named, mine.pid)) is None
    assert named.refusal(ident(named, nobodys.pid)) == "user 'nobody' not in allowed_users ['root']"


def test_uid_min_comes_from_login_defs(tmp_path):
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t 2000\nUID_MAX 60000\n")
    assert uid_min(str(defs)) == 2000
    defs.write_text("UID_MAX 60000\n")
    assert uid_min(str(defs)) == 1000
    assert uid_min(str(tmp_path / "missing")) == 1000


def test_an_attested_uid_that_no_longer_matches_is_refused(killer, spawn):
    p = spawn.sleeper(block_term=True)
    real = ident(killer, p.pid)
    me = os.geteuid()
    assert killer.refusal(ProcessIdentity(real.host, real.pid, real.create_time, uid=me)) is None
    other = ProcessIdentity(real.host, real.pid, real.create_time, uid=me + 4242)
    assert killer.refusal(other) == f"runs as uid {me} (effective {me}), attested as uid {me + 4242}"
    assert killer.terminate(other, "process").targets == ()
    assert not sigterm_pending(p.pid)
    assert killer.alive([other]) == [other]  # it still runs: refused, not gone


@needs_root
def test_descendant_of_another_user_is_skipped(spawn):
    k = Killer(allowed_users=["root"])
    pids = spawn.tree(1, "nobody-leaf")
    leader = ident(k, pids[1])
    assert wait_until(lambda: psutil.Process(pids[0]).name() == "sleep")
    leaf = ident(k, pids[0])
    out = k.terminate(leader, "process")
    assert out.targets == (leader,)
    assert out.skipped == ((leaf.pid, "user 'nobody' not in allowed_users ['root']"),)
    assert spawn.popens[0].wait(timeout=WAIT_S) == -signal.SIGTERM
    assert k.alive([leaf]) == [leaf]


def test_zombie_counts_as_gone(killer, spawn):
    p = spawn.popen([sys.executable, "-c", "pass"])
    assert wait_until(lambda: psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE)
    i = ident(killer, p.pid)
    assert killer.refusal(i) == "zombie"
    assert killer.alive([i]) == []
    out = killer.terminate(i, "tree")
    assert out.refused == "zombie" and out.already_gone == (p.pid,) and out.targets == ()
    assert p.wait(timeout=WAIT_S) == 0
    assert killer.kill(i, "process", [i]).refused == "process gone"


# --- recycled pids ------------------------------------------------------------

def _write_ns_last_pid(value: int) -> None:
    NS_LAST_PID.write_text(str(value))


def _require_ns_last_pid():
    try:
        _write_ns_last_pid(int(NS_LAST_PID.read_text()))
    except OSError as e:
        pytest.skip(f"{NS_LAST_PID} is not writable ({e.strerror}); needs CAP_SYS_ADMIN")


def _spawn_with_pid(spawn: Spawner, pid: int, attempts: int = 100) -> subprocess.Popen:
    """A blocked-SIGTERM sleeper that gets exactly `pid` (now free)."""
    for _ in range(attempts):
        _write_ns_last_pid(pid - 1)
        p = spawn.sleeper(block_term=True)
        if p.pid == pid:
            return p
        p.kill()  # someone else on the box took the pid first: retry
        p.wait()
    pytest.fail(f"could not obtain pid {pid} in {attempts} attempts")


def test_recycled_pid_is_not_signalled(killer, spawn):
    _require_ns_last_pid()
    old = spawn.sleeper()
    old_ident = ident(killer, old.pid)
    old.kill()
    old.wait()
    new = _spawn_with_pid(spawn, old_ident.pid)
    assert killer.alive([old_ident]) == []
    out = killer.terminate(old_ident, "process")
    assert out.refused == "create time differs (pid recycled)" and out.targets == ()
    assert killer.kill(old_ident, "tree", [old_ident]).targets == ()
    assert new.poll() is None and not sigterm_pending(new.pid)


def test_pid_recycled_between_check_and_pidfd_open_is_caught(spawn):
    _require_ns_last_pid()
    k = Killer(allowed_users=[ME])
    old = spawn.sleeper()
    old_ident = ident(k, old.pid)
    newcomer: list[subprocess.Popen] = []

    def recycle_then_open(pid):
        # The run dies and a stranger takes its pid after refusal() passed.
        old.kill()
        old.wait()
        newcomer.append(_spawn_with_pid(spawn, pid))
        return os.pidfd_open(pid)

    k._pidfd_open = recycle_then_open
    out = k.terminate(old_ident, "process")
    assert out.refused == "create time differs (pid recycled)" and out.targets == ()
    assert newcomer[0].pid == old_ident.pid
    assert not sigterm_pending(newcomer[0].pid)


def test_os_kill_fallback_keeps_the_checks(spawn):
    k = Killer(allowed_users=[ME])

    def no_pidfd(pid):
        raise OSError(38, "Function not implemented")  # ENOSYS on old kernels

    k._pidfd_open = no_pidfd
    bystander = spawn.sleeper(block_term=True)
    real = ident(k, bystander.pid)
    fake = ProcessIdentity(real.host, real.pid, real.create_time + 5)
    assert "create time" in k.terminate(fake, "process").refused
    assert not sigterm_pending(bystander.pid)
    p = spawn.sleeper()
    assert k.terminate(ident(k, p.pid), "process").refused is None
    assert p.wait(timeout=WAIT_S) == -signal.SIGTERM
