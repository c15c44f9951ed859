"""agent-watchdog mcp-proxy end to end: a real MCP server (tests/mcp_server.py, the mcp SDK's
MCPServer), a real MCP client (the SDK's ClientSession) through the real proxy process, over
stdio and streamable HTTP, on a real store; the daemon is a real Ticker with the clock passed in."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import select

from daemon_support import config as daemon_config
from mcp_support import SERVER, calls_seen, stdio_session, terminate, text
from watchdog import Watchdog
from watchdog.daemon.stops.circuits import CircuitBreakers
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.schema import events, runs

CLI = [sys.executable, "-m", "watchdog.cli"]
DEADLINE_S = 30.0

CONFIG_TOML = """
[daemon]
tick_s = 0.2

[defaults]
max_identical_calls = 3
max_tool_calls = 40

[circuit]
errors = 3
window_s = 60
open_s = 60
"""


def _env(tmp_path, db_url):
    cfg = tmp_path / "watchdog.toml"
    cfg.write_text(CONFIG_TOML)
    e = {k: v for k, v in os.environ.items() if k != "AGENT_WATCHDOG_RUN"}
    e.update(AGENT_WATCHDOG_DB=db_url, AGENT_WATCHDOG_CONFIG=str(cfg), MCP_TEST_LOG=str(tmp_path / "calls.jsonl"),
             MCP_TEST_PIDFILE=str(tmp_path / "pids"), PYTHONPATH=str(Path(__file__).parents[2]))
    return e


@pytest.fixture
def env(tmp_path, sqlite_url):
    """The proxy's environment on a SQLite store (most tests: each proxy is a process start)."""
    return _env(tmp_path, sqlite_url)


@pytest.fixture
def env_both(tmp_path, db_url):
    """The same on each backend (SQLite, PostgreSQL)."""
    return _env(tmp_path, db_url)


@pytest.fixture
def url(env):
    return env["AGENT_WATCHDOG_DB"]


@pytest.fixture
def sqlite_engine(url):
    from watchdog.store.engine import make_engine

    engine = make_engine(url)
    yield engine
    engine.dispose()


def store_runs(db_url) -> list:
    from watchdog.store.engine import make_engine

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(runs).order_by(runs.c.started_at)).all()
    finally:
        engine.dispose()


def store_events(db_url, run_id=None) -> list:
    from watchdog.store.engine import make_engine

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            q = select(events).order_by(events.c.id)
            if run_id is not None:
                q = q.where(events.c.run_id == run_id)
            return conn.execute(q).all()
    finally:
        engine.dispose()


