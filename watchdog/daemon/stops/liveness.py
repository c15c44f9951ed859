"""Which watched processes ended, without scanning the process table (issue 25).

Today the tick reads psutil.pids() and, for a run that has been quiet, /proc of its process,
every tick: O(active runs). Here each local run's process is held by a pidfd (Linux >= 5.3,
`os.pidfd_open`), all of them in one epoll: a process's end makes its pidfd readable, so
`dead()` costs O(processes that ended), and the daemon's loop can sleep on `fileno()` to be
woken by an end instead of polling for it.

Pid reuse. A pid names a process only together with its create time (watchdog.core.procid,
the killer's ProcessIdentity). `watch` checks the identity with the killer's own test
(`Killer.alive`: create time within its tolerance, not a zombie) *after* opening the pidfd:
the pidfd pins whichever process held the pid when it was opened, and if that was already a
newcomer its create time differs, so the watch reports the run's process as gone. Once the
check passes, the pidfd is that process's for good: a later reuse of the pid cannot fool it.

Fallback. Where pidfds are unavailable (no os.pidfd_open, ENOSYS, or no file descriptor left
even after raising the soft limit), a process is watched by polling: `dead()` checks its
identity each call, O(processes watched that way) — what the tick pays for all of them today.

Reserve. Pidfds must not take the daemon's last descriptors (database sockets, SQLite and log
files, alert connections, psutil's reads of /proc would fail with EMFILE), so at most the soft
limit less `fd_reserve` are held, counted by us; past that, after raising the limit, polling.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import select
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from watchdog.core.procid import ProcessIdentity
from watchdog.daemon.stops.killer import Killer

log = logging.getLogger("watchdog.liveness")

# Descriptors (not bytes) of RLIMIT_NOFILE's soft limit that pidfds leave to the rest of the
# daemon: a few pools of sockets, SQLite files, logs, alert connections, with room to spare.
FD_RESERVE = 256

Alive = Callable[[Iterable[ProcessIdentity]], list[ProcessIdentity]]


@dataclass(frozen=True, slots=True)
class _Watch:
    ident: ProcessIdentity
    fd: int | None  # None: watched by polling


class Liveness:
    """The processes of this host's active runs, one per run id. Not thread-safe."""

    def __init__(self, killer: Killer | None = None, *, use_pidfd: bool = True, alive: Alive | None = None,
                 fd_reserve: int = FD_RESERVE):
        self.killer = killer or Killer()
        self.host = self.killer.host
        self._alive: Alive = alive or self.killer.alive  # the killer's identity test: one rule
        self._pidfd_open: Callable[[int], int] | None = getattr(os, "pidfd_open", None) if use_pidfd else None
        self._epoll: select.epoll | None = select.epoll() if self._pidfd_open is not None else None
        self._fd_reserve = max(0, fd_reserve)
        self._budget = _pidfd_budget(self._fd_reserve)  # pidfds we may hold; re-read only when we raise the limit
        self._watches: dict[str, _Watch] = {}
        self._by_fd: dict[int, str] = {}
        self._polled: set[str] = set()  # run ids watched without a pidfd
        self._ended: list[str] = []  # found gone by `watch` itself, reported by the next `dead`

    # -- what the tick calls --------------------------------------------------------------

    @property
    def uses_pidfd(self) -> bool:
        return self._epoll is not None

    def fileno(self) -> int | None:
        """The epoll's descriptor, readable when a watched process ended (None: polling only)."""
        return self._epoll.fileno() if self._epoll is not None else None

    def __len__(self) -> int:
        return len(self._watches)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._watches

    def polled(self) -> int:
        """How many processes are watched by polling (no pidfd for them)."""
        return len(self._polled)

    def pidfds(self) -> int:
        """How many pidfds are held (never more than the soft limit minus the reserve)."""
        return len(self._by_fd)

    def watch(self, run_id: str, pid: int, create_time: float) -> bool:
        """Watch the run's process (pid + create time). False when it is already gone (or the
        pid is another process now): the run is then reported by the next `dead()`."""
        ident = ProcessIdentity(self.host, pid, create_time)
        old = self._watches.get(run_id)
        if old is not None:
            if old.ident == ident:
                return True
            self.unwatch(run_id)
        fd = self._open(pid)
        if fd == -1 or not self._alive([ident]):  # checked after the pidfd pins the pid's holder
            if fd is not None and fd >= 0:
                os.close(fd)
            self._ended.append(run_id)
            return False
        if fd is not None:
            assert self._epoll is not None
            try:
                self._epoll.register(fd, select.EPOLLIN)
            except OSError:  # no room in the epoll (ENOMEM, ENOSPC): watched by polling instead
                os.close(fd)
                fd = None
            else:
                self._by_fd[fd] = run_id
        self._watches[run_id] = _Watch(ident, fd)
        if fd is None:
            self._polled.add(run_id)
        return True

    def unwatch(self, run_id: str) -> None:
        """Stop watching (the run ended, or moved to another host). Unknown runs are fine."""
        w = self._watches.pop(run_id, None)
        if w is None:
            return
        self._polled.discard(run_id)
        if w.fd is not None:
            self._by_fd.pop(w.fd, None)
            if self._epoll is not None:
                try:
                    self._epoll.unregister(w.fd)
                except OSError:
                    pass
            os.close(w.fd)

    def keep(self, run_ids: Collection[str]) -> None:
        """Stop watching every run not in `run_ids` (they ended, or left this daemon)."""
        for rid in [r for r in self._watches if r not in run_ids]:
            self.unwatch(rid)
        self._ended = [r for r in self._ended if r in run_ids]

    def dead(self, timeout_s: float = 0.0) -> list[str]:
        """The runs whose process ended since the last call, each once (no longer watched).
        Waits up to `timeout_s` for an end when none is known yet (pidfds only)."""
        out, self._ended = self._ended, []
        if self._epoll is not None and self._by_fd:
            wait = 0.0 if (out or self._polled) else timeout_s
            for fd, _mask in self._epoll.poll(wait):
                rid = self._by_fd.get(fd)
                if rid is not None:
                    out.append(rid)
                    self.unwatch(rid)
        if self._polled:
            idents = {self._watches[r].ident: r for r in self._polled}
            living = set(self._alive(list(idents)))
            for ident, rid in idents.items():
                if ident not in living:
                    out.append(rid)
                    self.unwatch(rid)
        return out

    def close(self) -> None:
        for rid in list(self._watches):
            self.unwatch(rid)
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None

    def __del__(self) -> None:
        # A Ticker dropped without closing its watches (tools, tests) must not leak its pidfds.
        try:
            self.close()
        except Exception:  # noqa: BLE001 — at interpreter exit os or select may be gone already
            pass

    def __enter__(self) -> Liveness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pidfds -----------------------------------------------------------------------------

    def _open(self, pid: int) -> int | None:
        """A pidfd for pid; None to poll it instead; -1 when there is no such process."""
        if self._pidfd_open is None or pid <= 0:
            return None if pid > 0 else -1
        if len(self._by_fd) >= self._budget and not (self._raise_limit() and len(self._by_fd) < self._budget):
            if not self._polled:
                log.warning("%d pidfds held, the soft limit of open files less %d kept for the daemon: "
                            "polling further processes instead", len(self._by_fd), self._fd_reserve)
            return None
        for attempt in (0, 1):
            try:
                return self._pidfd_open(pid)
            except ProcessLookupError:
                return -1
            except OSError as e:
                if e.errno == errno.EMFILE and attempt == 0 and self._raise_limit():
                    continue
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOSYS, errno.EPERM, errno.EINVAL):
                    if not self._polled:
                        log.warning("no pidfd for pid %d (%s): polling such processes instead", pid, e.strerror)
                    return None
                raise
        return None

    def _raise_limit(self) -> bool:
        """Raise the soft limit of open files, and the budget with it; True if it went up."""
        if raised := _raise_fd_limit():
            self._budget = _pidfd_budget(self._fd_reserve)
        return raised


def _pidfd_budget(reserve: int) -> int:
    """How many pidfds fit under the soft limit of open files, `reserve` descriptors kept."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 62  # no limit to keep a reserve under (the kernel's nr_open still applies)
    return max(0, soft - reserve)


def _raise_fd_limit() -> bool:
    """Raise the soft limit of open files towards the hard one (10,000 runs = 10,000 pidfds);
    True if it went up."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft * 4, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return False
    return True
