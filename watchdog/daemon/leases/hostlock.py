"""The daemon's lease on this host: an exclusive `flock` on a file it owns in its state_dir.

One lock file per store (named from the store URL's hash, password left out). Only a
process that can open the file, i.e. the daemon's user, can hold the lock; no store
writer can take it, fake it, or make the daemon think it is gone. `flock` and not
`lockf`: POSIX record locks drop when the process closes *any* descriptor of the file
(e.g. a library opening it to read), an flock only with its own descriptor or the
process. The lock dies with the process, so a crashed daemon never blocks its restart.

The `daemons` row in the store is what others read (the CLI, daemons of other hosts),
never what this daemon obeys.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time

from watchdog.errors import ConfigError, StoreError
from watchdog.store.memory import StoreUrl, state_path


PID_WAIT_S = 2.0  # how long a refused daemon waits for the holder to write its pid into the lock file


class HostLockHeld(StoreError):
    """Another process of this host holds this store's lock: it is the daemon watching it."""

    def __init__(self, path: str, pid: int | None):
        self.path = path
        self.pid = pid
        who = f"another agent-watchdog daemon (pid {pid})" if pid else "another agent-watchdog daemon"
        super().__init__(f"{who} is already watching this store on this host (it holds {path}); this one exits")


class HostLock:
    def __init__(self, state_dir: str, url: StoreUrl) -> None:
        self.path = state_path(state_dir, url, "lock")
        self.state_dir = state_dir
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise HostLockHeld (the only proof that another daemon runs)."""
        if self._fd is not None:
            return
        try:
            os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
            _own_private(self.state_dir, os.lstat(self.state_dir), "[daemon] state_dir")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConfigError(f"[daemon] state_dir = {self.state_dir!r}: cannot open the lease lock "
                              f"{self.path} ({exc.strerror}); the daemon's user must own the directory") from None
        try:
            _own_private(self.path, os.fstat(fd), "the lease lock in [daemon] state_dir")
        except BaseException:
            os.close(fd)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # The holder writes its pid right after locking: give it a moment to (message only).
            deadline = time.monotonic() + PID_WAIT_S
            pid = _read_pid(fd)
            while pid is None and time.monotonic() < deadline:
                time.sleep(0.05)
                pid = _read_pid(fd)
            os.close(fd)
            raise HostLockHeld(self.path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)  # who holds it, for the message only
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # frees the lock


def _own_private(path: str, st: os.stat_result, what: str) -> None:
    """Refuse a state_dir or lock file another user owns or may write (issue 32, item 9).

    Whoever made the directory first could hold the lock file's flock; the daemon would then
    take it for a running daemon and exit 0, which Restart=on-failure does not restart: a
    squatter would switch the watchdog off. So the directory and the lock must be the
    daemon's own (its effective uid) and writable by nobody else; else one line, exit 2."""
    euid = os.geteuid()
    is_dir = what.startswith("[daemon]")
    kind_ok = stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)
    # flock(2) needs only a read-only descriptor: the lock file must be the daemon's alone (0600);
    # the directory may be traversable (systemd's StateDirectoryMode is 0755), never writable by others.
    others = (stat.S_IWGRP | stat.S_IWOTH) if is_dir else 0o077
    mode_fix = "go-w" if is_dir else "go-rwx"
    if kind_ok and st.st_uid == euid and not st.st_mode & others:
        return
    if not kind_ok:
        problem = "is not a directory" if is_dir else "is not a regular file"
    elif st.st_uid != euid:
        problem = f"is owned by uid {st.st_uid}, not by the daemon's user (uid {euid})"
    else:
        problem = f"may be {'written' if is_dir else 'opened'} by others (mode {stat.S_IMODE(st.st_mode):04o})"
    raise ConfigError(f"{what}: {path} {problem}; another user could hold the daemon's lock: remove it, or "
                      f"`chown {euid} {path} && chmod {mode_fix} {path}` (or point [daemon] state_dir at a private "
                      "directory)")


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
