"""`agent-watchdog check-config` as the installed console script, a real process (the parsing and
the command in process: tests/unit/test_config.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PROFILES = """
[defaults]
max_steps = 10
max_cost_eur = 1.5

[agents.support-bot]
max_tool_calls = 20

[agents.researcher]
max_steps = 25
max_wall_s = 900
"""


def write(tmp_path, body: str, name="watchdog.toml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def console_script() -> str:
    found = shutil.which("agent-watchdog", path=os.path.dirname(sys.executable))
    assert found, "the agent-watchdog console script is not installed next to this Python"
    return found


def test_check_config_console_script(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    good = write(tmp_path, PROFILES)
    ok = subprocess.run([console_script(), "check-config", str(good)], capture_output=True, text=True,
                        timeout=60, cwd="/", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "[agents.support-bot]" in ok.stdout and "max_tool_calls=20" in ok.stdout
    bad = write(tmp_path, "[agents.support-bot]\nmax_steps = -3\n", name="bad.toml")
    err = subprocess.run([console_script(), "check-config", str(bad)], capture_output=True, text=True,
                         timeout=60, cwd="/", env=env)
    assert err.returncode == 2
    assert err.stdout == ""
    assert err.stderr.count("\n") == 1 and "Traceback" not in err.stderr
    assert str(bad) in err.stderr and "agents.support-bot.max_steps" in err.stderr
    missing = subprocess.run([console_script(), "check-config", str(tmp_path / "nope.toml")], capture_output=True,
                             text=True, timeout=60, cwd="/", env=env)
    assert missing.returncode == 2 and "nope.toml" in missing.stderr and "Traceback" not in missing.stderr
