"""Helpers for the `agent-watchdog exec` tests: a real daemon process, exec as a real process,
and commands that misbehave (setsid'd, double-forked grandchildren that ignore SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
from sqlalchemy import select

from agent_procs import wait_until
from attest_support import short_dir
from daemon_support import ME
from watchdog.store.schema import attestations, runs

AGENT_WATCHDOG = str(Path(sys.executable).parent / "agent-watchdog")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# A command whose grandchild leaves the session (setsid), double-forks, ignores SIGTERM and
# writes its pid to argv[1]; the command itself then waits (for the stop, or for ever).
STUBBORN = textwrap.dedent("""
    import os, signal, sys, time
    pid_file = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(pid_file + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pid_file + ".tmp", pid_file)
            while True:
                time.sleep(1)
        os._exit(0)
    while True:
        time.sleep(1)
""")


def daemon_config(path: Path, db_url: str, *, tick_s: float = 0.2, cancel_grace_s: float = 5.0,
                  term_grace_s: float = 0.5, extra: str = "", users: tuple[str, ...] = ()) -> tuple[Path, str]:
    """A daemon config (and its socket path). cancel_grace_s is long enough for exec to end the
    run itself: the daemon's own signals are the backstop for an exec that is gone."""
    folder = short_dir()
    folder.chmod(0o711)  # other users reach the socket by its name; the key file is 0600 anyway
    sock = str(folder / "attest.sock")
    allowed = json.dumps([ME, *users])
    path.write_text(
        f'[store]\nurl = "{db_url}"\n\n'
        f"[daemon]\ntick_s = {tick_s}\ncancel_grace_s = {cancel_grace_s}\nterm_grace_s = {term_grace_s}\n"
        f'allowed_users = {allowed}\nstate_dir = "{folder}"\nkey_file = "{folder / "attest.key"}"\n'
        f'socket = "{sock}"\n{extra}')
    return path, sock


class Daemon:
    def __init__(self, tmp_path: Path, cfg: Path, sock: str):
        self.cfg, self.sock = cfg, sock
        self.log_path = tmp_path / "daemon.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([AGENT_WATCHDOG, "run", "--config", str(cfg)], env=env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        assert wait_until(lambda: os.path.exists(sock) or self.proc.poll() is not None, 60), self.log()
        assert self.proc.poll() is None, self.log()

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def exec_env(sock: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    env["AGENT_WATCHDOG_SOCKET"] = sock or "/nonexistent/agent-watchdog/attest.sock"
    env.update(extra)
    return env


def start_exec(args: list[str], *, db_url: str, cfg: Path | None = None, sock: str | None = None,
               env: dict | None = None, stdout=subprocess.PIPE) -> subprocess.Popen:
    cmd = [AGENT_WATCHDOG, "--db", db_url, *(["--config", str(cfg)] if cfg else []), "exec", *args]
    return subprocess.Popen(cmd, env=env or exec_env(sock), stdout=stdout, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)


def run_exec(args: list[str], *, db_url: str, timeout_s: float = 120, **kw) -> subprocess.CompletedProcess:
    p = start_exec(args, db_url=db_url, **kw)
    out, err = p.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def exec_runs(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.source == "exec").order_by(runs.c.started_at)).all()


def attestation(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(attestations).where(attestations.c.run_id == run_id)).first()


def read_pid(path: Path, timeout_s: float = 60) -> psutil.Process:
    assert wait_until(lambda: path.exists(), timeout_s), f"{path} never written"
    return psutil.Process(int(path.read_text()))


def gone(proc: psutil.Process) -> bool:
    """The process (pid + create time) no longer runs (a zombie counts as gone)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def runs_json(db_url: str) -> list[dict]:
    out = subprocess.run([AGENT_WATCHDOG, "--db", db_url, "runs", "--all", "--json"], capture_output=True, text=True,
                         timeout=60, env=exec_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