def wait_for(predicate, what: str, deadline_s: float = DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# -- stdio ---------------------------------------------------------------------------------------

def test_identical_search_calls_refused_at_max_identical_calls(env_both, db_url):
    env = env_both
    async def main():
        async with stdio_session(env) as s:
            tools = await s.list_tools()  # passes through unchanged: the server's own tools
            assert {t.name for t in tools.tools} == {"search", "flaky", "echo"}
            first = await s.call_tool("search", {"q": "refund"})
            second = await s.call_tool("search", {"q": "refund"})
            third = await s.call_tool("search", {"q": "refund"})
            return first, second, third

    first, second, third = anyio.run(main)
    assert not first.is_error and text(first) == "3 results for refund"
    assert not second.is_error
    assert third.is_error
    assert text(third).startswith("agent-watchdog: run stopped: loop_detected")
    assert "search" in text(third) and "max_identical_calls 3" in text(third)
    assert calls_seen(env, "search") == 2  # the refused call never reached the server
    (run,) = store_runs(db_url)
    assert run.source == "mcp" and run.agent == "mcp-proxy"
    assert run.stop_reason == "loop_detected" and run.tool_calls == 2
    assert run.status == "killed"  # the client left: the stopped run ended


def test_circuit_opened_across_two_proxies_refuses_without_reaching_the_server(env, url, sqlite_engine, sealer):
    config = daemon_config(daemon={"tick_s": 0.2}, circuit={"errors": 3, "window_s": 60, "open_s": 60},
                           defaults={"max_identical_calls": 100})
    ticker = Ticker(sqlite_engine, config, Killer(), circuits=CircuitBreakers(config, sealer=sealer), sealer=sealer)

    async def main():
        async with stdio_session(env, "--agent", "a") as one, stdio_session(env, "--agent", "b") as two:
            for n in range(2):
                assert (await one.call_tool("flaky", {"n": n})).is_error
                assert (await two.call_tool("flaky", {"n": 10 + n})).is_error
            await anyio.to_thread.run_sync(lambda: ticker.tick(dt.datetime.now(dt.timezone.utc)))
            await anyio.sleep(0.5)  # past the proxies' circuit cache (one tick_s)
            refused = await two.call_tool("flaky", {"n": 99})
            other = await one.call_tool("search", {"q": "still fine"})
            return refused, other

    refused, other = anyio.run(main)
    assert refused.is_error and text(refused).startswith("agent-watchdog: tool unavailable")
    assert "flaky" in text(refused) and "circuit" in text(refused)
    assert calls_seen(env, "flaky") == 4  # the fifth never reached the server
    assert not other.is_error  # one tool, never everything


def test_circuit_opened_by_sdk_runs_refuses_in_the_proxy(env, url, sqlite_engine, sealer):
    config = daemon_config(circuit={"errors": 3, "window_s": 60, "open_s": 60},
                           defaults={"max_identical_calls": 100})
    ticker = Ticker(sqlite_engine, config, Killer(), circuits=CircuitBreakers(config, sealer=sealer), sealer=sealer)
    wd = Watchdog(url, circuit_cache_s=0, attest_socket="")
    try:
        with wd.run(agent="sdk-agent") as run:
            for n in range(3):
                with pytest.raises(RuntimeError):
                    run.tool_call("flaky", {"n": n}, lambda **_: (_ for _ in ()).throw(RuntimeError("503")))
            ticker.tick(dt.datetime.now(dt.timezone.utc))
    finally:
        wd.close()

    async def main():
        async with stdio_session(env) as s:
            return await s.call_tool("flaky", {"n": 7})

    refused = anyio.run(main)
    assert refused.is_error and text(refused).startswith("agent-watchdog: tool unavailable")
    assert calls_seen(env, "flaky") == 0


def test_kill_refuses_the_next_call_naming_the_reason(env, url):
    async def main():
        async with stdio_session(env) as s:
            assert not (await s.call_tool("search", {"q": "a"})).is_error
            (run,) = await anyio.to_thread.run_sync(store_runs, url)
            done = await anyio.to_thread.run_sync(lambda: subprocess.run(
                [*CLI, "kill", run.id], env=env, capture_output=True, text=True, timeout=60))
            assert done.returncode == 0, done.stderr
            return run.id, await s.call_tool("search", {"q": "b"})

    run_id, refused = anyio.run(main)
    assert refused.is_error
    assert text(refused).startswith("agent-watchdog: run stopped: manual")
    assert calls_seen(env, "search") == 1
    assert [r.id for r in store_runs(url)] == [run_id]


def test_joins_the_run_it_is_given_and_never_updates_its_row(env_both, db_url):
    env = env_both
    wd = Watchdog(db_url, attest_socket="")
    try:
        with wd.run(agent="support-bot") as run:
            run.step(model="gpt-x", tokens_in=10, tokens_out=2)

            async def main():
                async with stdio_session({**env, "AGENT_WATCHDOG_RUN": run.id}) as s:
                    a = await s.call_tool("search", {"q": "x"})
                    b = await s.call_tool("flaky", {"n": 1})
                    return a, b

            a, b = anyio.run(main)
            assert not a.is_error and b.is_error
            (row,) = store_runs(db_url)
            assert row.id == run.id and row.tool_calls == 0 and row.source == "sdk"  # the writer's row untouched
            seen = [(e.tool, e.ok, e.source) for e in store_events(db_url, run.id) if e.kind == "tool"]
            assert seen == [("search", True, "mcp"), ("flaky", False, "mcp")]
            assert all(e.call_id and e.call_id.startswith("mcp:") for e in store_events(db_url, run.id)
                       if e.kind == "tool")
            run.step(model="gpt-x", tokens_in=1, tokens_out=1)  # the writer's own numbering still works
    finally:
        wd.close()
    assert store_runs(db_url)[0].steps == 2


def test_malformed_input_is_answered_and_serving_goes_on(env, url):
    proc = subprocess.Popen([*CLI, "mcp-proxy", "--", sys.executable, SERVER], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def send(obj) -> None:
        proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        proc.stdin.flush()

    def answer() -> dict:
        return json.loads(proc.stdout.readline())

    try:
        send("this is {not json")
        parse_error = answer()
        assert parse_error["error"]["code"] == -32700 and parse_error["id"] is None
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "raw", "version": "0"}}})
        init = answer()
        assert init["id"] == 1 and init["result"]["serverInfo"]["name"] == "watchdog-test-server"  # the server's own
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search", "arguments": "q=x"}})
        bad = answer()
        assert bad["id"] == 2 and bad["error"]["code"] == -32602 and "object" in bad["error"]["message"]
        send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
              "params": {"name": "echo", "arguments": {"text": "x" * (2 << 20)}}})
        huge = answer()
        assert huge["id"] == 3 and huge["error"]["code"] == -32602 and "bytes" in huge["error"]["message"]
        send({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "bad\nname", "arguments": {}}})
        assert answer()["error"]["code"] == -32602
        send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "search", "arguments": {"q": "ok"}}})
        good = answer()
        assert good["id"] == 5 and good["result"]["content"][0]["text"] == "3 results for ok"
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=DEADLINE_S) == 0
    assert calls_seen(env) == 1
    tools = [(e.tool, e.ok) for e in store_events(url) if e.kind == "tool"]
    assert tools == [("search", True)]  # nothing of the bad calls reached the store


