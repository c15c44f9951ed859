"""The smaller operator-facing fixes of issue 19 (item 8): runs filters, alerts history and
wording, prune confirmation, a closed pipe."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

from watchdog import RunKilled, Watchdog
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.alerts.outbox import deliver_due
from watchdog.store.alerts import enqueue_alert

EXE = str(Path(sys.executable).parent / "agent-watchdog")


def cli(db_url, *args, input=None, stdin=None):
    return subprocess.run([EXE, "--db", db_url, *args], capture_output=True, text=True, timeout=60, input=input,
                          stdin=stdin, env={k: v for k, v in __import__("os").environ.items()
                                            if not k.startswith("AGENT_WATCHDOG_")})


def _runs(db_url):
    wd = Watchdog(db_url)
    with wd.run(agent="alpha", kill_mode="cooperative", labels={"team": "red"}) as r:
        r.step(cost_eur=0.0)
    try:
        with wd.run(agent="beta", kill_mode="cooperative", labels={"team": "blue"}, max_steps=1) as r:
            r.step(cost_eur=0.0)
            r.step(cost_eur=0.0)
    except RunKilled:
        pass
    wd.close()


def test_runs_filters_by_agent_status_and_label(db_url, engine):
    _runs(db_url)
    by_agent = json.loads(cli(db_url, "runs", "--all", "--agent", "alpha", "--json").stdout)
    assert [r["agent"] for r in by_agent] == ["alpha"]
    killed = json.loads(cli(db_url, "runs", "--status", "killed", "--json").stdout)  # an ended status: no --all
    assert [(r["agent"], r["status"]) for r in killed] == [("beta", "killed")]
    red = json.loads(cli(db_url, "runs", "--all", "--label", "team=red", "--json").stdout)
    assert [r["agent"] for r in red] == ["alpha"]
    none = json.loads(cli(db_url, "runs", "--all", "--label", "team=red", "--agent", "beta", "--json").stdout)
    assert none == []
    table = cli(db_url, "runs", "--all").stdout
    assert " DURATION " in table.splitlines()[0] and " AGE " not in table.splitlines()[0]


def test_alerts_all_lists_the_history_with_each_targets_delivery_time(db_url, engine, sealer, http):
    t0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    with engine.begin() as conn:
        enqueue_alert(conn, "stop:x", "agent-watchdog: stopped bot run x — manual", "b", now=t0, sealer=sealer)
    notifier = Notifier([http.url()])
    deliver_due(engine, notifier, t0 + dt.timedelta(seconds=2), sealer=sealer)
    out = cli(db_url, "alerts", "--all")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "delivered" in lines[1] and "stopped bot run x" in lines[1]
    assert lines[2].strip() == f"→ target {notifier.targets[0].id}: 2026-01-01 12:00:02"
    listed = json.loads(cli(db_url, "alerts", "--all", "--json").stdout)
    assert listed[0]["targets"] == {notifier.targets[0].id: "2026-01-01T12:00:02+00:00"}
    waiting = cli(db_url, "alerts")  # nothing waiting, and no [alerts] urls in this (empty) config
    assert waiting.stdout.strip() == ("no alert is waiting, but no [alerts] urls are configured: alerts are only "
                                      "logged by the daemon")


def test_db_prune_of_young_runs_asks_and_refuses_without_a_terminal(db_url, engine):
    _runs(db_url)
    refused = cli(db_url, "db", "prune", "--older-than", "0d", stdin=subprocess.DEVNULL)
    assert refused.returncode == 1
    assert "younger than a day" in refused.stderr and "--yes" in refused.stderr
    assert len(json.loads(cli(db_url, "runs", "--all", "--json").stdout)) == 2  # nothing deleted
    done = cli(db_url, "db", "prune", "--older-than", "0d", "--yes")
    assert done.returncode == 0, done.stderr
    assert json.loads(cli(db_url, "runs", "--all", "--json").stdout) == []


def test_a_closed_pipe_ends_a_listing_quietly(db_url, engine):
    _runs(db_url)
    p = subprocess.run(f"{EXE} --db '{db_url}' runs --all | head -1", shell=True, capture_output=True, text=True,
                       timeout=60)
    assert "BrokenPipe" not in p.stderr and "Traceback" not in p.stderr
    assert p.stdout.startswith("RUN ")


def test_top_with_no_active_run_forecasts_no_run_out_date():
    from watchdog.cli.top import frame
    from watchdog.core.periods import DAY, PeriodState, Scope

    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    state = PeriodState(Scope("agent:bot", "bot", "agent"), DAY, "2026-01-01", now.replace(hour=0),
                        now.replace(hour=23, minute=59), 10.0, 50.0, 0.8, rate_eur_per_min=0.02,
                        runs_out_at=now.replace(hour=20))
    idle = frame([], now, periods=[state])
    assert "no active runs" in idle and "runs out" not in idle
    assert "bot's daily budget lasts the day (10.00/50.00 EUR)" in idle


def test_the_no_price_alert_speaks_to_every_integration():
    from watchdog.core.money_alerts import unpriced_alert

    title, body = unpriced_alert("(none)", ["support-bot"], 1200, 3, no_model=True)
    assert "run.step()" not in title
    assert "LangChain" in body and "run.step(model=" in body


def test_help_summaries_are_whole_and_completion_works(tmp_path):
    """issue 36: `--help` cut each summary with "..."; shell completion was undocumented. The
    completion line of docs/reference/cli.md, sourced in a real bash, completes a command."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    for args in ([], ["db"], ["circuits"]):
        out = subprocess.run([EXE, *args, "--help"], capture_output=True, text=True, timeout=60, env=env).stdout
        import re

        commands = out.split("Commands:", 1)[1]
        assert not re.search(r"[\w,.]\.\.\.$", commands, re.M), out  # click's cut ends "word..."
        assert args or "which daemons watch the store: last tick, leader, lease," in out.lower(), out
    script = (f'eval "$(_AGENT_WATCHDOG_COMPLETE=bash_source {EXE})"\n'
              f'COMP_WORDS=({EXE} sta); COMP_CWORD=1; _agent_watchdog_completion {EXE}\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.split() == ["status"], (done.stdout, done.stderr)
