"""The daemon's state directory does not keep files of stores long gone (issue 36).

Each store a daemon ever watched leaves four files in state_dir: its lease lock
(`store-<hash>.lock`) and its state file with SQLite's `-wal` and `-shm`. At start, the files
of another store are removed when none of them changed for `STALE_DAYS` and no daemon holds
that store's lock (taken here, non-blocking, for the removal: a daemon of that store that
starts meanwhile waits on nothing, it finds no lock file and makes a new one). A store seen
again after that starts with an empty state file: at worst one more SIGTERM (watchdog.daemon.trust.ownstage).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from collections import defaultdict

log = logging.getLogger("watchdog.daemon")

STALE_DAYS = 30.0
_NAME = re.compile(r"^store-([0-9a-f]{16})\.(lock|state|state-wal|state-shm)$")


def prune(state_dir: str, own_lock: str, *, now_s: float | None = None, stale_days: float = STALE_DAYS) -> list[str]:
    """Remove the files of stores other than the one of `own_lock` untouched for `stale_days`;
    the store keys removed. Never raises: a file it cannot judge or remove stays."""
    now_s = time.time() if now_s is None else now_s
    try:
        names = os.listdir(state_dir)
    except OSError:
        return []
    own = _NAME.match(os.path.basename(own_lock))
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        m = _NAME.match(name)
        if m and not (own and m.group(1) == own.group(1)):
            groups[m.group(1)].append(os.path.join(state_dir, name))
    removed = []
    for key, paths in sorted(groups.items()):
        try:
            newest = max(os.lstat(p).st_mtime for p in paths)
        except OSError:
            continue
        if now_s - newest < stale_days * 86400 or not _remove_unlocked(state_dir, key, paths):
            continue
        removed.append(key)
    if removed:
        log.info("removed the state files of %d store(s) no daemon watched for %g days (%s)", len(removed),
                 stale_days, ", ".join(removed))
    return removed


def _remove_unlocked(state_dir: str, key: str, paths: list[str]) -> bool:
    lock = os.path.join(state_dir, f"store-{key}.lock")
    fd = None
    try:
        if os.path.exists(lock):
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: that store has a live daemon
        for p in sorted(paths, key=lambda p: p == lock):  # the lock last: held while the rest goes
            os.unlink(p)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
