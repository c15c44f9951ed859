"""The MCP proxy's test kit: a real MCP client session through `agent-watchdog mcp-proxy` (stdio)
in front of the real server tests/mcp_server.py, and what that server really received."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")


@asynccontextmanager
async def stdio_session(env, *extra, errlog=None):
    """A client session through the proxy (options `extra`); the proxy's stderr to `errlog`."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "watchdog.cli", "mcp-proxy", *extra, "--", sys.executable, SERVER],
                                   env=env)
    async with stdio_client(params, **({"errlog": errlog} if errlog is not None else {})) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def text(result) -> str:
    return result.content[0].text


def calls_seen(env, tool=None) -> int:
    """The calls the server received (it logs each to $MCP_TEST_LOG)."""
    path = Path(env["MCP_TEST_LOG"])
    if not path.exists():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return sum(1 for c in lines if tool is None or c["tool"] == tool)


def terminate(*procs: "subprocess.Popen | None") -> None:
    """SIGTERM each process still running (a proxy, an upstream server), SIGKILL if it lingers."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
