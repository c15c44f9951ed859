"""Hostile review: another local Unix user drives the streamable-HTTP MCP proxy.

`agent-watchdog mcp-proxy --upstream URL --listen 127.0.0.1:PORT --run RUN` witnesses the run of
the user who started it. Any local user can connect to a loopback port: without a check, another
user's (mallory's, made with useradd) tool calls were counted on that run, by the proxy's guards
and in the store, so that the run's owner's next call was refused for a budget mallory spent.
A name is a claim; the loopback socket's owner uid (from /proc/net/tcp) is not: the proxy now
answers only its own Unix user (and root), 403 to anyone else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from attest_support import foreign_python, local_user
from mcp_support import terminate
from test_mcp_proxy import CLI, SERVER, _env, free_port, http_session, store_events, wait_port  # noqa: F401
from watchdog import Watchdog

# The standard library only: another user runs it with an interpreter of its own (the test's venv
# may sit under a directory only root may enter: CI's `mktemp -d`), with no site-packages of ours.
MALLORY_SCRIPT = textwrap.dedent("""
    import json, sys, urllib.error, urllib.request
    url = sys.argv[1]
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}

    def post(body):
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=h, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                return r.status, r.headers.get("mcp-session-id")
        except urllib.error.HTTPError as e:
            return e.code, None

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "m", "version": "1"}}}
    status, sid = post(init)
    out = {"initialize": status, "calls": []}
    if status == 200 and sid:
        h["mcp-session-id"] = sid
        post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for i in range(4):
            call = {"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                    "params": {"name": "search", "arguments": {"q": f"spend {i}"}}}
            out["calls"].append(post(call)[0])
    print(json.dumps(out))
""")


@pytest.fixture
def mallory():
    with local_user("mallory") as name:
        yield name


def test_another_unix_users_calls_through_the_http_proxy_never_count_on_its_run(tmp_path, sqlite_url, mallory):
    env = _env(tmp_path, sqlite_url)
    wd = Watchdog(sqlite_url, attest_socket="")
    run = wd.run(agent="victim", max_tool_calls=3)
    run.start()
    sport, pport = free_port(), free_port()
    server = subprocess.Popen([sys.executable, SERVER, "http", str(sport)], env=env, stderr=subprocess.DEVNULL)
    proxy = None
    try:
        wait_port(sport, server)
        proxy = subprocess.Popen([*CLI, "mcp-proxy", "--run", run.id, "--upstream", f"http://127.0.0.1:{sport}/mcp",
                                  "--listen", f"127.0.0.1:{pport}"], env=env, stderr=subprocess.DEVNULL)
        wait_port(pport, proxy)
        url = f"http://127.0.0.1:{pport}/mcp"
        done = subprocess.run(["setpriv", f"--reuid={mallory}", f"--regid={mallory}", "--clear-groups",
                               foreign_python()[0], "-I", "-c", MALLORY_SCRIPT, url], capture_output=True, text=True, timeout=120,
                              env={"PATH": os.environ["PATH"], "HOME": "/tmp"}, cwd="/")
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["initialize"] == 403, seen  # another user's session is never opened
        assert not [e for e in store_events(sqlite_url, run.id) if e.source == "mcp"]

        async def own() -> list[bool]:  # the run's own user: its calls go through, within its budget
            async with http_session(url) as s:
                return [(await s.call_tool("search", {"q": f"own {i}"})).is_error for i in range(3)]

        assert anyio.run(own) == [False, False, False]
    finally:
        terminate(proxy, server)
        run.end("completed", None, None)
        wd.close()
