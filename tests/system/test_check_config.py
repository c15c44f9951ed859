"""`check-config` validates what `run` will use (issue 19, item 5): the urls_file read as the
daemon reads it, each URL loaded by apprise, never a URL printed unmasked, exit 0 / 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from attest_support import LocalUsers, foreign_python

EXE = str(Path(sys.executable).parent / "agent-watchdog")
SECRET = "s3cr3tT0ken"


def _check(*args, user=None, env=None):
    return subprocess.run([EXE, "check-config", *args] if user is None else args, capture_output=True, text=True,
                          timeout=60, env=env, user=user)


def _files(folder: Path, urls_file_lines: list[str], urls: list[str] = ()) -> Path:
    (folder / "alert-urls").write_text("# the credential\n" + "\n".join(urls_file_lines) + "\n")
    (folder / "alert-urls").chmod(0o600)
    listed = ", ".join(f'"{u}"' for u in urls)
    cfg = folder / "wd.toml"
    cfg.write_text(f'[alerts]\nurls = [{listed}]\nurls_file = "alert-urls"\n\n[agents.bot]\nmax_steps = 4\n')
    return cfg


def test_the_urls_file_is_read_loaded_by_apprise_and_never_printed_unmasked(tmp_path):
    cfg = _files(tmp_path, [f"json://user:{SECRET}@127.0.0.1:9/hook", f"jsons://bot:{SECRET}@example.org/other"],
                 urls=["json://127.0.0.1:8/hook"])
    ok = _check(str(cfg))
    assert ok.returncode == 0, ok.stderr
    assert "alerts 3 URL(s) (2 from urls_file)" in ok.stdout
    assert SECRET not in ok.stdout + ok.stderr
    assert "  [agents.bot] max_steps=4; the rest as [defaults]" in ok.stdout.splitlines()


def test_a_bad_urls_file_entry_and_an_unknown_scheme_exit_2_in_one_line(tmp_path):
    bad_file = _files(tmp_path, [f"slak://{SECRET}/x"])
    r = _check(str(bad_file))
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert "alerts.urls_file" in line and "line 1" in line and SECRET not in line
    other = tmp_path / "b"
    other.mkdir()
    unknown = _files(other, [], urls=[f"slak://{SECRET}/x"])
    r = _check(str(unknown))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "alerts.urls" in line and SECRET not in line


def test_a_user_who_cannot_read_the_urls_file_is_told_so():
    exe, env = foreign_python()
    users = LocalUsers()
    folder = Path(tempfile.mkdtemp(prefix="awcc-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        cfg = _files(folder, ["json://127.0.0.1:9/hook"])
        cfg.chmod(0o644)
        user = users.add("cc")
        r = _check(exe, "-m", "watchdog.cli", "check-config", str(cfg), user=user, env=env)
        assert r.returncode == 2, r.stdout + r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert f"this user ({user}) cannot read" in line and "run check-config as root" in line
    finally:
        users.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_urls_file_every_user_can_read_is_warned_about(tmp_path):
    cfg = _files(tmp_path, ["json://127.0.0.1:9/hook"])
    os.chmod(tmp_path / "alert-urls", 0o644)
    r = _check(str(cfg))
    assert r.returncode == 0 and "is readable by every user" in r.stdout