@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_never_keeps_the_server_alive_after_its_client(env, how):
    proc = subprocess.Popen([*CLI, "mcp-proxy", "--", sys.executable, SERVER], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    pidfile = Path(env["MCP_TEST_PIDFILE"])
    server_pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().split(), "the server")[0])
    assert pid_alive(server_pid)
    if how == "eof":
        proc.stdin.close()
    else:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=DEADLINE_S)
    wait_for(lambda: not pid_alive(server_pid), "the server to be gone")


# -- streamable HTTP -----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc) -> None:
    def up():
        assert proc.poll() is None, "the process died"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait_for(up, f"port {port}")


@pytest.fixture
def http_proxy(env):
    sport, pport = free_port(), free_port()
    server = subprocess.Popen([sys.executable, SERVER, "http", str(sport)], env=env, stderr=subprocess.DEVNULL)
    proxy = None
    try:
        wait_port(sport, server)
        proxy = subprocess.Popen([*CLI, "mcp-proxy", "--upstream", f"http://127.0.0.1:{sport}/mcp",
                                  "--listen", f"127.0.0.1:{pport}"], env=env, stderr=subprocess.DEVNULL)
        wait_port(pport, proxy)
        yield f"http://127.0.0.1:{pport}/mcp"
    finally:
        terminate(proxy, server)


@asynccontextmanager
async def http_session(url):
    async with streamable_http_client(url) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def test_http_sessions_are_runs_with_the_guards(env, url, http_proxy):
    async def main():
        async with AsyncExitStack() as stack:
            one = await stack.enter_async_context(http_session(http_proxy))
            two = await stack.enter_async_context(http_session(http_proxy))
            assert {t.name for t in (await one.list_tools()).tools} == {"search", "flaky", "echo"}
            results = [await one.call_tool("search", {"q": "refund"}) for _ in range(3)]
            other = await two.call_tool("search", {"q": "refund"})
            return results, other

    results, other = anyio.run(main)
    assert [r.is_error for r in results] == [False, False, True]
    assert text(results[2]).startswith("agent-watchdog: run stopped: loop_detected")
    assert not other.is_error and text(other) == "3 results for refund"  # the other session's run is untouched
    rows = wait_for(lambda: (r := store_runs(url)) and all(x.ended_at for x in r) and r, "both runs to end")
    assert len(rows) == 2 and {r.source for r in rows} == {"mcp"}
    assert sorted(r.tool_calls for r in rows) == [1, 2]


def test_http_malformed_body_is_answered_and_serving_goes_on(env, http_proxy):
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    bad = httpx.post(http_proxy, content=b"{not json", headers=headers, timeout=DEADLINE_S)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == -32700
    for body in (b"[1, 2", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call"}', b"\xff\xfe") * 5:
        assert httpx.post(http_proxy, content=body, headers=headers, timeout=DEADLINE_S).status_code >= 400
    unknown = httpx.post(http_proxy, content=b"{}", headers={**headers, "mcp-session-id": "nope"}, timeout=DEADLINE_S)
    assert unknown.status_code == 404
    init = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
            b'"capabilities":{},"clientInfo":{"name":"page","version":"0"}}}')
    rebound = httpx.post(http_proxy, content=init, headers={**headers, "host": "evil.example"}, timeout=DEADLINE_S)
    assert rebound.status_code in (403, 421)  # DNS rebinding: a page of another origin cannot reach it
    foreign = httpx.post(http_proxy, content=init, headers={**headers, "origin": "http://evil.example"},
                         timeout=DEADLINE_S)
    assert foreign.status_code in (403, 421)

    async def main():
        async with http_session(http_proxy) as s:
            return await s.call_tool("echo", {"text": "still serving"})

    assert text(anyio.run(main)) == "still serving"


