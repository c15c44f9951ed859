"""Issue 35: `[daemon] shards` misconfigured is one line at `agent-watchdog run`'s start naming the
key, exit 2: on a SQLite store (advisory locks are PostgreSQL's), and a number out of range."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon_support import daemon_toml

EXE = str(Path(sys.executable).parent / "agent-watchdog")


def _run(tmp_path: Path, shards: object, url: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "wd.toml"
    cfg.write_text(f'[store]\nurl = "{url}"\n\n{daemon_toml(tick_s=0.5, shards=shards)}')
    return subprocess.run([EXE, "run", "--once", "--config", str(cfg)], capture_output=True, text=True, timeout=60)


def test_shards_on_a_sqlite_store_is_refused_at_start_naming_the_key(sqlite_url, tmp_path):
    done = _run(tmp_path, 64, sqlite_url)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == ["agent-watchdog: error: [daemon] shards = 64: judging is sharded on a PostgreSQL store only "
                      "(advisory locks); this store is sqlite: remove the key"]


@pytest.mark.parametrize("shards", [0, -1, 2000, "64", True])
def test_shards_out_of_range_is_refused_naming_the_key(sqlite_url, tmp_path, shards):
    done = _run(tmp_path, shards, sqlite_url)
    assert done.returncode == 2, done.stderr
    assert "daemon.shards: expected a whole number of shards from 1 to 1024" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
