"""Chaos fixtures: the REAL daemon (`agent-watchdog run`) and REAL agent processes.

    def test_runaway_down_is_stopped(watchdog_daemon, agent_process):
        run = agent_process(agent="runaway", scenario="always_500", tool="verify_iban", guards=False)
        assert run.ended_within(steps=12, seconds=300, eur=2.00)
        assert run.status == "killed" and run.innocent_runs_untouched()

`watchdog_daemon` starts `agent-watchdog run --config FILE` (the console script
next to sys.executable) on the test's store with a generated config
(`CHAOS_CONFIG`, deep-merged with a `@pytest.mark.watchdog_config({...})`
marker if the test has one), waits until it has published its settings and
ticked once, and at the end sends SIGTERM and asserts it exited 0 without a
failed tick. The store is a migrated SQLite file, or each backend of `db_url`
when the test asks for that fixture.

`agent_process(agent=..., scenario=..., ...)` starts `tests/chaos/agent.py` as a
separate process (see its docstring for the scenarios) and returns an
`AgentRun` handle at once (the run id is read lazily from the process's first
stdout line, so several agents start concurrently). Unless `bystander=False`,
a misbehaving agent gets an innocent beside it when no held one is running: a
healthy agent, registered before the misbehaving one starts, that does two
turns and then waits (heartbeating, like an agent waiting for an approval)
until `innocent_runs_untouched()` releases it once the misbehaving run has
ended, so it is alive through the whole stop and the check always has a
witness. Every process the factory started is SIGKILLed (by its own Popen
handle) at the end.

The budget criterion, `AgentRun.ended_within(steps=N, seconds=X, eur=Y)`:
the run ended, and it recorded at most N + slack steps, lasted at most
X + slack seconds and burned at most Y + slack EUR. The slack is "one tick" of
the daemon, computed (never guessed) from the daemon's config and the agent's
pace (see `Slack`):

- steps: the breaching step (policies trip on steps > N), the steps the agent
  takes while the daemon waits for its next tick (ceil(tick_s / pace_s)), and
  the one write that sees "stopping" (it is recorded, then raises RunKilled):
  ceil(tick_s / pace_s) + 2. Runs stopped in-process overshoot by nothing.
- tool calls: the same number of turns × calls per turn;
- EUR: the slack steps × the price of one step (tokens × the config's price);
- seconds: the detection tick + the pace + the whole stop ladder, because a run
  that cannot see the stop (hung, or swallowing it) is only over when the
  daemon's signals end it: tick_s + pace_s + cancel_grace_s + tick_s +
  term_grace_s + tick_s.

With the suite's config (tick 0.2 s, graces 1 s) and the default pace (0.15 s):
4 steps, 4 tool calls per call-per-turn, 4 × 0.0064 = 0.0256 EUR (gpt-x;
0.32 EUR with gpt-big) and 2.75 s; so for the [defaults] profile N = 8 + 4
steps, X = 20 + 2.75 s, Y = 0.50 + 0.0256 EUR. The step bound holds even for an
agent that swallows RunKilled: once a run has seen its stop the SDK raises it
again on every call without writing (Run.check), so nothing more is recorded.

For `agent-watchdog postmortem`, cause → scenario (and the status to expect):
down → always_500, schema → bad_schema, stuck → stuck, insist → insist when the
top tool failed, else runaway, hung → hung_tool, manual → runaway (all
"killed"); crash → dies ("lost").

No assertion here waits longer than WAIT_CAP_S: a run still running by then
fails the test with its row, exit code, stderr and the daemon's log.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import select

from attest_support import short_dir
from daemon_support import ME
from watchdog.core.config import RUN_BUDGET_KEYS
from watchdog.store.engine import make_engine
from watchdog.store.schema import daemons, events, interventions, runs, settings, tool_circuits

HERE = Path(__file__).resolve().parent
AGENT_PY = HERE / "agent.py"
CLI = Path(sys.executable).with_name("agent-watchdog")

TICK_S = 0.2
PACE_S = 0.15  # seconds between an agent's turns (one model call + its tool calls)
WAIT_CAP_S = 45.0  # the longest any wait in this suite lasts
START_TIMEOUT_S = 30.0  # Python start-up of several processes on a loaded 2-core box
POLL_S = 0.05
ACTIVE = ("running", "stopping")
INNOCENT_SCENARIOS = ("healthy",)

# The daemon's config for the suite: the real keys of systemd/config.example.toml,
# with a short tick, short graces and small budgets.
CHAOS_CONFIG = {
    "daemon": {"tick_s": TICK_S, "cancel_grace_s": 1.0, "term_grace_s": 1.0, "alert_retry_s": 1.0},
    "defaults": {
        "max_wall_s": 20.0, "max_steps": 8, "max_tool_calls": 12, "max_cost_eur": 0.5, "max_identical_calls": 3,
        "heartbeat_timeout_s": 10.0, "max_tool_calls_per_min": 15, "on_rate": "alert",
    },
    "circuit": {"errors": 3, "window_s": 60.0, "open_s": 60.0},
    "alerts": {"urls": []},
    "prices": {
        "gpt-x": {"input_eur_per_mtok": 2.0, "output_eur_per_mtok": 12.0},  # 0.0064 EUR a chaos step
        "gpt-big": {"input_eur_per_mtok": 25.0, "output_eur_per_mtok": 150.0},  # 0.08 EUR a chaos step
    },
}  # fmt: skip


def pytest_configure(config):
    config.addinivalue_line("markers", "watchdog_config(dict): TOML sections merged into the chaos daemon's config")


# --- small helpers ---------------------------------------------------------------------------


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(doc: dict) -> str:
    """Nested dicts of scalars → TOML (enough for the watchdog's config)."""
    lines: list[str] = []

    def table(path: list[str], d: dict):
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
        if path and (scalars or not any(isinstance(v, dict) for v in d.values())):
            lines.append(f"[{'.'.join(_toml_key(p) for p in path)}]")
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars.items())
        for k, v in d.items():
            if isinstance(v, dict):
                table(path + [k], v)

    table([], doc)
    return "\n".join(lines) + "\n"