def test_silence_ends_the_proxys_run_and_the_next_call_starts_another(env, url, tmp_path):
    cfg = tmp_path / "silence.toml"
    cfg.write_text(CONFIG_TOML.replace("[defaults]\n", "[defaults]\nheartbeat_timeout_s = 1.0\n"))

    async def main():
        async with stdio_session({**env, "AGENT_WATCHDOG_CONFIG": str(cfg)}) as s:
            assert not (await s.call_tool("search", {"q": "morning"})).is_error
            await anyio.sleep(1.5)  # longer than heartbeat_timeout_s without a call
            assert not (await s.call_tool("search", {"q": "afternoon"})).is_error
            return await anyio.to_thread.run_sync(store_runs, url)

    during = anyio.run(main)
    assert len(during) == 2 and [r.tool_calls for r in during] == [1, 1]
    assert during[0].status == "completed" and during[0].stop_reason is None  # ended by silence, quietly
    assert during[1].status == "running"
    assert all(r.status == "completed" for r in store_runs(url))  # the client left: the second ended too


def test_a_run_that_does_not_exist_is_said_at_start(env):
    done = subprocess.run([*CLI, "mcp-proxy", "--run", "no-such-run", "--", sys.executable, SERVER], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "--run: the store has no run 'no-such-run'" in done.stderr
    assert calls_seen(env) == 0 and not Path(env["MCP_TEST_PIDFILE"]).exists()  # no server started


def test_tool_call_budget_refuses_the_call_past_it(env, url, tmp_path):
    cfg = tmp_path / "budget.toml"
    cfg.write_text(CONFIG_TOML.replace("max_tool_calls = 40", "max_tool_calls = 2"))

    async def main():
        async with stdio_session({**env, "AGENT_WATCHDOG_CONFIG": str(cfg)}) as s:
            return [await s.call_tool("echo", {"text": str(i)}) for i in range(3)]

    results = anyio.run(main)
    assert [r.is_error for r in results] == [False, False, True]
    assert text(results[2]).startswith("agent-watchdog: run stopped: max_tool_calls")
    assert "answer with what you have" in text(results[2])
    assert calls_seen(env, "echo") == 2


def test_a_server_command_that_cannot_run_is_said_at_start(env):
    done = subprocess.run([*CLI, "mcp-proxy", "--", "/nonexistent/mcp-server"], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 127
    assert "'/nonexistent/mcp-server' is not found" in done.stderr


def test_a_store_outage_fails_open_with_one_warning(env, tmp_path):
    errlog = tmp_path / "proxy.err"
    down = {**env, "AGENT_WATCHDOG_DB": f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere"}

    async def main():
        params = StdioServerParameters(command=sys.executable, env=down,
                                       args=["-m", "watchdog.cli", "mcp-proxy", "--", sys.executable, SERVER])
        with open(errlog, "w") as err:
            async with stdio_client(params, errlog=err) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    return [await s.call_tool("echo", {"text": str(i)}) for i in range(3)]

    results = anyio.run(main)
    assert [r.is_error for r in results] == [False, False, False]  # the tools keep working
    assert calls_seen(env, "echo") == 3
    warnings = [line for line in errlog.read_text().splitlines() if "agent-watchdog" in line and "store" in line]
    assert 1 <= len(warnings) <= 2, warnings  # warned once (the SDK's buffer and the proxy's own line)


def test_a_server_that_crashes_at_start_makes_the_proxy_exit_non_zero(env):
    """issue 36: the proxy exited 0 when its server died at start; the client keeps stdin open."""
    proc = subprocess.Popen([*CLI, "mcp-proxy", "--", "sh", "-c", "echo boom >&2; exit 3"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.wait(timeout=DEADLINE_S)  # stdin still open: the client has not left
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdin.close()
    assert proc.returncode == 1 and out == "", (out, err)
    assert "boom" in err and "the server 'sh' exited on its own" in err, err
