"""The daemon's state directory forgets stores long gone (issue 36): real files, real flock."""

from __future__ import annotations

import fcntl
import os

from watchdog.daemon.process.statedir import prune

DAY_S = 86400.0


def _store(folder, key: str, age_days: float, now_s: float) -> list[str]:
    paths = [str(folder / f"store-{key}.{ext}") for ext in ("lock", "state", "state-wal", "state-shm")]
    for p in paths:
        open(p, "w").close()
        os.utime(p, (now_s - age_days * DAY_S, now_s - age_days * DAY_S))
    return paths


def test_only_the_files_of_other_stores_untouched_for_30_days_and_unlocked_go(tmp_path):
    now_s = 2_000_000_000.0
    own = _store(tmp_path, "a" * 16, 90, now_s)  # this daemon's store, however old
    gone = _store(tmp_path, "b" * 16, 31, now_s)
    recent = _store(tmp_path, "c" * 16, 29, now_s)
    held = _store(tmp_path, "d" * 16, 60, now_s)
    (tmp_path / "attest.key").write_text("k")
    fd = os.open(held[0], os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live daemon of that store, idle for 60 days
    try:
        assert prune(str(tmp_path), own[0], now_s=now_s) == ["b" * 16]
    finally:
        os.close(fd)
    assert not any(os.path.exists(p) for p in gone)
    assert all(os.path.exists(p) for p in own + recent + held) and (tmp_path / "attest.key").exists()
    assert prune(str(tmp_path / "missing"), own[0], now_s=now_s) == []
