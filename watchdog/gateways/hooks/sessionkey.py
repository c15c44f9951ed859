"""The hook's secret: what makes its session run ids unguessable (watchdog.core.sessions).

One key per Unix user, 32 random bytes in `$XDG_STATE_HOME/agent-watchdog/hook-session.key`
(default `~/.local/state/...`), made on first use: mode 0600 in a 0700 directory, both this
user's (checked: a file another user made or may read is refused, never used). Made atomically
(a private temporary file, then link(2), which fails if another hook call made it first: both
then read the same key). Stdlib only: the resident helper's client keys its socket by this path.
"""

from __future__ import annotations

import os
import stat
import tempfile

KEY_BYTES = 32
FILE_NAME = "hook-session.key"


def key_path(env: dict[str, str] | None = None) -> str:
    e = os.environ if env is None else env
    base = e.get("XDG_STATE_HOME") or os.path.join(e.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return os.path.join(os.path.abspath(base), "agent-watchdog", FILE_NAME)


class KeyFileError(OSError):
    """The key file is not this user's alone (one line: the path and the fix)."""


def _private(st: os.stat_result, want_dir: bool) -> bool:
    kind = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    return kind and st.st_uid == os.getuid() and (st.st_mode & 0o077) == 0


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not _private(st, want_dir=False):
            raise KeyFileError(f"{path} is not this user's alone (mode 0600, owner uid {os.getuid()}): "
                            "remove it; the hook makes a new one")
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise KeyFileError(f"{path} is not a {KEY_BYTES}-byte key: remove it; the hook makes a new one")
    return data


def load(path: str | None = None) -> bytes:
    """This user's key, made when missing; KeyFileError for a file or directory not this user's alone."""
    path = path or key_path()
    got = _read(path)
    if got is not None:
        return got
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if not _private(os.lstat(folder), want_dir=True):
        raise KeyFileError(f"{folder} is not this user's alone (a directory, mode 0700): fix its owner or mode")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".hook-key.")  # 0600, O_EXCL
    try:
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
        os.close(fd)
        try:
            os.link(tmp, path)  # fails if another call made it first: then its key is the key
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    got = _read(path)
    if got is None:  # pragma: no cover — removed between link and read
        raise KeyFileError(f"{path} vanished while it was made")
    return got
