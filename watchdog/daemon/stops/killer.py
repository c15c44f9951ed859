"""The killer: the only code in agent-watchdog that sends signals.

Every process is named by a full identity (host, pid, create time, and for an
attested leader its uid), never by a bare pid, and is re-verified while a
pidfd pins it, so a recycled pid, a process of a user outside allowed_users
(root and system accounts only when named there), the watchdog itself or init
are never signalled. Ordinary races (the process exited, was reaped, became a
zombie) are reported in the outcome, never raised.

Which identities it is handed is decided elsewhere: the ladder passes only a
leader the daemon attested (watchdog.daemon.stops.attest) and the targets it sealed;
for an exec'd run also the cgroup of its sealed attestation and the processes
the daemon remembered of its tree (watchdog.daemon.stops.runtree), each held to the
same checks.
"""
from __future__ import annotations

import errno
import os
import pwd
import signal
from dataclasses import dataclass
from typing import Iterable

import psutil

from watchdog.core import procid
# The identity, its tolerance and the reasons a process is gone live in watchdog.core.procid, below
# runtree (which the killer builds on); they are re-exported here, where the daemon imports them.
from watchdog.core.procid import (CREATE_TIME_TOLERANCE_S, GONE, GONE_REASONS, RECYCLED, ZOMBIE,
                                  ProcessIdentity as ProcessIdentity)  # re-exported: the killer's callers name it
from watchdog.daemon.stops.runtree import cgroup_members, guarded_cgroup_kill

MODES = ("process", "tree", "cgroup")
# EPERM from the kernel: the daemon lacks CAP_KILL, nothing about the run (the ladder retries).
PERMISSION_DENIED = "permission denied"


LOGIN_DEFS = "/etc/login.defs"
DEFAULT_UID_MIN = 1000


@dataclass(frozen=True)
class SignalOutcome:
    signal_name: str
    targets: tuple[ProcessIdentity, ...]
    already_gone: tuple[int, ...]
    refused: str | None
    skipped: tuple[tuple[int, str], ...]
    # The identity the call was about; lets summary() name it even when
    # nothing was sent to it.
    leader: ProcessIdentity | None = None

    def summary(self) -> str:
        pid = self.leader.pid if self.leader else "?"
        others = [t for t in self.targets if self.leader is None or t.pid != pid]
        n = len(others)
        if self.refused is None:
            text = f"{self.signal_name} sent to pid {pid}"
            if n:
                text += f" and {n} {'child' if n == 1 else 'children'}"
        else:
            text = f"{self.signal_name} not sent to pid {pid} ({self.refused})"
            if n:
                text += f"; sent to {n} other process{'' if n == 1 else 'es'}"
        gone_others = [p for p in self.already_gone if p != pid]
        if gone_others:
            text += f"; {len(gone_others)} already gone"
        if self.skipped:
            text += f"; {len(self.skipped)} skipped"
        return text


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)  # psutil's username() falls back the same way


