"""SIGHUP reloads the config (issue 19, item 4): a real daemon process, a real signal, real
agent processes that read the profile it publishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from agent_procs import wait_until
from daemon_support import ME
from attest_support import short_dir
from test_daemon import _holds_lease, daemon_procs  # noqa: F401 — the fixture

AGENT = textwrap.dedent("""
    import json, sys
    from watchdog import Watchdog
    wd = Watchdog(sys.argv[1])
    with wd.run(agent="bot", kill_mode="cooperative", guards=False) as run:
        print(json.dumps(run.effective_budgets()), flush=True)
""")


def _config(path, db_url, max_steps: int, tick_s: float = 0.2, extra: str = "") -> None:
    folder = short_dir()
    path.write_text(
        f'[store]\nurl = "{db_url}"\n\n[daemon]\ntick_s = {tick_s}\nallowed_users = ["{ME}"]\n'
        f'key_file = "{KEYS.setdefault(str(path), str(folder / "attest.key"))}"\n'
        f'socket = "{SOCKS.setdefault(str(path), str(folder / "attest.sock"))}"\n\n'
        f"[agents.bot]\nmax_steps = {max_steps}\n{extra}")


KEYS: dict[str, str] = {}
SOCKS: dict[str, str] = {}


def _budgets(db_url) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    p = subprocess.run([sys.executable, "-c", AGENT, db_url], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_sighup_applies_a_changed_profile_to_the_next_run_and_refuses_a_bad_file(tmp_path, db_url, engine,
                                                                                daemon_procs):
    cfg = tmp_path / "wd.toml"
    _config(cfg, db_url, max_steps=7)
    d = daemon_procs(cfg)
    assert wait_until(lambda: _holds_lease(engine, d.proc.pid), 60), d.log()
    assert wait_until(lambda: _budgets(db_url)["max_steps"] == 7, 30)

    _config(cfg, db_url, max_steps=3, tick_s=0.3)  # a profile and a restart-only key changed
    d.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "SIGHUP: reloaded" in d.log(), 30), d.log()
    (line,) = [ln for ln in d.log().splitlines() if "SIGHUP: reloaded" in ln]
    assert line.endswith("; needs a restart to apply: [daemon] tick_s")
    assert wait_until(lambda: _budgets(db_url)["max_steps"] == 3, 30)  # the next run gets it
    assert d.proc.poll() is None

    cfg.write_text(cfg.read_text() + "\n[defaults]\nmax_step = 4\n")  # a typo: refused, old config kept
    d.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "SIGHUP:" in d.log() and "refused" in d.log(), 30), d.log()
    (refused,) = [ln for ln in d.log().splitlines() if "refused, the running config is kept" in ln]
    assert "defaults.max_step" in refused
    assert d.proc.poll() is None and _budgets(db_url)["max_steps"] == 3
    d.proc.send_signal(signal.SIGUSR1)  # handled, not fatal
    assert wait_until(lambda: "SIGUSR1:" in d.log(), 30), d.log()
    assert d.stop() == 0, d.log()
    assert "Traceback" not in d.log()


def test_the_unit_reloads_with_sighup():
    from pathlib import Path

    unit = (Path(__file__).resolve().parents[2] / "systemd" / "agent-watchdog.service").read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
