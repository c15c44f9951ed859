"""`agent-watchdog demo`: a real daemon and real agent processes against a throwaway SQLite store.

Nothing is simulated on the watchdog's side: the daemon is `agent-watchdog run`
in its own process, the agents are separate Python processes using the SDK,
and every stop, signal and alert below is the real one. The demo process only
sets things up, reads the store to narrate, and cleans up.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import click

from watchdog.core import lifecycle as lc
from watchdog.core.config import load
from watchdog.store import viewer as store
from watchdog.store.engine import make_engine
from watchdog.demo.agents import BEHAVIOURS
from watchdog.demo.model import MODEL
from watchdog.demo.report import Feed, outcomes, table
from watchdog.demo.tools import write_files

POLL_S = 0.3
DAEMON_READY_S = 30.0  # a cold Python start on a loaded 2-core box can take seconds
RUN_DEADLINE_S = 45.0  # everything ends in ~10 s; past this the demo gives up and says so
STOP_WAIT_S = 5.0
OUTBOX_WAIT_S = 10.0  # alert targets may be slow; the outbox keeps what is left for the next daemon

# The demo's budgets: small, so each runaway trips one within seconds. Every
# behaviour in agents.py is tuned against these numbers (see BEHAVIOURS).
BUDGETS = dict(max_wall_s=20, max_steps=8, max_tool_calls=12, max_cost_eur=0.05, max_identical_calls=3,
               heartbeat_timeout_s=4, max_tool_calls_per_min=30)
PRICE = dict(input_eur_per_mtok=3.5, output_eur_per_mtok=10.0)


def config_toml(db_url: str, tick_s: float, alert_urls, key_file: str = "", socket: str = "") -> str:
    def v(x):  # JSON strings and numbers are valid TOML
        return json.dumps(x)

    return "\n".join([
        "# Written by `agent-watchdog demo`: the daemon's config for this demo only.",
        "[store]", f"url = {v(db_url)}", "",
        "[daemon]", f"tick_s = {tick_s}",
        "cancel_grace_s = 2   # cooperative stop -> SIGTERM", "term_grace_s = 2     # SIGTERM -> SIGKILL",
        "alert_retry_s = 5",
        "# the demo's agents run as you: named, since root is never signalled unless named",
        f"allowed_users = [{v(_me())}]",
        *([f"key_file = {v(key_file)}", f"socket = {v(socket)}"] if key_file else []), "",
        "[defaults]   # every demo agent uses these (a real deployment has one [agents.NAME] per agent)",
        *(f"{k} = {v(x)}" for k, x in BUDGETS.items()),
        "# max_tool_calls_per_min is above what a 12-call budget allows: the demo shows stops, not the rate alarm.",
        "", "[circuit]", "errors = 3", "window_s = 30", "open_s = 10", "",
        "[alerts]", f"urls = [{', '.join(v(u) for u in alert_urls)}]", "",
        f'[prices."{MODEL}"]   # EUR per million tokens: the scripted model is priced like a premium one',
        *(f"{k} = {x}" for k, x in PRICE.items()), "",
    ])


def _me() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _socket_path(folder: Path) -> str:
    """The demo daemon's attestation socket: in its folder, unless that path is too long for one
    (then in a short folder of /tmp that stop_all removes)."""
    path = folder / "attest.sock"
    if len(os.fsencode(str(path))) < 100:
        return str(path)
    return str(Path(tempfile.mkdtemp(prefix="aw-demo-", dir="/tmp")) / "attest.sock")


def _die_with_parent():
    # Linux: a child gets SIGKILL if the demo itself is killed, so nothing is left behind.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _spawn(argv, log: Path, **extra_env) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}
    env.update(extra_env)
    with open(log, "ab") as out:
        # A new session: the terminal's Ctrl-C reaches the demo only, which then cleans up in order.
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)


def _tail(path: Path, n: int = 8) -> str:
    with contextlib.suppress(OSError):
        return "\n".join("    " + ln for ln in path.read_text(errors="replace").splitlines()[-n:])
    return "    (no log)"


class Demo:
    def __init__(self, folder: Path, tick_s: float, alert_urls, echo=click.echo):
        self.dir = folder
        self.tick_s = tick_s
        self.echo = echo
        self.db_url = f"sqlite:///{folder / 'runs.db'}"
        self.cfg_path = folder / "demo.toml"
        self.socket = _socket_path(folder)
        self.cfg_path.write_text(config_toml(self.db_url, tick_s, alert_urls, str(folder / "attest.key"),
                                             self.socket), encoding="utf-8")
        self.config = load(self.cfg_path)
        self.engine = make_engine(self.db_url)
        self.daemon: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}  # run id -> process
        self.names: dict[str, str] = {}  # run id -> agent

    # -- setup --------------------------------------------------------------------

    def start_daemon(self):
        from watchdog.store import access

        access.upgrade(self.engine)
        argv = [sys.executable, "-c", "from watchdog.cli import main; main(prog_name='agent-watchdog')",
                "run", "--db", self.db_url, "--config", str(self.cfg_path)]
        self.daemon = _spawn(argv, self.dir / "daemon.log")
        deadline = time.monotonic() + DAEMON_READY_S
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                raise click.ClickException(f"the daemon exited with {self.daemon.returncode}:\n"
                                           + _tail(self.dir / "daemon.log"))
            # Ready = settings published (the agents price their steps with them) and one tick done
            # (its scan cursor is set, so every later error counts for the circuit breakers).
            if store.daemon_ready(self.engine, self.daemon.pid):
                return
            time.sleep(0.1)
        raise click.ClickException(f"the daemon did not start within {DAEMON_READY_S:g} s:\n"
                                   + _tail(self.dir / "daemon.log"))

    def start_agents(self):
        for name in BEHAVIOURS:
            rid = uuid.uuid4().hex
            argv = [sys.executable, "-m", "watchdog.demo.agents", name, "--db", self.db_url,
                    "--files", str(self.dir / "files"), "--run-id", rid, "--circuit-cache-s", str(self.tick_s)]
            self.names[rid] = name
            # The agents attest their processes to the demo's daemon (else it could not signal them).
            self.agents[rid] = _spawn(argv, self.dir / f"agent-{name}.log", AGENT_WATCHDOG_SOCKET=self.socket)

    # -- the show -----------------------------------------------------------------

    def watch(self, feed: Feed) -> bool:
        """Narrate until every agent process exited and every run ended; False on the deadline."""
        deadline = time.monotonic() + RUN_DEADLINE_S
        while time.monotonic() < deadline:
            rows = feed.poll()
            exited = all(p.poll() is not None for p in self.agents.values())  # poll() also reaps zombies
            ended = all(r.status in lc.END_STATUSES for r in rows.values())
            if exited and ended:
                time.sleep(POLL_S)  # the last alerts are in the same transactions; one more read to be sure
                feed.poll(flush=True)
                return True
            time.sleep(POLL_S)
        feed.poll(flush=True)
        return False

    def started_daemon(self) -> subprocess.Popen:
        """The daemon start_daemon started: every step after it relies on one."""
        if self.daemon is None:
            raise RuntimeError("the demo's daemon is not started yet (start_daemon first)")
        return self.daemon

    def drain_outbox(self) -> int:
        """Let the daemon try every alert once before it is stopped; how many it has not tried yet."""
        deadline = time.monotonic() + OUTBOX_WAIT_S
        while True:
            left = store.untried_alerts(self.engine)
            if not left or time.monotonic() > deadline or self.started_daemon().poll() is not None:
                return left
            time.sleep(POLL_S)

    # -- teardown -----------------------------------------------------------------

    def stop_all(self) -> list[str]:
        """Stop every process the demo started (agents first, then the daemon); what had to be killed."""
        # A second Ctrl-C must not cut the cleanup short (it takes at most a few seconds).
        masked = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._stop_all()
        finally:
            socket_dir = Path(self.socket).parent
            if socket_dir != self.dir:  # the short folder _socket_path made
                shutil.rmtree(socket_dir, ignore_errors=True)
            for sig, handler in masked.items():
                signal.signal(sig, handler)

    def _stop_all(self) -> list[str]:
        killed = []
        for rid, p in self.agents.items():
            if p.poll() is None:
                killed.append(f"{self.names[rid]} (pid {p.pid})")
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(STOP_WAIT_S)
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()  # it finishes its tick and releases its lease
            try:
                self.daemon.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                killed.append(f"daemon (pid {self.daemon.pid})")
                self.daemon.kill()
                self.daemon.wait(STOP_WAIT_S)
        self.engine.dispose()
        return killed


def intro(demo: Demo, keep: bool) -> str:
    b, c, d = BUDGETS, demo.config.circuit.default, demo.config.daemon
    lines = [
        "agent-watchdog demo — a real daemon, six real agent processes, one scripted chat model.",
        f"  store    {demo.db_url}" + ("" if keep else "  (temporary)"),
        f"  daemon   pid {demo.started_daemon().pid}: tick {d.tick_s:g} s; stop → SIGTERM after {d.cancel_grace_s:g} s "
        f"→ SIGKILL after {d.term_grace_s:g} s more",
        f"  budgets  per run: {b['max_steps']} steps, {b['max_tool_calls']} tool calls, {b['max_cost_eur']} EUR, "
        f"{b['max_identical_calls']} identical calls, silent {b['heartbeat_timeout_s']} s, {b['max_wall_s']} s wall",
        f"  circuit  {c.errors} errors of one tool in {c.window_s:g} s open it for {c.open_s:g} s",
        "  alerts   printed as they would arrive on Slack; "
        + (f"also sent to the {len(demo.config.alert_urls)} URL(s) of your config" if demo.config.alert_urls
           else "to get them too: --config with [alerts] urls"),
        "",
    ]
    lines += [f"  {name:12} {beh.story}" for name, beh in BEHAVIOURS.items()]
    return "\n".join(lines + [""])


def run_demo(keep: str | None, tick_s: float, alert_urls=()) -> int:
    """The whole demo; returns the exit status (0 = every agent ended as expected)."""
    folder = Path(keep).resolve() if keep else Path(tempfile.mkdtemp(prefix="agent-watchdog-demo-"))
    if keep:
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / "runs.db").exists():
            raise click.ClickException(f"{folder / 'runs.db'} already exists: give --keep a new or empty folder")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill <demo>` cleans up like Ctrl-C
    try:
        return _run(folder, bool(keep), tick_s, alert_urls)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def _run(folder: Path, keep: bool, tick_s: float, alert_urls) -> int:
    write_files(folder / "files")
    demo = Demo(folder, tick_s, alert_urls)
    status, finished, results = 1, False, None
    try:
        demo.start_daemon()
        demo.echo(intro(demo, keep))
        demo.start_agents()
        finished = demo.watch(Feed(demo.engine, demo.names, demo.echo))
        results = outcomes(demo.engine, demo.config, demo.names)
        undelivered = demo.drain_outbox()
        if undelivered:
            demo.echo(f"{undelivered} alert(s) not delivered yet to the configured URLs; the daemon stops now")
    except KeyboardInterrupt:
        demo.echo("\ninterrupted: stopping the daemon and every agent process")
        status = 130
    finally:
        leftovers = demo.stop_all()
        if leftovers:
            demo.echo(f"killed what was still running at the end: {', '.join(leftovers)}")
    if results is not None:
        status = verdict(demo, results, finished)
    if keep:
        epilogue(demo, results)
    else:
        # The store is deleted on the way out: point at a command that keeps one, not at this one.
        demo.echo(f"\nThe store and logs were temporary ({demo.dir}, deleted now).\n"
                  "To look closer at the runs (runs --all, show, postmortem, top), keep them: "
                  "agent-watchdog demo --keep DIR")
    return status


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def verdict(demo: Demo, results, finished: bool) -> int:
    demo.echo("\n" + table(results) + "\n")
    problems = [p for o in results for p in o.problems()]
    if not finished:
        problems.insert(0, f"not every agent ended within {RUN_DEADLINE_S:g} s")
    if not problems:
        demo.echo("OK: every agent ended as expected — the healthy runs completed, each runaway was\n"
                  "stopped by the right defense, nothing else was touched.")
        return 0
    demo.echo("FAILED: not every agent ended as expected:")
    for p in problems:
        demo.echo(f"  - {p}")
    for o in results:
        if o.problems():
            demo.echo(f"  last lines of agent-{o.agent}.log:\n{_tail(demo.dir / f'agent-{o.agent}.log', 5)}")
    demo.echo(f"  last lines of daemon.log:\n{_tail(demo.dir / 'daemon.log', 5)}")
    return 1


def epilogue(demo: Demo, results):
    # --config too: `show` and `postmortem` judge a run against its profile, and the demo's are its own.
    # Set once, so that each command fits 100 columns (issue 19).
    base = "agent-watchdog"
    demo.echo(f"\nKept in {demo.dir}: runs.db, demo.toml and the daemon's and agents' logs. Look closer:")
    demo.echo(f"  export AGENT_WATCHDOG_DB={shlex.quote(demo.db_url)}")
    demo.echo(f"  export AGENT_WATCHDOG_CONFIG={shlex.quote(str(demo.cfg_path))}")
    demo.echo(f"  {base} runs --all")
    pick = next((o for o in results or () if o.agent == "stubborn" and o.record), None)
    if pick:
        demo.echo(f"  {base} show {pick.run_id[:8]}")
        demo.echo(f"  {base} postmortem {pick.run_id[:8]}")
        demo.echo(f"  ({pick.run_id[:8]} is stubborn's run; every run id is on its agent's `started` line above)")
