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


def sigterm_pending(pid: int) -> bool:
    """SIGTERM queued for pid (blocked, so still pending): exact proof that it was sent."""
    mask = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            mask |= int(line.split()[1], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


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


def _log_signals(path: str) -> None:
    """SIGTERM and SIGUSR1 (the test's sentinel) each append their name to `path` and are
    otherwise ignored: the file says how many of each the process received, in order."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def logged(signum, _frame):
        os.write(fd, f"{signal.Signals(signum).name}\n".encode())

    signal.signal(signal.SIGTERM, logged)
    signal.signal(signal.SIGUSR1, logged)


def runaway(spec: dict) -> int:
    """One run: `steps` steps, `tools` tool calls, then `then`:
    hang (stop writing and sleep), loop (a step every `interval` s until stopped),
    exit (die without ending the run), attest_then_hang (heartbeat every `interval` s
    until the daemon has attested the run, then hang). Options: ignore_sigterm,
    block_sigterm, signal_log (a file: each SIGTERM / SIGUSR1 received, a line),
    children (a chain of that depth: a child, a grandchild...),
    children_ignore_sigterm, attest_retry_s (how often an unattested run asks again)."""
    from watchdog import RunKilled, Watchdog

    if spec.get("attest_retry_s"):
        import watchdog.sdk.attest as attest

        attest.RETRY_S = spec["attest_retry_s"]

    if spec.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if spec.get("signal_log"):  # each SIGTERM / SIGUSR1 received, one line each: signals counted, not guessed
        _log_signals(spec["signal_log"])
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
            write_json(spec["ready"], {"run_id": run.id, "pid": os.getpid(), "children": children,
                                       "attested": run.attested})
            then = spec.get("then", "hang")
            if then == "attest_then_hang":
                while not run.attested:
                    run.heartbeat("waiting for the daemon")
                    time.sleep(spec.get("interval", 0.05))
                then = "hang"
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


def pauser(spec: dict) -> int:
    """Runs in threads of this one process (`runs`: a list of run specs), each: `before` steps,
    then (once its `gate` file exists) `after` more steps, one every `interval` s; or, with
    `beat`, heartbeats until the `finish` file exists. Each counts its records in the
    result: {name: {"status", "reason", "records"}}. With on_breach = "pause" in the daemon's
    profile a run over max_steps is held at its next record until resumed or stopped."""
    from watchdog import RunKilled, Watchdog

    wd = Watchdog(spec["url"])
    outcome: dict[str, dict] = {}
    ids: dict[str, str] = {}
    registered = threading.Barrier(len(spec["runs"]) + 1)
    finish = Path(spec.get("finish", spec["ready"] + ".finish"))

    def one(r):
        name = r["name"]
        records = 0
        run = wd.run(agent=r.get("agent", "bot"), kill_mode=r.get("kill_mode", "cooperative"), guards=False,
                     **r.get("budgets", {}))
        try:
            with run:
                ids[name] = run.id
                for _ in range(r.get("before", 0)):
                    run.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=r.get("step_cost", 0.0))
                    records += 1
                registered.wait()
                if r.get("beat"):
                    while not finish.exists():
                        run.heartbeat("working")
                        records += 1
                        time.sleep(r.get("interval", 0.05))
                else:
                    wait_until(Path(r["gate"]).exists, timeout_s=120)
                    for _ in range(r.get("after", 0)):
                        run.step(model="gpt-x", tokens_in=10, tokens_out=5)
                        records += 1
                        time.sleep(r.get("interval", 0.05))
            outcome[name] = {"status": run.status, "reason": None, "records": records}
        except RunKilled as stop:
            outcome[name] = {"status": run.status, "reason": stop.reason, "records": records}

    threads = [threading.Thread(target=one, args=(r,)) for r in spec["runs"]]
    for t in threads:
        t.start()
    registered.wait()
    write_json(spec["ready"], {"run_ids": ids, "pid": os.getpid(), "children": []})
    for t in threads:
        t.join()
    write_json(spec["result"], outcome)
    wd.close()
    return 0


def family(spec: dict) -> int:
    """A parent run with child runs (run.child), all in this process.

    `loop`: child "looper" calls one tool with the same arguments until it is stopped (the
    parent catches that and goes on), then child "sibling" makes two steps, then the parent
    one more step and completes. `overspend`: two children opened together each make one
    step of `child_cost`, then heartbeat until stopped; so does the parent."""
    from watchdog import RunKilled, Watchdog

    wd = Watchdog(spec["url"])
    outcome: dict = {}
    ids: dict = {}
    mode = spec["mode"]
    interval = spec.get("interval", 0.05)
    try:
        with wd.run(agent="planner", kill_mode=spec.get("kill_mode", "cooperative"), guards=False,
                    **spec.get("budgets", {})) as parent:
            ids["parent"] = parent.id
            parent.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=spec.get("parent_cost", 0.1))
            if mode == "loop":
                try:
                    with parent.child("researcher", **spec.get("child_budgets", {})) as looper:
                        ids["looper"] = looper.id
                        looper.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=spec.get("child_cost", 0.2))
                        for _ in range(3):
                            looper.record_tool("search", {"q": "same"})
                        write_json(spec["ready"], {"run_ids": ids, "pid": os.getpid(), "children": []})
                        while True:
                            looper.record_tool("search", {"q": "same"})
                            time.sleep(interval)
                except RunKilled as stop:
                    outcome["looper"] = {"status": looper.status, "reason": stop.reason}
                with parent.child("writer") as sibling:
                    ids["sibling"] = sibling.id
                    for _ in range(2):
                        sibling.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=spec.get("child_cost", 0.2))
                outcome["sibling"] = {"status": sibling.status, "reason": None}
                parent.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=spec.get("parent_cost", 0.1))
                write_json(spec["ready"] + ".ids", ids)
            else:  # overspend
                kids = [parent.child(name, **spec.get("child_budgets", {})) for name in ("a", "b")]
                for kid in kids:
                    ids[kid.agent] = kid.id
                spent = threading.Barrier(len(kids) + 1)

                def spend(kid):
                    try:
                        with kid:
                            kid.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=spec["child_cost"])
                            spent.wait()
                            while True:
                                kid.heartbeat("researching")
                                time.sleep(interval)
                    except RunKilled as stop:
                        outcome[kid.agent] = {"status": kid.status, "reason": stop.reason, "detail": stop.detail}

                threads = [threading.Thread(target=spend, args=(k,)) for k in kids]
                for t in threads:
                    t.start()
                spent.wait()
                write_json(spec["ready"], {"run_ids": ids, "pid": os.getpid(), "children": []})
                for t in threads:
                    t.join()
                while True:
                    parent.heartbeat("waiting for the children")
                    time.sleep(interval)
        outcome["parent"] = {"status": parent.status, "reason": None, "cost_eur": parent.cost_eur}
    except RunKilled as stop:
        outcome["parent"] = {"status": parent.status, "reason": stop.reason, "cost_eur": parent.cost_eur}
    write_json(spec["result"], outcome)
    wd.close()
    return 0


def long_tool(spec: dict) -> int:
    """One run calls a tool that works for up to 60 s, polling `run.cancelled`; stopped, it stores
    a partial result and returns early. Writes when the tool returned (time.time()) and how."""
    from watchdog import RunKilled, Watchdog

    wd = Watchdog(spec["url"])
    returned = {}
    try:
        with wd.run(agent="scanner", kill_mode=spec.get("kill_mode", "cooperative"), guards=False) as run:
            parent = run
            if spec.get("child"):
                child_cm = run.child("reader")
                run = child_cm.start()
            run.step(model="gpt-x", tokens_in=10, tokens_out=5)

            def scan(path):
                for i in range(1200):
                    if run.cancelled.is_set():
                        run.partial(f"scanned {i} of 1200 files")
                        returned.update(at=time.time(), cancelled=True, files=i)
                        return {"files": i}
                    time.sleep(0.05)
                returned.update(at=time.time(), cancelled=False)
                return {"files": 1200}

            write_json(spec["ready"], {"run_id": parent.id, "child_id": run.id if run is not parent else None,
                                       "pid": os.getpid(), "children": []})
            try:
                run.tool_call("scan_archive", {"path": "/srv/archive"}, scan)
            finally:
                if run is not parent:
                    run.__exit__(*sys.exc_info())
    except RunKilled as stop:
        returned.update(reason=stop.reason)
    write_json(spec["result"], returned)


def steady(spec: dict) -> int:
    """One healthy run: `steps` steps and tool calls, then (ready) wait for the `go` file so
    that every agent of a test holds its connections at once, then as many again; complete.
    The result says what the SDK could not write (buffered, dropped, rejected)."""
    from watchdog import Watchdog

    wd = Watchdog(spec["url"], pool_size=spec.get("pool_size", 2))
    go = Path(spec["go"])
    n = spec.get("steps", 10)
    with wd.run(agent=spec.get("agent", "steady"), kill_mode="cooperative", guards=False) as run:
        for i in range(n):
            run.step(model="gpt-x", tokens_in=10, tokens_out=5)
            run.tool_call("lookup", {"i": i}, lambda i: i, read_only=False)
        write_json(spec["ready"], {"run_id": run.id, "pid": os.getpid(), "children": []})
        if not wait_until(go.exists, timeout_s=120):
            raise SystemExit("no go file")
        for i in range(n):
            run.step(model="gpt-x", tokens_in=10, tokens_out=5)
            run.tool_call("lookup", {"i": n + i}, lambda i: i, read_only=False)
    write_json(spec["result"], {"status": run.status, "buffered": wd.buffered, "dropped": wd.dropped_events,
                                "rejected": wd.rejected_events, "open_connections": wd.writer.open_connections})
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


def healthy(spec: dict) -> int:
    """One healthy run (issue 32's victims): a step, attested, then quiet (a heartbeat every
    `interval` s) until the `go` file exists; it ends its run and exits 0 by itself — unless a
    signal killed it. A cooperative stop meanwhile is recorded in the result, not an error."""
    from watchdog import RunKilled, Watchdog

    wd = Watchdog(spec["url"])
    result: dict = {}
    try:
        with wd.run(agent=spec.get("agent", "bot"), kill_mode="process", guards=False,
                    **spec.get("budgets", {})) as run:
            run.step(model="gpt-x", tokens_in=10, tokens_out=5, cost_eur=spec.get("step_cost", 0.0))
            while not run.attested:
                run.heartbeat("waiting for the daemon")
                time.sleep(spec.get("interval", 0.05))
            write_json(spec["ready"], {"run_id": run.id, "pid": os.getpid(), "children": [], "attested": True})
            wait_until(Path(spec["go"]).exists, timeout_s=120)
    except RunKilled as stop:
        result.update(stopped=stop.reason)
    finally:
        wd.close()
    write_json(spec["result"], result)
    return 0


SCENARIOS = {"runaway": runaway, "healthy": healthy, "shared": shared, "spender": spender, "steady": steady, "pauser": pauser,
             "family": family, "long_tool": long_tool}


# --- the test side -------------------------------------------------------------------


def as_host(host: str, argv: list[str]) -> list[str]:
    """argv run as a process of host `host`: a new UTS namespace with that hostname (root only).
    unshare and sh exec in place, so the pid returned by Popen is the program's own."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]


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

    def start(self, scenario: str, url: str, *, new_session: bool = True, user: str | None = None,
              wait: bool = True, host: str | None = None, env: dict | None = None, **spec) -> Agent:
        """`user`: run the agent as that local user (the folder must be writable by it).
        `host`: run it in a UTS namespace of its own with that hostname (root only): a
        simulated host. `wait=False`: return at once (then `ready()` the agent)."""
        import psutil

        n = len(self.agents)
        ready, result, log = (self.tmp / f"agent{n}.{ext}" for ext in ("ready", "result", "log"))
        spec = dict(spec, url=url, ready=str(ready), result=str(result))
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), full_env.get("PYTHONPATH")]))
        full_env.pop("AGENT_WATCHDOG_CONFIG", None)
        exe = sys.executable
        if user is not None:
            from attest_support import foreign_python

            exe, foreign = foreign_python()
            full_env.update(PYTHONPATH=foreign["PYTHONPATH"], PYTHONNOUSERSITE="1", HOME="/tmp")
        full_env.update(env or {})
        argv = [exe, "-m", "agent_procs", scenario, json.dumps(spec)]
        if host is not None:
            argv = as_host(host, argv)
        with open(log, "w") as log_f:
            proc = subprocess.Popen(argv, env=full_env,
                                    stdout=log_f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=new_session, user=user, cwd="/tmp" if user else None)
        agent = Agent(proc, ready, result, log)
        self.agents.append(agent)
        try:
            self._known.append((proc.pid, psutil.Process(proc.pid).create_time()))
        except psutil.NoSuchProcess:
            pass
        if wait:
            self.ready(agent)
        return agent

    def ready(self, agent: Agent, timeout_s: float = WAIT_S) -> Agent:
        import psutil

        ready, proc = agent.ready_path, agent.proc
        if not wait_until(lambda: ready.exists() or proc.poll() is not None, timeout_s):
            raise AssertionError(f"agent not ready after {timeout_s} s\n{agent.log()}")
        if not ready.exists():
            raise AssertionError(f"agent exited {proc.returncode} before it was ready\n{agent.log()}")
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
