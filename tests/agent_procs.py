"""Small agent programs for the daemon tests, run as REAL child processes that
write to the store through the SDK.

    python -m agent_procs SCENARIO SPEC_JSON        (tests/ on PYTHONPATH)

(Not named `agents`: that is the import name of the OpenAI Agents SDK, which
the integrations import; a tests/agents.py would shadow it for the whole
pytest session.)

Every agent writes a ready file (JSON: run ids, pids) once its runs are
registered and its first records written, and a result file when it leaves,
so tests wait on files and on process exits, never on a guessed sleep.
`AgentProcs` (used by the tests) starts them and, whatever happens, kills
every process they started, each by pid *and* create time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WAIT_S = 30.0  # generous: Python start-up on a loaded 2-core box
POLL_S = 0.02

# A chain of plain child processes under an agent: each spawns the next (so
# depth 2 = a child and a grandchild), optionally ignores SIGTERM, announces
# its pid with a file in `folder` and sleeps.
CHAIN = r"""
import os, signal, subprocess, sys, time
depth, folder, ignore = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if depth > 1:
    subprocess.Popen([sys.executable, "-c", os.environ["AGENT_PROCS_CHAIN"], str(depth - 1), folder, sys.argv[3]])
open(os.path.join(folder, f"pid.{os.getpid()}"), "w").close()
time.sleep(3600)
"""


# --- helpers shared by both sides ---------------------------------------------


def write_json(path, data) -> None:
    """Atomic: a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def wait_until(pred, timeout_s: float = WAIT_S, poll_s: float = POLL_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(poll_s)
    return bool(pred())


def process_gone(pid: int, create_time: float | None = None) -> bool:
    """The process is gone: no such pid, a zombie, or the pid names another process."""
    import psutil

    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 1e-3:
            return True
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- the agent programs (child side) -------------------------------------------


def _start_chain(depth: int, folder: Path, ignore: bool) -> list[int]:
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, AGENT_PROCS_CHAIN=CHAIN)
    subprocess.Popen([sys.executable, "-c", CHAIN, str(depth), str(folder), "1" if ignore else "0"], env=env)
    if not wait_until(lambda: len(list(folder.glob("pid.*"))) >= depth):
        raise SystemExit("the child chain did not start")
    return sorted(int(p.name.split(".")[1]) for p in folder.glob("pid.*"))


def runaway(spec: dict) -> int:
    """One run: `steps` steps, `tools` tool calls, then `then`:
    hang (stop writing and sleep), loop (a step every `interval` s until stopped),
    exit (die without ending the run). Options: ignore_sigterm, block_sigterm,
    children (a chain of that depth: a child, a grandchild...), children_ignore_sigterm."""
    from watchdog import RunKilled, Watchdog

    if spec.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if spec.get("block_sigterm"):  # a SIGTERM sent stays pending, visible in /proc: proof it was (not) sent
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    children = []
    if spec.get("children"):
        children = _start_chain(spec["children"], Path(spec["ready"] + ".chain"),
                                spec.get("children_ignore_sigterm", False))
    wd = Watchdog(spec["url"])
    try:
        with wd.run(agent=spec.get("agent", "bot"), kill_mode=spec.get("kill_mode", "process"), guards=False,
                    **spec.get("budgets", {})) as run:
            for _ in range(spec.get("steps", 0)):
                run.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=spec.get("step_cost", 0.0))
            for name, args, ok in spec.get("tools", []):
                run.record_tool(name, args, ok=ok, error=None if ok else "timeout")
            write_json(spec["ready"], {"run_id": run.id, "pid": os.getpid(), "children": children})
            then = spec.get("then", "hang")
            if then == "exit":
                os._exit(0)  # gone without ending the run: the daemon must call it lost
            while then == "hang":
                time.sleep(3600)
            while True:  # loop
                run.step(model="gpt-x", tokens_in=10, tokens_out=5)
                time.sleep(spec.get("interval", 0.05))
    except RunKilled as stop:
        write_json(spec["result"], {"killed": stop.reason, "detail": stop.detail})
    finally:
        wd.close()
    return 0


def shared(spec: dict) -> int:
    """Three runs in three threads of this one process (kill_mode cooperative).

    The looper calls the same tool with the same arguments every `interval` s
    until it is stopped; with `ignore_stop` it catches the stop (BaseException)
    and stops writing, without leaving its run. The two others heartbeat until
    the `finish` file exists, then complete; the looper then leaves too.
    """
    from watchdog import Watchdog

    wd = Watchdog(spec["url"])
    finish = Path(spec["finish"])
    interval = spec.get("interval", 0.05)
    ids: dict[str, str] = {}
    outcome: dict[str, str] = {}
    registered = threading.Barrier(4)

    def looper():
        try:
            with wd.run(agent="shared-bot", kill_mode="cooperative", guards=False) as run:
                ids["looper"] = run.id
                for _ in range(3):
                    run.record_tool("verify_iban", {"iban": "DE00 0000"}, ok=False, error="timeout")
                registered.wait()
                try:
                    while True:
                        run.record_tool("verify_iban", {"iban": "DE00 0000"}, ok=False, error="timeout")
                        time.sleep(interval)
                except BaseException as exc:  # noqa: BLE001 — an agent that swallows everything
                    if not spec.get("ignore_stop"):
                        raise
                    outcome["looper_caught"] = type(exc).__name__
                    write_json(spec["ready"] + ".caught", {"caught": type(exc).__name__})
                    wait_until(finish.exists, timeout_s=120)
            outcome["looper"] = run.status
        except BaseException as exc:  # noqa: BLE001
            outcome["looper"] = f"{run.status} ({type(exc).__name__})"

    def healthy(name):
        with wd.run(agent="shared-bot", kill_mode="cooperative", guards=False) as run:
            ids[name] = run.id
            registered.wait()
            while not finish.exists():
                run.heartbeat("working")
                time.sleep(interval)
        outcome[name] = run.status

    threads = [threading.Thread(target=looper), threading.Thread(target=healthy, args=("healthy1",)),
               threading.Thread(target=healthy, args=("healthy2",))]
    for t in threads:
        t.start()
    registered.wait()
    write_json(spec["ready"], {"run_ids": ids, "pid": os.getpid(), "children": []})
    for t in threads:
        t.join()
    write_json(spec["result"], outcome)
    wd.close()
    return 0