def wait_for(pred, timeout_s: float, what: str, on_timeout=lambda: ""):
    """Poll `pred` until it returns something truthy; fail with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}\n{on_timeout()}", pytrace=False)
        time.sleep(POLL_S)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


# --- the daemon ------------------------------------------------------------------------------


@dataclass
class WatchdogDaemon:
    url: str
    config_path: Path
    config: dict
    proc: subprocess.Popen
    log_path: Path
    engine: object = field(repr=False)

    @property
    def tick_s(self) -> float:
        return float(self.config["daemon"]["tick_s"])

    @property
    def cancel_grace_s(self) -> float:
        return float(self.config["daemon"]["cancel_grace_s"])

    @property
    def term_grace_s(self) -> float:
        return float(self.config["daemon"]["term_grace_s"])

    def profile(self, agent: str) -> dict:
        """The agent's budgets as the daemon applies them (defaults + its [agents.NAME])."""
        return {**self.config["defaults"], **self.config.get("agents", {}).get(agent, {})}

    def price_eur(self, model: str, tokens_in: int, tokens_out: int) -> float:
        price = self.config.get("prices", {}).get(model)
        if not price:
            return 0.0
        return (tokens_in * price["input_eur_per_mtok"] + tokens_out * price["output_eur_per_mtok"]) / 1e6

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def diagnostics(self) -> str:
        return f"--- daemon log (tail) ---\n{_tail(self.log_path, 40)}"

    def circuit(self, tool: str):
        with self.engine.connect() as conn:
            return conn.execute(select(tool_circuits).where(tool_circuits.c.tool == tool)).first()

    def wait_circuit(self, tool: str, state: str = "open", timeout_s: float = 15.0):
        return wait_for(lambda: (c := self.circuit(tool)) is not None and c.state == state and c,
                        timeout_s, f"the circuit of {tool} to be {state}", self.diagnostics)

    def interventions(self, *, run_id: str | None = None, tool: str | None = None) -> list:
        q = select(interventions).order_by(interventions.c.id)
        if run_id is not None:
            q = q.where(interventions.c.run_id == run_id)
        if tool is not None:
            q = q.where(interventions.c.tool == tool)
        with self.engine.connect() as conn:
            return conn.execute(q).all()


