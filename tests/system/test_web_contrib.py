"""contrib/: the Grafana dashboard and the Prometheus alert rules name only metrics a running daemon
exports, and promtool accepts the rules (Debian's `prometheus` package, installed by .ci/run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from agent_procs import wait_until
from attest_support import short_dir
from daemon_support import ME
from watchdog import Watchdog

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "contrib" / "grafana" / "agent-watchdog.json"
RULES = REPO / "contrib" / "prometheus" / "alerts.yml"
CLI = shutil.which("agent-watchdog", path=str(Path(sys.executable).parent)) or "agent-watchdog"
PROMTOOL = shutil.which("promtool")
METRIC = re.compile(r"\bagent_watchdog_[a-z_]*[a-z]\b")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def referenced() -> set[str]:
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in json.loads(DASHBOARD.read_text())["templating"]["list"] if "definition" in v]
    names = {m for e in exprs for m in METRIC.findall(e)}
    return names | set(METRIC.findall(RULES.read_text()))


def test_promtool_accepts_the_rules():
    assert PROMTOOL, "promtool (Debian's prometheus package) is not installed"
    res = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout and "10 rules found" in res.stdout


def test_each_alert_fires_on_its_series_and_not_before():
    """promtool's rule unit tests (tests/promtool/alerts_test.yml): not ticking, down, slow ticks, an open
    circuit, a dead letter, a budget near its end and one spent fire; a healthy daemon and a far budget do not."""
    assert PROMTOOL, "promtool (Debian's prometheus package) is not installed"
    res = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=REPO / "tests" / "promtool",
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_the_dashboard_covers_what_the_issue_asks():
    dash = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in dash["panels"]).lower()
    for wanted in ("stops by reason", "interventions", "circuit", "spend per scope", "budget remaining",
                   "tick duration", "alert deliveries", "dead letters"):
        assert wanted in titles, wanted
    assert {t["refId"] for p in dash["panels"] for t in p["targets"]} <= {"A", "B", "C", "D"}
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_every_metric_the_dashboard_and_rules_name_is_exported_by_a_running_daemon(tmp_path, sqlite_url, http,
                                                                                   monkeypatch):
    port = _free_port()
    folder = short_dir()
    cfg = tmp_path / "wd.toml"
    cfg.write_text(
        f'[store]\nurl = "{sqlite_url}"\n\n[metrics]\nlisten = "127.0.0.1:{port}"\n\n'
        f'[daemon]\ntick_s = 0.2\ncancel_grace_s = 0.5\nterm_grace_s = 0.5\nallowed_users = ["{ME}"]\n'
        f'key_file = "{folder / "attest.key"}"\nsocket = "{folder / "attest.sock"}"\n\n'
        f'[agents.spender]\nmax_cost_eur_per_day = 1.0\n\n[alerts]\nurls = ["{http.url()}"]\n')
    monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", str(folder / "attest.sock"))  # never the host's socket
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}
    log = tmp_path / "daemon.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen([CLI, "run", "--config", str(cfg)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    try:
        # A runaway the daemon stops (a stop, an alert delivered, tool calls and spend per scope).
        wd = Watchdog(sqlite_url)
        run = wd.run(agent="spender", guards=False, max_tool_calls=3).start()
        for i in range(5):
            run.record_tool("verify_iban", {"iban": f"IT{i}"}, ok=i != 2, error=None if i != 2 else "timeout")
            run.step(model="gpt-x", tokens_in=10, tokens_out=2, cost_eur=0.1)
        url = f"http://127.0.0.1:{port}/metrics"

        def scrape() -> str:
            try:
                return urllib.request.urlopen(url, timeout=10).read().decode()
            except OSError:
                return ""

        assert wait_until(lambda: 'agent_watchdog_interventions_total{reason="max_tool_calls"}' in scrape()
                          and http.received, 60), log.read_text()
        assert wait_until(lambda: 'agent_watchdog_period_spend_eur{period="day",scope="agent:spender"}' in scrape(),
                          60), scrape()
        body = scrape()
        wd.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    exported = set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            exported.add(line.split()[2])
        elif line and not line.startswith("#"):
            exported.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    # Counters are exported as NAME_total (their TYPE line names NAME_total too with prometheus_client).
    names = referenced()
    assert len(names) >= 15, names
    missing = sorted(n for n in names if n not in exported)
    assert not missing, f"named in contrib/ but not exported: {missing}"
    assert 'agent_watchdog_circuits{state="open"}' in body
    assert "agent_watchdog_last_tick_timestamp_seconds" in body and "agent_watchdog_tick_interval_seconds 0.2" in body
    assert 'agent_watchdog_alert_deliveries_total{outcome="delivered"}' in body
