"""The wheel ships the Alembic migrations, and a plain `pip install` works from any directory.

Slow-ish (builds a wheel, creates a fresh virtual environment and installs into
it: about 20-40 s here) but runs by default: it is the only test that proves a
non-editable install can migrate a store.
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from watchdog.store import access

REPO = Path(__file__).resolve().parents[2]
TABLES = {"runs", "events", "interventions", "alerts", "tool_circuits", "settings", "daemons"}

pytestmark = pytest.mark.slow


def clean_env() -> dict:
    # Nothing may leak the source tree or the test venv into the fresh install.
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(out)],
                           capture_output=True, text=True, timeout=180, env=clean_env())
    assert build.returncode == 0, build.stderr[-2000:]
    (found,) = out.glob("agent_watchdog_daemon-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv") / "v"
    made = subprocess.run([sys.executable, "-m", "venv", str(root)], capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert made.returncode == 0, made.stderr
    assert "include-system-site-packages = false" in (root / "pyvenv.cfg").read_text()
    installed = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=300, env=clean_env(), cwd="/")
    assert installed.returncode == 0, installed.stderr[-2000:]
    return root


def test_the_wheel_contains_the_migrations_and_the_console_script(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    for required in ("watchdog/_migrations/env.py", "watchdog/_migrations/script.py.mako",
                     "watchdog/_migrations/versions/0001_initial.py", "watchdog/__init__.py", "watchdog/client.py",
                     "watchdog/store/access.py", "watchdog/sdk/client.py",
                     "watchdog/py.typed"):  # PEP 561: type checkers read the SDK's own annotations
        assert required in names, required
    assert not any(n.endswith(".pyc") or "__pycache__" in n for n in names)
    assert not any(n.startswith(("tests/", "migrations/")) for n in names)
    assert "agent-watchdog = watchdog.entry:main" in entry_points
    # Our own name: `agent-watchdog` on PyPI is an unrelated project.
    assert "\nName: agent-watchdog-daemon\n" in metadata
    assert "Requires-Python: >=3.11" in metadata
    for dep in ("psutil", "sqlalchemy", "alembic", "click", "apprise", "genai-prices"):
        assert f"requires-dist: {dep}" in metadata.lower(), dep
    assert "extra == 'postgres'" in metadata and "extra == 'test'" in metadata


def test_installed_wheel_upgrades_a_store_from_the_root_directory(venv, tmp_path):
    db = tmp_path / "x.db"
    script = venv / "bin" / "agent-watchdog"
    for _ in range(2):  # twice: idempotent
        result = subprocess.run([str(script), "db", "upgrade", "--db", f"sqlite:///{db}"], capture_output=True,
                                text=True, timeout=120, cwd="/", env=clean_env())
        assert result.returncode == 0, result.stderr
        assert f"revision {access.head()}" in result.stdout
    conn = sqlite3.connect(db)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(access.head(),)]
    finally:
        conn.close()
    assert TABLES <= names


def test_installed_package_uses_its_own_migrations_and_a_light_sdk(venv):
    code = (
        "import sys, watchdog, watchdog.client, watchdog.store.access as m\n"
        "print(watchdog.__file__)\n"
        "print(m.migrations_dir())\n"
        "print(','.join(sorted(x for x in sys.modules if x.split('.')[0] in ('psutil', 'apprise', 'apscheduler',\n"
        "                                                                   'genai_prices', 'pydantic'))))\n"
    )
    result = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120,
                            cwd="/", env=clean_env())
    assert result.returncode == 0, result.stderr
    package_file, migrations, heavy = (result.stdout.splitlines() + [""])[:3]
    assert package_file.startswith(str(venv)), package_file
    assert migrations.startswith(str(venv)) and migrations.endswith("_migrations"), migrations
    assert heavy == ""


def test_installed_version_comes_from_the_distribution(venv):
    # click reads the version from the distribution's metadata: a stale package_name fails here.
    result = subprocess.run([str(venv / "bin" / "agent-watchdog"), "--version"], capture_output=True, text=True,
                            timeout=60, cwd="/", env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "agent-watchdog, version 0.1.0"


def test_without_an_extra_every_message_names_it(venv, tmp_path):
    """The installed wheel has no extras: what needs psycopg or prometheus_client says which extra to add."""
    py, cli = str(venv / "bin" / "python"), str(venv / "bin" / "agent-watchdog")
    probe = subprocess.run([py, "-c", "import importlib.util as u; print(u.find_spec('psycopg'), "
                                      "u.find_spec('prometheus_client'))"], capture_output=True, text=True, timeout=60,
                           env=clean_env(), cwd="/")
    assert probe.stdout.split() == ["None", "None"], probe.stdout + probe.stderr
    pg = "postgresql://postgres@127.0.0.1:5432/whatever"
    postgres_hint = ("needs the `postgres` extra (psycopg 3): pip install 'agent-watchdog-daemon[postgres]', "
                     "or '.[postgres]' from a checkout")

    def run(*args):
        return subprocess.run(args, capture_output=True, text=True, timeout=120, env=clean_env(), cwd=tmp_path)

    res = run(cli, "--db", pg, "runs")
    assert res.returncode == 1 and res.stderr.strip() == (
        f"agent-watchdog: error: store URL 'postgresql+psycopg://postgres@127.0.0.1:5432/whatever' {postgres_hint}")
    sdk = run(py, "-c", f"from watchdog import Watchdog; Watchdog({pg!r})")
    assert sdk.returncode == 1 and sdk.stderr.strip().splitlines()[-1].endswith(postgres_hint), sdk.stderr
    assert "ModuleNotFoundError" not in sdk.stderr

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "{pg}"\n[metrics]\nlisten = "127.0.0.1:9464"\n')
    check = run(cli, "check-config", str(cfg))
    assert check.returncode == 2
    msg = check.stderr.strip()
    assert msg.startswith(f"agent-watchdog: error: {cfg}: store.url is a PostgreSQL URL: it {postgres_hint}; ")
    assert msg.endswith(f"{cfg}: metrics.listen needs the `metrics` extra (prometheus_client): "
                        "pip install 'agent-watchdog-daemon[metrics]', or '.[metrics]' from a checkout")

    db = f"sqlite:///{tmp_path / 'x.db'}"
    assert run(cli, "--db", db, "db", "upgrade").returncode == 0
    cfg.write_text('[metrics]\nlisten = "127.0.0.1:9464"\n')
    daemon = run(cli, "--config", str(cfg), "--db", db, "run", "--once")
    assert daemon.returncode == 2 and "metrics.listen needs the `metrics` extra" in daemon.stderr, daemon.stderr
    assert "Traceback" not in daemon.stderr and daemon.stderr.count("\n") == 1


def test_the_wheel_carries_the_unit_the_example_config_and_the_roles_script(wheel, venv, tmp_path):
    """Issue 19: an install by hand needs no checkout (`agent-watchdog files unit|config|roles`)."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    shipped = {"unit": REPO / "systemd" / "agent-watchdog.service", "config": REPO / "systemd" / "config.example.toml",
               "roles": REPO / "sql" / "postgres-roles.sql"}
    for name in ("agent-watchdog.service", "config.example.toml", "postgres-roles.sql"):
        assert f"watchdog/_shipped/{name}" in names
    cli = str(venv / "bin" / "agent-watchdog")
    for name, source in shipped.items():
        printed = subprocess.run([cli, "files", name], capture_output=True, text=True, timeout=60, env=clean_env(),
                                 cwd="/")
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout == source.read_text()
    done = subprocess.run([cli, "files", "config", "--install", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=clean_env(), cwd="/")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "config.example.toml").read_text() == shipped["config"].read_text()
    again = subprocess.run([cli, "files", "config", "--install", str(tmp_path)], capture_output=True, text=True,
                           timeout=60, env=clean_env(), cwd="/")
    assert again.returncode == 1 and "not overwritten" in again.stderr