def _store_url(request) -> str:
    if "db_url" in request.fixturenames:
        return request.getfixturevalue("db_url")
    return request.getfixturevalue("sqlite_url")


@pytest.fixture
def watchdog_daemon(request, tmp_path):
    """The real `agent-watchdog run` daemon on this test's store; SIGTERM at the end must exit 0."""
    assert CLI.exists(), f"the agent-watchdog console script is not installed next to {sys.executable}"
    url = _store_url(request)
    cfg = copy.deepcopy(CHAOS_CONFIG)
    for marker in reversed(list(request.node.iter_markers("watchdog_config"))):  # closest marker wins
        cfg = _merge(cfg, marker.args[0])
    # The daemon's key and attestation socket (a short path), and this user named as the
    # allowed one (root is never a default): the agents attest to it like under systemd.
    sock_dir = short_dir()
    cfg = _merge({"daemon": {"allowed_users": [ME], "key_file": str(sock_dir / "attest.key"),
                             "socket": str(sock_dir / "attest.sock")}}, cfg)
    cfg = _merge(cfg, {"store": {"url": url}})
    folder = tmp_path / "daemon"
    folder.mkdir()
    config_path = folder / "config.toml"
    config_path.write_text(to_toml(cfg))
    log_path = folder / "daemon.log"
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG", "NOTIFY_SOCKET")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(CLI), "run", "--config", str(config_path)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    engine = make_engine(url)
    daemon = WatchdogDaemon(url=url, config_path=config_path, config=cfg, proc=proc, log_path=log_path, engine=engine)

    def ready():
        if proc.poll() is not None:
            pytest.fail(f"the daemon exited with {proc.returncode} while starting\n{daemon.diagnostics()}", pytrace=False)
        try:
            with engine.connect() as conn:
                published = conn.execute(select(settings.c.key).where(settings.c.key == "config")).first()
                lease = conn.execute(select(daemons).where(daemons.c.pid == proc.pid)).first()
        except Exception:  # noqa: BLE001 — tables being created or locked: ask again
            return False
        return published is not None and lease is not None and lease.last_tick_at is not None

    try:
        wait_for(ready, START_TIMEOUT_S, "the daemon to publish its settings and tick once", daemon.diagnostics)
        yield daemon
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                engine.dispose()
                pytest.fail(f"the daemon did not exit within 15 s of SIGTERM\n{daemon.diagnostics()}", pytrace=False)
        engine.dispose()
    assert proc.returncode == 0, f"the daemon exited with {proc.returncode}, not 0\n{daemon.diagnostics()}"
    failures = [line for line in daemon.log().splitlines()
                if "tick failed" in line or "evaluation failed" in line or "Traceback" in line]
    assert not failures, "the daemon logged failures:\n" + "\n".join(failures[:10])


# --- the agents ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slack:
    """One tick of slack for a run's budgets (see the module docstring)."""

    steps: int
    tool_calls: int
    eur: float
    seconds: float

    @classmethod
    def of(cls, daemon: WatchdogDaemon, *, pace_s: float, calls_per_step: int, step_eur: float) -> "Slack":
        turns = math.ceil(daemon.tick_s / pace_s) + 2
        seconds = daemon.tick_s + pace_s + daemon.cancel_grace_s + daemon.tick_s + daemon.term_grace_s + daemon.tick_s
        return cls(steps=turns, tool_calls=turns * calls_per_step, eur=turns * step_eur, seconds=seconds)


class Verdict:
    """A check's outcome: truthy when it held; its repr says why (pytest prints it on failure)."""

    def __init__(self, ok: bool, lines: list[str]):
        self.ok = ok
        self.lines = lines

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return ("<held: " if self.ok else "<FAILED: ") + "; ".join(self.lines) + ">"


