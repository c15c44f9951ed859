"""`agent-watchdog status` and the "no live daemon" banner of `runs` and `top` (issue 36, item 3),
and a second daemon's listeners (minor item: `[metrics] listen` in use). One real daemon per
backend, the CLI as a subprocess of the venv's agent-watchdog."""

from __future__ import annotations

import json
import os
import socket
import subprocess

from agent_procs import wait_until
from test_daemon import AGENT_WATCHDOG, SOCKET_OF, _toml, daemon_procs  # noqa: F401 — the fixture

TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str, cfg=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    argv = [AGENT_WATCHDOG, *args] + (["--config", str(cfg)] if cfg else [])
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


def test_status_shows_the_live_daemon_its_receivers_and_says_when_none_is_left(tmp_path, db_url, daemon_procs):
    otlp, metrics = _free_port(), _free_port()
    cfg = _toml(tmp_path / "wd.toml", db_url)
    cfg.write_text(cfg.read_text() + f'\n[otlp]\nlisten = "127.0.0.1:{otlp}"\n\n[metrics]\nlisten = "127.0.0.1:{metrics}"\n')

    before = _cli("status", cfg=cfg)
    assert before.returncode == 1 and before.stdout.startswith("no live daemon ever"), before
    runs = _cli("runs", "--json", cfg=cfg)
    assert runs.returncode == 0 and json.loads(runs.stdout) == []
    assert runs.stderr.startswith("agent-watchdog: no live daemon ever: no run is judged"), runs.stderr

    daemon = daemon_procs(cfg)
    assert wait_until(lambda: _cli("status", cfg=cfg).returncode == 0, TIMEOUT_S), daemon.log()
    assert wait_until(lambda: json.loads(_cli("status", "--json", cfg=cfg).stdout)["daemons"][0]["last_tick_at"],
                      TIMEOUT_S)
    st = json.loads(_cli("status", "--json", cfg=cfg).stdout)
    (d,) = st["daemons"]
    assert (st["live"], d["pid"], d["live"], d["leader"]) == (1, daemon.proc.pid, True, True), st
    assert d["socket"] == SOCKET_OF[cfg] and d["otlp"] == f"http://127.0.0.1:{otlp}/v1/traces", d
    assert d["metrics"] == f"127.0.0.1:{metrics}" and d["signals"]["cannot"] == [], d
    text = _cli("status", cfg=cfg).stdout
    assert "live, leader" in text and f"otlp       http://127.0.0.1:{otlp}/v1/traces" in text, text
    assert _cli("runs", cfg=cfg).stderr == "" and _cli("top", "--once", cfg=cfg).stderr == ""

    # A second daemon on the same store and host: "already watching", exit 0 — not EADDRINUSE.
    second = _cli("run", cfg=cfg)
    assert second.returncode == 0 and "Traceback" not in second.stderr and "Errno" not in second.stderr, second
    # A port in use on its own (another store, so the lease is free): one line naming the key.
    other = tmp_path / "other"
    other.mkdir()
    cfg2 = _toml(other / "wd.toml", f"sqlite:///{other / 'runs.db'}")
    cfg2.write_text(cfg2.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    assert _cli("db", "upgrade", cfg=cfg2).returncode == 0
    busy = _cli("run", cfg=cfg2)
    assert busy.returncode != 0 and busy.stderr.count("\n") == 1, busy.stderr
    assert "[metrics] listen" in busy.stderr and "Traceback" not in busy.stderr, busy.stderr

    assert daemon.stop() == 0, daemon.log()
    after = _cli("status", cfg=cfg)
    assert after.returncode == 1 and "no live daemon since" in after.stdout and "gone" in after.stdout, after
    top = _cli("top", "--once", cfg=cfg)
    assert top.returncode == 0 and top.stderr.startswith("agent-watchdog: no live daemon since"), top.stderr
    assert len(top.stderr.splitlines()[0]) <= 80 and "active" in top.stdout.splitlines()[0]
