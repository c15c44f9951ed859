"""Operations surfaces: metrics after a stop, sd_notify from the tick, top, postmortem, test-alert."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from alertsinks import HttpSink, closed_port
from watchdog import Watchdog
from daemon_support import config as daemon_config
from daemon_support import daemon_toml
from watchdog.core.config import parse
from watchdog.daemon.process.service import Daemon
from watchdog.daemon.process.metrics import start_metrics
from watchdog.store.engine import make_engine

CLI = shutil.which("agent-watchdog", path=str(Path(sys.executable).parent)) or "agent-watchdog"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runaway(url: str, steps: int = 5) -> str:
    """A cooperative run (never signalled: it lives in the test process) over its step budget."""
    wd = Watchdog(url)
    run = wd.run(agent="support-bot", guards=False, max_steps=3).start()
    for i in range(steps):
        run.tool_call("verify_iban", {"iban": f"IT{i}"}, lambda iban: "ok")
        run.step(model="m", tokens_in=10, tokens_out=2, cost_eur=0.01)
    wd.close()
    return run.id


def _stop_it(url: str, config, now=None):
    daemon = Daemon(make_engine(url), config)
    rep = daemon.once(now or dt.datetime.now(dt.timezone.utc))
    return daemon, rep


def test_metrics_endpoint_counts_the_stop(db_url):
    listen = f"127.0.0.1:{_free_port()}"
    metrics = start_metrics(listen)
    run_id = _runaway(db_url)
    config = daemon_config(metrics={"listen": listen})
    daemon = Daemon(make_engine(db_url), config, metrics=metrics)
    rep = daemon.once()
    assert rep.stops == [(run_id, "max_steps")]
    body = urllib.request.urlopen(f"http://{listen}/metrics", timeout=10).read().decode()
    assert 'agent_watchdog_interventions_total{reason="max_steps"} 1.0' in body
    assert 'agent_watchdog_active_runs{status="stopping"}' in body
    assert "agent_watchdog_tick_seconds_count 1.0" in body
    assert 'agent_watchdog_tool_calls_total{tool="verify_iban"} 5.0' in body
    assert run_id not in body  # never a run id as a label


def test_tick_pings_systemd_watchdog(sqlite_url, tmp_path, monkeypatch):
    path = f"/tmp/aw-notify-{os.getpid()}.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        _runaway(sqlite_url)
        _stop_it(sqlite_url, daemon_config())
        sock.settimeout(5)
        msg = sock.recv(4096).decode()
        assert "WATCHDOG=1" in msg.splitlines()
        assert "STATUS=active runs 1, stopping 0" in msg
    finally:
        sock.close()
        os.unlink(path)


def test_top_once_fits_80_columns(sqlite_url):
    _runaway(sqlite_url)
    out = subprocess.run([CLI, "--db", sqlite_url, "top", "--once"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "1 active" in lines[0]
    assert all(len(line) <= 80 for line in lines)
    assert "support-bo" in lines[2] and "5/3" in lines[2] and "verify_ib" in lines[2]


def test_postmortem_of_a_run_the_daemon_stopped(sqlite_url, tmp_path):
    run_id = _runaway(sqlite_url)
    _stop_it(sqlite_url, daemon_config())
    out_file = tmp_path / "pm.md"
    res = subprocess.run([CLI, "--db", sqlite_url, "postmortem", run_id[:8], "--output", str(out_file)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    text = out_file.read_text()
    for heading in ("## What happened", "## Impact", "## Probable cause", "## What worked and what did not",
                    "## Actions", "## Chaos test to add"):
        assert heading in text
    assert "stop_requested" in text and "max_steps" in text
    assert "Defense that acted: **daemon: cooperative stop**" in text
    assert "| same tool + same arguments repeated | no |" in text
    assert "| steps growing, no convergence | **yes** |" in text
    assert "top tool: verify_iban ×5 (100%), 0 errors" in text
    # The chaos test it proposes is valid Python on public names, and passes as printed (issue 19).
    case = text.split("## Chaos test to add", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "Status." not in case and "watchdog_daemon" not in case
    (tmp_path / "case").mkdir()
    (tmp_path / "case" / "test_case.py").write_text(case)
    env = dict(os.environ, PATH=f"{Path(CLI).parent}:{os.environ.get('PATH', '')}")
    env.pop("AGENT_WATCHDOG_DB", None)
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "case")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path / "case")
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_test_alert_reports_each_target(tmp_path):
    with HttpSink() as good:
        _held, port = closed_port()
        bad = f"json://127.0.0.1:{port}/hook"
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[alerts]\nurls = ["{good.url()}", "{bad}"]\n')
        res = subprocess.run([CLI, "--config", str(cfg), "test-alert"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 1
        lines = res.stdout.splitlines()
        assert len(lines) == 2
        assert lines[0].startswith("ok") and lines[1].startswith("FAILED")
        assert good.wait_for(1)
        assert "test alert" in json.dumps(good.received[0])
        cfg.write_text(f'[alerts]\nurls = ["{good.url()}"]\n')
        res = subprocess.run([CLI, "--config", str(cfg), "test-alert"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("args", [["show", "deadbeef"], ["postmortem", "deadbeef"], ["kill", "deadbeef"]])
def test_unknown_run_is_one_line(sqlite_url, args):
    res = subprocess.run([CLI, "--db", sqlite_url, *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip() == "agent-watchdog: error: run id 'deadbeef': no such run"


def test_run_refuses_an_unmigrated_store_in_one_line(tmp_path):
    db = tmp_path / "empty.db"
    sqlite3.connect(db).close()  # a SQLite file without tables
    url = f"sqlite:///{db}"
    cfg = tmp_path / "c.toml"
    cfg.write_text(daemon_toml())
    res = subprocess.run([CLI, "--db", url, "--config", str(cfg), "run", "--once"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        f"agent-watchdog: error: the store at {url} has no tables: run `agent-watchdog db upgrade --db {url}` first")


def test_run_waits_for_a_store_that_is_down_at_start_up(tmp_path):
    _held, port = closed_port()
    cfg = tmp_path / "c.toml"
    cfg.write_text(daemon_toml(tick_s=1))
    proc = subprocess.Popen([CLI, "--config", str(cfg), "--db", f"postgresql://postgres@127.0.0.1:{port}/x", "run"],
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stderr.readline() for _ in range(2)]  # two attempts: it retries, it does not exit
        assert all("store unreachable at start-up" in line for line in lines), lines
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