class AgentRun:
    """A real agent process and its run in the store."""

    def __init__(self, factory: "AgentFactory", proc: subprocess.Popen, *, agent: str, scenario: str, tool: str | None,
                 guards: bool, pace_s: float, calls_per_step: int, model: str, tokens_in: int, tokens_out: int,
                 budgets: dict, stdout: Path, stderr: Path, hold_file: Path | None = None):
        self.factory = factory
        self.daemon = factory.daemon
        self.proc = proc
        self.agent = agent
        self.scenario = scenario
        self.tool = tool
        self.guards = guards
        self.pace_s = pace_s
        self.calls_per_step = calls_per_step
        self.budgets = budgets
        self.stdout_path = stdout
        self.stderr_path = stderr
        self.step_eur = self.daemon.price_eur(model, tokens_in, tokens_out)
        self.slack = Slack.of(self.daemon, pace_s=pace_s, calls_per_step=calls_per_step, step_eur=self.step_eur)
        self._run_id: str | None = None
        self.hold_file = hold_file

    def __repr__(self) -> str:
        return f"<AgentRun {self.agent}/{self.scenario} pid {self.proc.pid} run {self._run_id or '?'}>"

    @property
    def innocent(self) -> bool:
        return self.scenario in INNOCENT_SCENARIOS

    @property
    def held(self) -> bool:
        """A healthy agent told to wait (heartbeating) after two turns, until `release()`."""
        return self.hold_file is not None and not self.hold_file.exists()

    def release(self) -> None:
        if self.hold_file is not None:
            self.hold_file.touch()

    # -- what the process said ---------------------------------------------------------------

    def _lines(self) -> list[str]:
        try:
            return self.stdout_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def notes(self) -> list[str]:
        return [line[2:] for line in self._lines() if line.startswith("# ")]

    def summary(self) -> dict | None:
        """The agent's closing JSON line, or None (killed, or still running)."""
        lines = [line for line in self._lines()[1:] if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None

    def diagnostics(self) -> str:
        row = self._row_or_none()
        return (f"agent {self.agent}/{self.scenario} pid {self.proc.pid} exit {self.proc.poll()}; "
                f"run {dict(row._mapping) if row is not None else self._run_id}\n"
                f"--- agent stdout ---\n{_tail(self.stdout_path, 10)}\n--- agent stderr ---\n{_tail(self.stderr_path, 20)}\n"
                f"{self.daemon.diagnostics()}")

    @property
    def run_id(self) -> str:
        """Read from the process's first stdout line (waits for it)."""
        if self._run_id is None:
            def first_line():
                lines = self._lines()
                if lines and re.fullmatch(r"[0-9a-f]{32}", lines[0].strip()):
                    return lines[0].strip()
                if self.proc.poll() is not None and not lines:
                    pytest.fail(f"the agent exited with {self.proc.returncode} before registering its run\n"
                                f"{self.diagnostics()}", pytrace=False)
                return None

            self._run_id = wait_for(first_line, START_TIMEOUT_S, f"{self!r} to print its run id", self.diagnostics)
        return self._run_id

    # -- the store -------------------------------------------------------------------------------

    def _row_or_none(self):
        if self._run_id is None:
            return None
        with self.daemon.engine.connect() as conn:
            return conn.execute(select(runs).where(runs.c.id == self._run_id)).first()

    def row(self):
        """The run's row in `runs`, as it is now."""
        rid = self.run_id
        return wait_for(self._row_or_none, START_TIMEOUT_S, f"the row of run {rid[:8]}", self.diagnostics)

    @property
    def status(self) -> str:
        return self.row().status

    @property
    def stop_reason(self) -> str | None:
        return self.row().stop_reason

    def wait_ended(self, timeout_s: float = WAIT_CAP_S):
        """Poll the store until the run is no longer running/stopping; return its row."""
        def ended():
            self.proc.poll()  # reap it the moment it exits, as a supervisor would
            row = self._row_or_none() if self._run_id else None
            return row if row is not None and row.status not in ACTIVE else None

        self.run_id  # noqa: B018 — wait for the registration first
        return wait_for(ended, min(timeout_s, WAIT_CAP_S), f"run {self.run_id[:8]} ({self.agent}/{self.scenario}) to end",
                        self.diagnostics)

    def wait_exit(self, timeout_s: float = 15.0) -> int:
        try:
            return self.proc.wait(timeout=min(timeout_s, WAIT_CAP_S))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self!r} still alive {timeout_s:g} s later\n{self.diagnostics()}", pytrace=False)

    def events(self, kind: str | None = None) -> list:
        q = select(events).where(events.c.run_id == self.run_id).order_by(events.c.seq)
        if kind:
            q = q.where(events.c.kind == kind)
        with self.daemon.engine.connect() as conn:
            return conn.execute(q).all()

    def interventions(self) -> list:
        return self.daemon.interventions(run_id=self.run_id)

    def actions(self) -> list[str]:
        return [i.action for i in self.interventions()]

    def daemon_actions(self) -> list[str]:
        """What the daemon did to this run (the SDK may record its own in-process stops too)."""
        return [i.action for i in self.interventions() if (i.actor or "").startswith("daemon@")]

    def effective_budgets(self) -> dict:
        """The profile's budgets lowered by what this run asked for (what both guards and daemon apply)."""
        eff = self.daemon.profile(self.agent)
        for k, v in self.budgets.items():
            eff[k] = v if eff.get("runs_may_raise") else min(eff[k], v)
        return eff

    # -- the article's criterion -----------------------------------------------------------------

    def ended_within(self, steps: int | None = None, seconds: float | None = None, eur: float | None = None,
                     tool_calls: int | None = None) -> Verdict:
        """The run ended and stayed within N steps, X seconds, Y EUR (each + one tick of slack)."""
        limit_s = (seconds if seconds is not None else WAIT_CAP_S) + self.slack.seconds
        row = self.wait_ended(limit_s)
        duration = (row.ended_at - row.started_at).total_seconds()
        checks = []
        if steps is not None:
            checks.append((row.steps <= steps + self.slack.steps, f"steps {row.steps} ≤ {steps}+{self.slack.steps}"))
        if tool_calls is not None:
            checks.append((row.tool_calls <= tool_calls + self.slack.tool_calls,
                           f"tool calls {row.tool_calls} ≤ {tool_calls}+{self.slack.tool_calls}"))
        if seconds is not None:
            checks.append((duration <= seconds + self.slack.seconds,
                           f"{duration:.1f} s ≤ {seconds:g}+{self.slack.seconds:.1f} s"))
        if eur is not None:
            checks.append((row.cost_eur <= eur + self.slack.eur + 1e-9,
                           f"{row.cost_eur:.4f} EUR ≤ {eur:.2f}+{self.slack.eur:.4f} EUR"))
        ok = all(c for c, _ in checks)
        lines = [("" if c else "NOT ") + text for c, text in checks]
        return Verdict(ok, [f"{self.agent}/{self.scenario} run {row.id[:8]} {row.status} ({row.stop_reason})", *lines])

    def within_budgets(self) -> Verdict:
        """`ended_within` this run's own effective budgets (profile lowered by its requests)."""
        b = self.effective_budgets()
        return self.ended_within(steps=b["max_steps"], seconds=b["max_wall_s"], eur=b["max_cost_eur"],
                                 tool_calls=b["max_tool_calls"])

    def innocent_runs_untouched(self) -> Verdict:
        """Every innocent (healthy) run that overlapped this one completed, with no intervention on it."""
        me = self.wait_ended()
        lines, ok, witnesses = [], True, 0
        innocents = [h for h in self.factory.handles if h is not self and h.innocent]
        for other in innocents:
            other.release()  # this run is over: a held innocent may finish now
        for other in innocents:
            row = other.wait_ended()
            if row.started_at > me.ended_at or row.ended_at < me.started_at:
                lines.append(f"{other.agent} run {row.id[:8]} did not overlap ({row.started_at:%H:%M:%S.%f}-"
                             f"{row.ended_at:%H:%M:%S.%f} vs {me.started_at:%H:%M:%S.%f}-{me.ended_at:%H:%M:%S.%f})")
                continue
            witnesses += 1
            code = other.wait_exit()
            touched = other.actions()
            good = row.status == "completed" and row.stop_reason is None and not touched and code == 0
            ok &= good
            lines.append(f"{other.agent} run {row.id[:8]}: {row.status}, exit {code}, interventions {touched or 'none'}")
        if not witnesses:
            return Verdict(False, ["no innocent run ran beside it (start one, or leave bystander=True)", *lines])
        return Verdict(ok, lines)


