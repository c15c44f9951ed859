"""A small real MCP server for the proxy tests (the mcp SDK's MCPServer), over stdio or HTTP.

Tools: `search` (answers), `flaky` (always fails), `echo`. Each call it really receives is
appended to the file named by $MCP_TEST_LOG, so a test can tell a refused call never reached it.

    python tests/mcp_server.py            # stdio
    python tests/mcp_server.py http PORT  # streamable HTTP on 127.0.0.1:PORT/mcp
"""

from __future__ import annotations

import json
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("watchdog-test-server")


def _log(tool: str, args: dict) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": tool, "args": args}) + "\n")


@server.tool()
def search(q: str) -> str:
    """Search the knowledge base."""
    _log("search", {"q": q})
    return f"3 results for {q}"


@server.tool()
def flaky(n: int = 0) -> str:
    """A tool whose backend is down."""
    _log("flaky", {"n": n})
    raise ToolError("503 backend unavailable")


@server.tool()
def echo(text: str) -> str:
    """Say it back."""
    _log("echo", {"text": text})
    return text


if __name__ == "__main__":
    if os.environ.get("MCP_TEST_PIDFILE"):
        with open(os.environ["MCP_TEST_PIDFILE"], "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
