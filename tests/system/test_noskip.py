"""Under CI=true a skip fails the run (tests/noskip.py); elsewhere it stays a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SAMPLE = '''
import pytest

def test_runs():
    assert 1 + 1 == 2

def test_skips():
    pytest.skip("systemd-analyze is not installed")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
'''

MODULE_SKIP = '''
import pytest
pytest.importorskip("no_such_module_for_noskip")

def test_never_collected():
    pass
'''


def _pytest(tmp_path: Path, ci: str | None, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(TESTS)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "noskip",
                           "-p", "no:xdist", "-p", "no:timeout", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


def test_a_skip_fails_under_ci(tmp_path):
    result = _pytest(tmp_path, "true", SAMPLE)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed, 1 xfailed" in result.stdout
    assert "skipped under CI=true, where every test must run: " in result.stdout
    assert "systemd-analyze is not installed" in result.stdout


def test_a_module_skip_fails_under_ci(tmp_path):
    result = _pytest(tmp_path, "true", MODULE_SKIP)
    assert result.returncode != 0, result.stdout
    assert "no_such_module_for_noskip" in result.stdout and "skipped under CI=true" in result.stdout


def test_a_skip_stays_a_skip_elsewhere(tmp_path):
    result = _pytest(tmp_path, None, SAMPLE)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 1 skipped, 1 xfailed" in result.stdout