class AgentFactory:
    """`agent_process(...)`: start one agent process, return its AgentRun at once."""

    def __init__(self, daemon: WatchdogDaemon, folder: Path):
        self.daemon = daemon
        self.folder = folder
        self.handles: list[AgentRun] = []

    def __call__(self, agent: str, scenario: str = "healthy", *, tool: str | None = None, guards: bool = True,
                 kill_mode: str = "process", pace_s: float | None = None, calls_per_step: int = 1, turns: int = 4,
                 model: str = "gpt-x", tokens_in: int = 2000, tokens_out: int = 200, bystander: bool = True,
                 hold: bool = False, **budgets) -> AgentRun:
        if "tools" in budgets:
            raise TypeError("agent_process(tools=...): an agent is a separate process, its tools cannot be passed in; "
                            "pick a scenario (always_500, bad_schema, insist, runaway, stuck, broken_logic, hung_tool, "
                            "dies) and name the tool with tool='...'")
        unknown = set(budgets) - set(RUN_BUDGET_KEYS)
        if unknown:
            raise TypeError(f"agent_process: unknown argument(s) {sorted(unknown)}; run budgets are {RUN_BUDGET_KEYS}")
        if scenario not in INNOCENT_SCENARIOS and bystander and not any(
                h.innocent and h.held and h.proc.poll() is None for h in self.handles):
            # An innocent that is registered before this run starts and holds until this run has ended.
            self("bystander", "healthy", turns=4, hold=True).run_id  # noqa: B018 — wait for its registration
        pace_s = PACE_S if pace_s is None else pace_s
        n = len(self.handles)
        stdout, stderr = self.folder / f"{n:02d}-{agent}.out", self.folder / f"{n:02d}-{agent}.err"
        argv = [sys.executable, str(AGENT_PY), "--db", self.daemon.url, "--agent", agent, "--scenario", scenario,
                "--guards", "on" if guards else "off", "--kill-mode", kill_mode, "--pace", str(pace_s),
                "--calls-per-step", str(calls_per_step), "--turns", str(turns), "--model", model,
                "--tokens-in", str(tokens_in), "--tokens-out", str(tokens_out),
                "--circuit-cache-s", str(self.daemon.tick_s)]
        if tool:
            argv += ["--tool", tool]
        hold_file = self.folder / f"{n:02d}-{agent}.release" if hold else None
        if hold_file:
            argv += ["--hold-file", str(hold_file)]
        for k, v in budgets.items():
            argv += ["--budget", f"{k}={v!r}"]
        env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}
        env["AGENT_WATCHDOG_SOCKET"] = self.daemon.config["daemon"]["socket"]
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        handle = AgentRun(self, proc, agent=agent, scenario=scenario, tool=tool, guards=guards, pace_s=pace_s,
                          calls_per_step=calls_per_step, model=model, tokens_in=tokens_in, tokens_out=tokens_out,
                          budgets=budgets, stdout=stdout, stderr=stderr, hold_file=hold_file)
        self.handles.append(handle)
        return handle

    def cleanup(self):
        for h in self.handles:
            if h.proc.poll() is None:
                h.proc.kill()  # our own child, by its Popen handle
        for h in self.handles:
            try:
                h.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def agent_process(watchdog_daemon, tmp_path):
    """A factory of real agent processes on the chaos daemon's store (see AgentFactory.__call__)."""
    folder = tmp_path / "agents"
    folder.mkdir()
    factory = AgentFactory(watchdog_daemon, folder)
    try:
        yield factory
    finally:
        factory.cleanup()
