"""The dependency rule of the layout (core <- store <- sdk | daemon <- integrations | demo <- cli)
as import-linter contracts (pyproject.toml [tool.importlinter]), so the light SDK is a rule."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    return subprocess.run([exe, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_every_import_contract_is_kept():
    result = lint_imports()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 6 kept, 0 broken." in result.stdout
    assert "Only the store speaks SQL KEPT" in result.stdout


def test_a_forbidden_import_breaks_the_contract(tmp_path):
    # The contracts can fail: a copy of the package whose SDK imports the daemon is refused.
    copy = tmp_path / "src"
    shutil.copytree(REPO / "watchdog", copy / "watchdog", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    run_py = copy / "watchdog" / "sdk" / "run.py"
    run_py.write_text(run_py.read_text() + "\nfrom watchdog.daemon.stops import killer  # noqa\n")
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    result = subprocess.run([exe], cwd=copy, capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert result.returncode != 0
    assert "watchdog.sdk.run -> watchdog.daemon.stops.killer" in result.stdout


def test_sql_outside_the_store_breaks_the_contract(tmp_path):
    # The daemon, the CLI, the web view, the demo, the gateways, the integrations and the SDK call
    # store verbs: a copy of the package whose CLI, gateway or daemon speaks SQL itself is refused.
    copy = tmp_path / "src"
    shutil.copytree(REPO / "watchdog", copy / "watchdog", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    top_py = copy / "watchdog" / "cli" / "top.py"
    top_py.write_text(top_py.read_text() + "\nfrom sqlalchemy import select  # noqa\n")
    witness_py = copy / "watchdog" / "gateways" / "mcp" / "witness.py"
    witness_py.write_text(witness_py.read_text() + "\nfrom watchdog.store.schema import runs  # noqa\n")
    ticker_py = copy / "watchdog" / "daemon" / "tick" / "ticker.py"
    ticker_py.write_text(ticker_py.read_text() + "\nfrom sqlalchemy import update  # noqa\n")
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    result = subprocess.run([exe], cwd=copy, capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert result.returncode != 0
    assert "Only the store speaks SQL BROKEN" in result.stdout
    assert "watchdog.cli.top -> sqlalchemy" in result.stdout
    assert "watchdog.gateways.mcp.witness -> watchdog.store.schema" in result.stdout
    assert "watchdog.daemon.tick.ticker -> sqlalchemy" in result.stdout