def uid_min(path: str = LOGIN_DEFS) -> int:
    """The first uid of a regular user (login.defs UID_MIN; 1000 when unset)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "UID_MIN" and parts[1].isdigit():
                    return int(parts[1])
    except OSError:
        pass
    return DEFAULT_UID_MIN


def default_allowed_users() -> frozenset[str]:
    """With no allowed_users: the daemon's own user, unless it is root or a system
    account (those are signalled only when named explicitly): then nobody."""
    euid = os.geteuid()
    if euid == 0 or euid < uid_min():
        return frozenset()
    return frozenset({_user_name(euid)})


class Killer:
    def __init__(self, allowed_users: Iterable[str] | None = None, host: str | None = None):
        users = frozenset(u for u in (allowed_users or ()) if u)
        # Named users are taken as named (root included, if the operator wrote it).
        self.allowed_users = users or default_allowed_users()
        self.host = host or procid.hostname()
        # None where Python/the OS lacks pidfds; os.kill is the fallback.
        self._pidfd_open = getattr(os, "pidfd_open", None)

    def identity(self, pid: int) -> ProcessIdentity | None:
        """Identity of a local process as it runs now; None if it is gone."""
        try:
            return ProcessIdentity(self.host, pid, psutil.Process(pid).create_time())
        except (psutil.NoSuchProcess, ValueError):
            return None

    def _inspect(self, ident: ProcessIdentity) -> tuple[str, None] | tuple[None, tuple[int, int]]:
        """(why ident does not name a running local process, None) or (None, its real and effective uids)."""
        if ident.host != self.host:
            return f"on another host ({ident.host})", None
        if ident.pid <= 0:
            # kill(2) reads 0 and negative pids as process groups.
            return f"pid {ident.pid} is not a process", None
        try:
            proc = psutil.Process(ident.pid)
            with proc.oneshot():
                if abs(proc.create_time() - ident.create_time) > CREATE_TIME_TOLERANCE_S:
                    return RECYCLED, None
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return ZOMBIE, None
                uids = proc.uids()
                return None, (uids.real, uids.effective)
        except psutil.ZombieProcess:  # subclass of NoSuchProcess: test first
            return ZOMBIE, None
        except psutil.NoSuchProcess:
            return GONE, None
        except psutil.AccessDenied:
            return "access denied reading the process", None

    def refusal(self, ident: ProcessIdentity) -> str | None:
        if ident.host != self.host:
            return f"on another host ({ident.host})"
        if ident.pid == 1:
            return "pid 1"
        if ident.pid == os.getpid():
            return "is the watchdog itself"
        if ident.pid == os.getppid():
            return "is the watchdog's parent"
        inspected = self._inspect(ident)
        if inspected[0] is not None:
            return inspected[0]
        uids = inspected[1]
        if ident.uid is not None and uids != (ident.uid, ident.uid):
            return f"runs as uid {uids[0]} (effective {uids[1]}), attested as uid {ident.uid}"
        # Real and effective user both: a setuid program an agent started is not the agent's.
        for user in dict.fromkeys(_user_name(u) for u in uids):
            if user not in self.allowed_users:
                return f"user {user!r} not in allowed_users {sorted(self.allowed_users)!r}"
        return None

    def alive(self, idents: Iterable[ProcessIdentity]) -> list[ProcessIdentity]:
        return [i for i in idents if self._inspect(i)[0] is None]

    def _members(self, leader: ProcessIdentity, mode: str) -> list[ProcessIdentity]:
        """Descendants (plus group members in tree mode) of a verified leader."""
        found: list[ProcessIdentity] = []
        try:
            for child in psutil.Process(leader.pid).children(recursive=True):
                try:
                    found.append(ProcessIdentity(self.host, child.pid, child.create_time()))
                except psutil.NoSuchProcess:
                    pass
        except psutil.Error:
            pass
        if mode == "tree":
            found += self._group(leader.pid)
        # If the leader's pid was recycled while we looked, what we found
        # belongs to the newcomer: drop it all.
        if self._inspect(leader)[0] == RECYCLED:
            return []
        return found

    def _group(self, pgid: int) -> list[ProcessIdentity]:
        try:
            if os.getpgid(pgid) != pgid:
                return []  # the leader does not lead its own group
        except OSError:
            return []
        found: list[ProcessIdentity] = []
        for pid in psutil.pids():
            try:
                if os.getpgid(pid) == pgid:  # cheap filter first
                    # Identity, then group, then identity again: a pid
                    # recycled in between fails is_running().
                    proc = psutil.Process(pid)
                    if os.getpgid(pid) == pgid and proc.is_running():
                        found.append(ProcessIdentity(self.host, pid, proc.create_time()))
            except (OSError, psutil.Error):
                continue
        return found

    def _open_pidfd(self, pid: int) -> int | None:
        """A pidfd pinning pid, or None where there is none (use os.kill)."""
        if self._pidfd_open is None:
            return None
        try:
            fd: int = self._pidfd_open(pid)
            return fd
        except OSError as e:
            if e.errno == errno.ENOSYS:
                return None
            raise

    def _signal_one(self, ident: ProcessIdentity, sig: int) -> str | None:
        """Send sig to exactly the process ident names. None when sent,
        else the reason (a GONE_REASONS member when it no longer runs)."""
        reason = self.refusal(ident)
        if reason is not None:
            return reason
        try:
            fd = self._open_pidfd(ident.pid)
        except ProcessLookupError:
            return GONE
        except OSError as e:
            return f"pidfd_open failed ({e.strerror})"
        try:
            # The fd pins whichever process held the pid when it was opened.
            # If that was a newcomer (pid recycled after the check above),
            # its create time differs now; if it is ours, it cannot be
            # swapped any more: a dead pidfd target gives ESRCH, never a
            # stranger.
            reason = self.refusal(ident)
            if reason is not None:
                return reason
            if fd is None:
                os.kill(ident.pid, sig)
            else:
                signal.pidfd_send_signal(fd, sig)
            return None
        except ProcessLookupError:
            return GONE
        except PermissionError:
            return PERMISSION_DENIED
        finally:
            if fd is not None:
                os.close(fd)

    def _cgroup_members(self, cgroup_dir: str | None) -> list[ProcessIdentity]:
        """The processes of an exec'd run's cgroup (watchdog.daemon.stops.runtree), each still held to
        every check of _signal_one."""
        return cgroup_members(self, cgroup_dir)

    def _send(self, sig: signal.Signals, leader: ProcessIdentity, mode: str,
              extra: Iterable[ProcessIdentity], cgroup_dir: str | None = None) -> SignalOutcome:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got mode={mode!r}")
        # Enumerate before signalling: once the leader dies its children are
        # reparented and no longer show up as descendants. A leader that is
        # not ours (refused, recycled, gone) lends no authority over others;
        # a zombie still holds its pid, so its group is still its own.
        members = self._members(leader, mode) if self.refusal(leader) in (None, ZOMBIE) else []
        # An exec'd run's cgroup is its own authority (sealed in the attestation): its
        # processes are the run's whether exec still lives or not.
        members += self._cgroup_members(cgroup_dir if mode == "cgroup" else None)
        # The leader goes first so it cannot respawn what we stop after it.
        queue = [leader, *members, *extra]
        seen: set[int] = set()
        sent, gone, skipped = [], [], []
        leader_reason = None
        for ident in queue:
            if ident.pid in seen:
                continue
            seen.add(ident.pid)
            reason = self._signal_one(ident, sig)
            if ident is leader:
                leader_reason = reason
            if reason is None:
                sent.append(ident)
            elif reason in GONE_REASONS:
                gone.append(ident.pid)
            elif ident is not leader:
                skipped.append((ident.pid, reason))
        return SignalOutcome(sig.name, tuple(sent), tuple(gone), leader_reason,
                             tuple(skipped), leader)

    def terminate(self, ident: ProcessIdentity, mode: str, *, extra: Iterable[ProcessIdentity] = (),
                  cgroup_dir: str | None = None) -> SignalOutcome:
        """`extra`: processes attributed to the run's tree besides what is enumerated from
        `ident` (exec's orphans the daemon remembered); `cgroup_dir`: the run's own cgroup."""
        return self._send(signal.SIGTERM, ident, mode, list(extra), cgroup_dir)

    def kill(self, ident: ProcessIdentity, mode: str,
             targets: Iterable[ProcessIdentity] = (), *, cgroup_dir: str | None = None) -> SignalOutcome:
        # `targets` are what terminate() reached; survivors may have been
        # reparented away from the leader, so they are signalled directly.
        out = self._send(signal.SIGKILL, ident, mode, list(targets), cgroup_dir)
        if mode == "cgroup":
            guarded_cgroup_kill(self, cgroup_dir)  # forks during the kill too
        return out
