"""What the gateways add to a call, measured against the same call without them in the same run.

- MCP: a tools/call to tests/mcp_server.py over stdio, direct vs through `agent-watchdog mcp-proxy`
  (a SQLite store; each call admitted and recorded).
- LiteLLM: a chat completion (a mock_response model) through `litellm --config`, without and with
  the callback (each call a step of a traced run).

    python benchmarks/bench_gateways.py [--calls N] [--skip-litellm]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
SERVER = str(ROOT / "tests" / "mcp_server.py")
KEY = "sk-watchdog-bench-0123456789abcdef"


def store(folder: Path) -> str:
    from watchdog.store import access
    from watchdog.store.engine import make_engine

    url = f"sqlite:///{folder / 'runs.db'}"
    engine = make_engine(url)
    access.upgrade(engine)
    engine.dispose()
    return url


async def mcp_times(direct: list[str], proxied: list[str], calls: int, env: dict) -> tuple[list, list]:
    """Both sessions open at once, calls alternating between them: the machine's noise hits both alike."""
    from contextlib import AsyncExitStack

    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async with AsyncExitStack() as stack:
        sessions = []
        for command in (direct, proxied):
            r, w = await stack.enter_async_context(
                stdio_client(StdioServerParameters(command=command[0], args=command[1:], env=env)))
            s = await stack.enter_async_context(ClientSession(r, w))
            await s.initialize()
            sessions.append(s)
        out: tuple[list, list] = ([], [])
        for i in range(calls + 5):
            for k, s in enumerate(sessions):
                t0 = time.perf_counter()
                await s.call_tool("echo", {"text": f"call {i}"})  # distinct arguments: no loop
                if i >= 5:  # warm-up
                    out[k].append(time.perf_counter() - t0)
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_litellm(folder: Path, env: dict, callback: bool):
    cfg = folder / f"litellm-{callback}.yaml"
    cfg.write_text(
        "model_list:\n  - model_name: gpt-4o\n    litellm_params:\n      model: openai/gpt-4o\n"
        "      api_key: sk-not-used\n      mock_response: hi\n"
        + ('litellm_settings:\n  callbacks: ["watchdog.integrations.litellm.proxy_handler"]\n' if callback else "")
        + f"general_settings:\n  master_key: {KEY}\n")
    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("litellm")), "--config", str(cfg), "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def wait_up(proc, base: str) -> None:
    import httpx

    end = time.monotonic() + 240
    while True:
        try:
            if httpx.get(f"{base}/health/liveliness", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > end or proc.poll() is not None:
            raise SystemExit("the LiteLLM proxy did not start")
        time.sleep(0.3)


def litellm_times(folder: Path, env: dict, calls: int) -> tuple[list, list]:
    """Two proxies (without, with the callback) up at once, calls alternating between them."""
    import openai

    procs = [start_litellm(folder, env, cb) for cb in (False, True)]
    try:
        for proc, base in procs:
            wait_up(proc, base)
        clients = [openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0) for _, base in procs]
        out: tuple[list, list] = ([], [])
        for i in range(calls + 5):
            for k, client in enumerate(clients):
                t0 = time.perf_counter()
                client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                               extra_headers={"x-litellm-trace-id": f"bench-{k}-{i // 4}"})
                if i >= 5:
                    out[k].append(time.perf_counter() - t0)
        return out
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def row(name: str, base: list[float], other: list[float]) -> str:
    b, o = statistics.median(base), statistics.median(other)
    return f"| {name} | {b * 1e3:.2f} | {o * 1e3:.2f} | {(o - b) * 1e3:+.2f} | {o / b:.2f}x |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--skip-litellm", action="store_true")
    a = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-gw-"))
    cfg = folder / "watchdog.toml"
    cfg.write_text("[defaults]\nmax_tool_calls = 100000\nmax_steps = 100000\nmax_identical_calls = 100000\n")
    env = {**os.environ, "AGENT_WATCHDOG_DB": store(folder), "AGENT_WATCHDOG_CONFIG": str(cfg),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(ROOT)}
    direct, proxied = anyio.run(mcp_times, [sys.executable, SERVER],
                                [sys.executable, "-m", "watchdog.cli", "mcp-proxy", "--", sys.executable, SERVER],
                                a.calls, env)
    lines = ["| call (median of %d) | baseline ms | through the gateway ms | added ms | ratio |" % a.calls,
             "|---|---|---|---|---|", row("MCP tools/call: direct vs mcp-proxy (stdio)", direct, proxied)]
    if not a.skip_litellm:
        without, with_cb = litellm_times(folder, env, a.calls)
        lines.append(row("LiteLLM chat completion: proxy without vs with the callback", without, with_cb))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
