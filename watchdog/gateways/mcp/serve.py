"""The two ways `agent-watchdog mcp-proxy` is put in front of a server, on the mcp SDK's transports.

- stdio: the client starts the proxy as if it were the server; the proxy starts the server
  (`stdio_client`, which ends the server's whole process tree when the proxy leaves) and relays
  its own stdin/stdout (`stdio_server`). The client leaving (EOF), SIGTERM, SIGINT or SIGHUP ends
  the server too: the proxy never keeps a server alive for nobody.
- streamable HTTP: the proxy listens on 127.0.0.1:PORT; each client session (its own
  mcp-session-id, made by the SDK's server transport) gets its own session upstream and its own
  witness, hence its own run.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable
from typing import Any

import anyio
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.transport_security import TransportSecuritySettings

from watchdog.gateways.mcp.relay import Relay
from watchdog.gateways.mcp.witness import ToolWitness

log = logging.getLogger("watchdog.gateways.mcp")

Witnesses = Callable[[str | None], ToolWitness]  # a new witness for a client (its tag)
FORWARD_HEADERS = ("authorization",)
SESSION_IDLE_S = 1800.0  # an HTTP session nobody uses for this long is closed (its run ends)


SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


async def serve_stdio(witnesses: Witnesses, command: str, args: list[str]) -> None:
    witness = witnesses(None)
    params = StdioServerParameters(command=command, args=args, env=dict(os.environ))
    signalled = False
    relay = Relay(witness)
    with anyio.open_signal_receiver(*SIGNALS) as signals:  # before the server starts: no signal is missed
        async with stdio_server() as (client_read, client_write):
            async with anyio.create_task_group() as tg:
                async def on_signal() -> None:
                    nonlocal signalled
                    async for _ in signals:
                        signalled = True
                        tg.cancel_scope.cancel()
                        return

                tg.start_soon(on_signal)
                try:
                    async with stdio_client(params, errlog=sys.stderr) as (server_read, server_write):
                        await relay.run(client_read, client_write, server_read, server_write)
                finally:  # the server is gone (stdio_client ends its process tree): end the run
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(witness.close)
                tg.cancel_scope.cancel()
            if getattr(relay, "server_left", False) and not signalled:
                # issue 36: a server that dies (at start, or later) is a failure the client's
                # launcher must see, not exit 0; the client's stdin may stay open: leave now.
                print(f"agent-watchdog mcp-proxy: the server {command!r} exited on its own (crashed?); "
                      "see its output above", file=sys.stderr, flush=True)
                os._exit(1)
            if signalled:
                # The transport's stdin reader may sit in a blocking read for ever; the server is
                # gone and the run is written: leave now.
                sys.stderr.flush()
                os._exit(0)


class HttpProxy:
    """An ASGI app: one relay (and one witness) per client session, each with its own session upstream."""

    def __init__(self, witnesses: Witnesses, upstream: str, security: TransportSecuritySettings | None = None):
        self.witnesses = witnesses
        self.upstream = upstream
        self.security = security
        self.sessions: dict[str, StreamableHTTPServerTransport] = {}
        self.tg: Any = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if not own_user(scope):
            await _json_error(send, 403, "Forbidden: this proxy answers only the Unix user that started it")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        sid = headers.get(MCP_SESSION_ID_HEADER)
        if sid is not None:
            transport = self.sessions.get(sid)
            if transport is None:
                await _json_error(send, 404, "Session not found")
                return
            await transport.handle_request(scope, receive, send)
            if transport.is_terminated:
                self.sessions.pop(sid, None)
            return
        transport = StreamableHTTPServerTransport(mcp_session_id=uuid.uuid4().hex, idle_timeout=SESSION_IDLE_S,
                                                  security_settings=self.security)
        assert transport.mcp_session_id is not None
        self.sessions[transport.mcp_session_id] = transport
        # The client's credentials for the server go on to it (the proxy itself never keeps them).
        forward = {k: v for k, v in headers.items() if k in FORWARD_HEADERS}
        await self.tg.start(self._session, transport, forward)
        status: list[int] = []

        async def watch(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await transport.handle_request(scope, receive, watch)
        finally:
            if not status or status[0] >= 400:  # no session was opened (not an initialize, bad body...)
                self.sessions.pop(transport.mcp_session_id, None)
                with anyio.CancelScope(shield=True):
                    await transport.terminate()

    async def _session(self, transport: StreamableHTTPServerTransport, forward: dict[str, str], *,
                       task_status=anyio.TASK_STATUS_IGNORED):
        sid = transport.mcp_session_id
        witness = self.witnesses(sid[:8] if sid else None)
        try:
            async with transport.connect() as (client_read, client_write):
                task_status.started()
                scope = transport.idle_scope or anyio.CancelScope()
                with scope:
                    http = create_mcp_http_client(headers=forward) if forward else None
                    async with streamable_http_client(self.upstream, http_client=http) as (server_read, server_write,
                                                                                           *_):
                        await Relay(witness, http=True).run(client_read, client_write, server_read, server_write)
        except Exception as exc:  # noqa: BLE001 — one session's failure never stops the proxy
            log.warning("agent-watchdog mcp-proxy: session %s ended: %s: %s", (sid or "")[:8], type(exc).__name__,
                        str(exc).splitlines()[0][:200] if str(exc) else "")
        finally:
            self.sessions.pop(sid or "", None)
            if not transport.is_terminated:
                with anyio.CancelScope(shield=True):
                    await transport.terminate()
            await anyio.to_thread.run_sync(witness.close)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def own_user(scope: dict) -> bool:
    """The client's socket is this process's Unix user's (or root's), as the kernel names it
    (/proc/net/tcp): another local user's calls would count on this proxy's runs. A client the
    kernel does not place on this host (a non-loopback --listen) is not looked up here."""
    from watchdog.daemon.otlp.sender import peer

    client, server = scope.get("client"), scope.get("server")
    if not client or not server:
        return False
    found = peer((str(client[0]), int(client[1])), (str(server[0]), int(server[1])))
    uid = found.uid
    if found.closed:  # a local socket that already closed: whose it was, the kernel no longer says
        return False
    if uid is None:  # not found: only a peer beyond this host may be unknown to its kernel
        try:
            return not ipaddress.ip_address(str(client[0]).split("%", 1)[0]).is_loopback
        except ValueError:
            return False
    return uid in (os.getuid(), 0)


async def _json_error(send, status: int, message: str) -> None:
    body = ('{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"%s"}}' % message).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def loopback_only(host: str, port: int) -> TransportSecuritySettings | None:
    """On a loopback address, only pages of that address may talk to the proxy (a web page
    elsewhere could otherwise reach it through DNS rebinding); on any other address, no check
    (the operator chose to expose it, and was warned)."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("agent-watchdog mcp-proxy: listening on %s, not on loopback: anyone who can reach it can "
                    "call the server's tools", host)
        return None
    hosts = [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=[f"http://{h}" for h in hosts])


async def serve_http(witnesses: Witnesses, upstream: str, host: str, port: int) -> None:
    import uvicorn

    proxy = HttpProxy(witnesses, upstream, loopback_only(host, port))
    config = uvicorn.Config(proxy, host=host, port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        proxy.tg = tg
        tg.start_soon(_stop_on_signal, server)
        # uvicorn's serve() would take SIGTERM for itself and re-raise it after shutdown, before the
        # sessions' runs are ended: the proxy handles the signals (above) and serves without that.
        await server._serve()
        tg.cancel_scope.cancel()


async def _stop_on_signal(server) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            server.should_exit = True
            return