def spender(spec: dict) -> int:
    """One cooperative run spending `step_cost` EUR every `interval` s (from when the `go` file
    exists) until it is stopped; then, once the `next` file exists, it asks for a new run and
    records whether it was refused."""
    from watchdog import RunKilled, Watchdog

    wd = Watchdog(spec["url"])
    result: dict = {}
    try:
        with wd.run(agent=spec.get("agent", "spend-bot"), kill_mode="cooperative", labels=spec.get("labels"),
                    guards=False) as run:
            run.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=0.0)
            write_json(spec["ready"], {"run_id": run.id, "pid": os.getpid(), "children": []})
            wait_until(Path(spec["go"]).exists, timeout_s=120)
            while True:
                time.sleep(spec.get("interval", 0.05))
                run.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=spec["step_cost"])
    except RunKilled as stop:
        result.update(killed=stop.reason, detail=stop.detail)
    if not wait_until(Path(spec["next"]).exists, timeout_s=120):
        result["next"] = "no next file"
    else:
        try:
            with wd.run(agent=spec.get("agent", "spend-bot"), labels=spec.get("labels"), guards=False) as run:
                run.step(model="gpt-x", tokens_in=1, tokens_out=1, cost_eur=0.0)  # a model call: must never happen
            result["next"] = "ran"
        except RunKilled as stop:
            result["next"] = stop.reason
    wd.close()
    write_json(spec["result"], result)
    return 0


SCENARIOS = {"runaway": runaway, "shared": shared, "spender": spender}


# --- the test side -------------------------------------------------------------------


class Agent:
    def __init__(self, proc: subprocess.Popen, ready: Path, result: Path, log: Path):
        self.proc = proc
        self.ready_path = ready
        self.result_path = result
        self.log_path = log
        self.info: dict = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def run_id(self) -> str:
        return self.info["run_id"]

    @property
    def children(self) -> list[int]:
        return self.info.get("children", [])

    def result(self) -> dict | None:
        return json.loads(self.result_path.read_text()) if self.result_path.exists() else None

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait(self, timeout_s: float = WAIT_S) -> int:
        """The exit code (a negative signal number when killed by a signal)."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent pid {self.pid} still running after {timeout_s} s\n{self.log()}") from None

    def alive(self) -> bool:
        return self.proc.poll() is None


class AgentProcs:
    """Starts agent programs; `close()` kills whatever is left of them."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.agents: list[Agent] = []
        self._known: list[tuple[int, float]] = []  # (pid, create time) of everything started

    def start(self, scenario: str, url: str, *, new_session: bool = True, **spec) -> Agent:
        import psutil

        n = len(self.agents)
        ready, result, log = (self.tmp / f"agent{n}.{ext}" for ext in ("ready", "result", "log"))
        spec = dict(spec, url=url, ready=str(ready), result=str(result))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        env.pop("AGENT_WATCHDOG_CONFIG", None)
        with open(log, "w") as log_f:
            proc = subprocess.Popen([sys.executable, "-m", "agent_procs", scenario, json.dumps(spec)], env=env,
                                    stdout=log_f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=new_session)
        agent = Agent(proc, ready, result, log)
        self.agents.append(agent)
        try:
            self._known.append((proc.pid, psutil.Process(proc.pid).create_time()))
        except psutil.NoSuchProcess:
            pass
        if not wait_until(lambda: ready.exists() or proc.poll() is not None):
            raise AssertionError(f"agent {scenario} not ready after {WAIT_S} s\n{agent.log()}")
        if not ready.exists():
            raise AssertionError(f"agent {scenario} exited {proc.returncode} before it was ready\n{agent.log()}")
        agent.info = json.loads(ready.read_text())
        for pid in agent.children:
            try:
                self._known.append((pid, psutil.Process(pid).create_time()))
            except psutil.NoSuchProcess:
                pass
        return agent

    def close(self) -> None:
        import psutil

        for pid, created in self._known:
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) <= 1e-3:
                    p.kill()
            except psutil.Error:
                pass
        for agent in self.agents:
            try:
                agent.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


if __name__ == "__main__":
    sys.exit(SCENARIOS[sys.argv[1]](json.loads(sys.argv[2])))
