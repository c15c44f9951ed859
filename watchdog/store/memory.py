"""The daemon's own memory: a small SQLite file in its state directory that no store writer can touch.

What the daemon must remember and no writer may change lives here, never only in the
store (DESIGN.md, "Trust model"): when it first saw each run (the wall clock runs from
then at the latest), the ladder stages it reached, the alerts it delivered to each
target, the interventions and parent links it wrote itself. One file per store (named
from the store URL's hash, the password left out), mode 0600, in a directory only the
daemon's user can write.

Missing (a first start, a new state_dir) it is rebuilt from what the store can prove:
first sight is "now" (the run's own `started_at` counts when earlier), stages and
deliveries start empty (an alert delivered before is refused by its sealed age instead).
Without a usable directory (a Ticker driven by tests) it lives in memory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable

from sqlalchemy.engine import URL

log = logging.getLogger("watchdog.memory")

StoreUrl = str | URL  # a store URL as text or parsed (an engine's `url`)

DELIVERED_KEEP_S = 30 * 86400.0  # deliveries remembered this long (far past any alert_expire_s)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS first_seen (run_id TEXT PRIMARY KEY, at_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS stages (run_id TEXT NOT NULL, stage TEXT NOT NULL, at_s REAL NOT NULL,
                                   PRIMARY KEY (run_id, stage));
CREATE TABLE IF NOT EXISTS delivered (dedupe_key TEXT NOT NULL, target TEXT NOT NULL, at_s REAL NOT NULL,
                                      PRIMARY KEY (dedupe_key, target));
CREATE TABLE IF NOT EXISTS marks (kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT,
                                  PRIMARY KEY (kind, key));
"""


def store_key(url: StoreUrl) -> str:
    """A stable name for one store: the URL without its password, hashed (16 hex)."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url) if isinstance(url, str) else url
        if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
            u = u.set(database=os.path.realpath(u.database))  # one file, one name, however it is spelled
        text = u.render_as_string(hide_password=True)  # the password as "***": the same store, one name
    except Exception:  # noqa: BLE001 — any text names a store
        text = str(url)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def state_path(state_dir: str, url: StoreUrl, suffix: str) -> str:
    return os.path.join(state_dir, f"store-{store_key(url)}.{suffix}")


class Memory:
    """The daemon's state file; every method is one short transaction (thread-safe)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._sent = 0
        if path is None:
            self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self._db.executescript(_SCHEMA)
        else:
            try:
                self._db = self._open(path)
            except sqlite3.DatabaseError as exc:  # a corrupt file: set aside, rebuilt (never fatal)
                aside = f"{path}.corrupt-{int(time.time())}"
                log.warning("the daemon's state file %s is not readable (%s): moved to %s and rebuilt",
                            path, exc, aside)
                for suffix in ("", "-wal", "-shm"):
                    try:
                        os.replace(path + suffix, aside + suffix)
                    except FileNotFoundError:
                        pass
                self._db = self._open(path)
        self.first: dict[str, float] = dict(self._db.execute("SELECT run_id, at_s FROM first_seen"))

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask said
        finally:
            os.close(fd)
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=5.0)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            db.execute("SELECT count(*) FROM first_seen").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    @classmethod
    def for_daemon(cls, state_dir: str | None, url: StoreUrl) -> Memory:
        """The state file of this store in `state_dir`; in memory when the directory is not usable."""
        if state_dir and os.path.isdir(state_dir) and os.access(state_dir, os.W_OK):
            try:
                return cls(state_path(state_dir, url, "state"))
            except (OSError, sqlite3.Error) as exc:
                log.warning("state file in %s not usable (%s): the daemon's memory lasts this process only",
                            state_dir, exc)
        return cls(None)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- first sight -----------------------------------------------------------------

    def see(self, new: Iterable[tuple[str, float]], parents: Iterable[tuple[str, str]] = ()) -> None:
        """Remember the first sight of runs not seen before (kept first: INSERT OR IGNORE) and
        the parents they named then, in one transaction."""
        rows = [(rid, at) for rid, at in new if rid not in self.first]
        links = [("parent", rid, p) for rid, p in parents]
        if not rows and not links:
            return
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR IGNORE INTO first_seen VALUES (?, ?)", rows)
            self._db.executemany("INSERT OR REPLACE INTO marks VALUES (?, ?, ?)", links)
            self._db.execute("COMMIT")
        for rid, at in rows:
            self.first.setdefault(rid, at)

    def rebase_first(self, moved: Callable[[float], float]) -> int:
        """A clock jump: every first sight read off the old clock moves with the runs' own times
        (watchdog.store.run_rows), or a healthy run would look an hour old. Returns how many moved."""
        changed = [(new, rid) for rid, at in self.first.items() if (new := moved(at)) != at]
        if not changed:
            return 0
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("UPDATE first_seen SET at_s = ? WHERE run_id = ?", changed)
            self._db.execute("COMMIT")
        for new, rid in changed:
            self.first[rid] = new
        return len(changed)

    def forget(self, run_ids: Iterable[str]) -> None:
        """Runs no longer active: their first sight, stages and marks go."""
        ids = [(r,) for r in run_ids]
        if not ids:
            return
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("DELETE FROM first_seen WHERE run_id = ?", ids)
            self._db.executemany("DELETE FROM stages WHERE run_id = ?", ids)
            # marks are keyed by the run id, or "run id:resumes"
            self._db.executemany("DELETE FROM marks WHERE key = ?1 OR key LIKE ?1 || ':%'", ids)
            self._db.execute("COMMIT")
        for (rid,) in ids:
            self.first.pop(rid, None)

    # -- the ladder ----------------------------------------------------------------------

    def reached(self, run_id: str, stage: str, at_s: float) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO stages VALUES (?, ?, ?)", (run_id, stage, at_s))

    def stages(self, run_id: str) -> dict[str, float]:
        with self._lock:
            return dict(self._db.execute("SELECT stage, at_s FROM stages WHERE run_id = ?", (run_id,)))

    # -- deliveries --------------------------------------------------------------------------

    def delivered(self, dedupe_key: str, target: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM delivered WHERE dedupe_key = ? AND target = ?",
                                    (dedupe_key, target)).fetchone() is not None

    def deliver(self, dedupe_key: str, target: str) -> None:
        now_s = time.time()
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO delivered VALUES (?, ?, ?)", (dedupe_key, target, now_s))
            self._sent += 1
            if self._sent % 1000 == 0:  # an alert that old is expired (alert_expire_s) long before: refused anyway
                self._db.execute("DELETE FROM delivered WHERE at_s < ?", (now_s - DELIVERED_KEEP_S,))

    # -- marks: small facts the daemon wrote (its interventions, parent links, grants) ------

    def mark(self, kind: str, key: str, value: str = "") -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO marks VALUES (?, ?, ?)", (kind, key, value))

    def mark_many(self, kind: str, items: Iterable[tuple[str, str]]) -> None:
        rows = [(kind, k, v) for k, v in items]
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO marks VALUES (?, ?, ?)", rows)
            self._db.execute("COMMIT")

    def unmark(self, kind: str, key: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM marks WHERE kind = ? AND key = ?", (kind, key))

    def marked(self, kind: str, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM marks WHERE kind = ? AND key = ?", (kind, key)).fetchone()
        if row is None:
            return None
        (value,) = row
        return value
