"""The JSON-RPC relay between one MCP client and its server, on the mcp SDK's message streams.

Only `tools/call` requests are looked at: the witness admits or refuses each (a refusal is a
CallToolResult with isError true, worded for the model) and records the server's answer.
Every other message — initialize, tools/list, resources, prompts, notifications, cancellation,
progress, the server's own requests — passes through unchanged. A line that is not JSON gets
JSON-RPC error -32700 (the SDK's own server would drop it silently); a tools/call with
arguments that are not an object, or too large, gets -32602 and goes nowhere.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from pydantic import ValidationError

from watchdog.core.lifecycle import TOOL_MAX_CHARS
from watchdog.core.text import printable
from watchdog.gateways.mcp.witness import Admitted, ServerError, ToolFailed, ToolWitness

log = logging.getLogger("watchdog.gateways.mcp")

# A tools/call's params, serialised, beyond which the call is refused as bad input.
MAX_CALL_BYTES = 1 << 20
# The witness's store work for one call: past this the call passes unguarded (fails open).
ADMIT_DEADLINE_S = 5.0
INVALID_REQUEST, INVALID_PARAMS = -32600, -32602
ERROR_TEXT_MAX_CHARS = 200
PROGRESS_MAX = 10_000


def error(request_id: Any, code: int, message: str) -> SessionMessage:
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id,
                                             error=types.ErrorData(code=code, message=message)))


def refusal(request_id: Any, text: str) -> SessionMessage:
    result = {"content": [{"type": "text", "text": text}], "isError": True}
    return SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result))


def unreadable(exc: Exception) -> SessionMessage:
    """The answer to a line the transport could not read as a JSON-RPC message."""
    if isinstance(exc, ValidationError) and any(e.get("type") == "json_invalid" for e in exc.errors()):
        return error(None, types.PARSE_ERROR, "Parse error: the line is not JSON")
    return error(None, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message")


def bad_call(params: Any) -> str | None:
    """Why a tools/call's params cannot be relayed, or None."""
    if not isinstance(params, dict):
        return "Invalid params: tools/call needs an object with 'name' and 'arguments'"
    name = params.get("name")
    if not isinstance(name, str) or not name or len(name) > TOOL_MAX_CHARS or not printable(name):
        return f"Invalid params: 'name' must be a tool name (printable text, at most {TOOL_MAX_CHARS} characters)"
    args = params.get("arguments")
    if args is not None and not isinstance(args, dict):
        return f"Invalid params: 'arguments' must be an object, got {type(args).__name__}"
    try:
        size = len(json.dumps(params, separators=(",", ":"), default=str))
    except (TypeError, ValueError):
        return "Invalid params: 'arguments' cannot be serialised"
    if size > MAX_CALL_BYTES:
        return f"Invalid params: the call is {size} bytes, more than the proxy relays ({MAX_CALL_BYTES})"
    return None


def outcome(message: types.JSONRPCMessage) -> tuple[bool, Exception | None]:
    """(ok, error) of the server's answer to a tools/call."""
    if isinstance(message, types.JSONRPCError):
        return False, ServerError(f"JSON-RPC error {message.error.code}")
    result = message.result if isinstance(message, types.JSONRPCResponse) else None
    if isinstance(result, dict) and result.get("isError"):
        text = ""
        for item in result.get("content") or ():
            if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
                text = item["text"][:ERROR_TEXT_MAX_CHARS]
                break
        return False, ToolFailed(text or "tool reported failure")
    return True, None


class Relay:
    """Relays one client's session to its server until either side leaves."""

    def __init__(self, witness: ToolWitness, *, http: bool = False):
        self.witness = witness
        self.http = http  # server messages tied to a client request go back on that request's stream
        self.pending: dict[str, Admitted] = {}
        self.progress: dict[str, Any] = {}  # progressToken -> the client's request id

    async def run(self, client_read, client_write, server_read, server_write) -> None:
        self.server_left = False  # the server ended its side first (it exited by itself, or crashed)
        async with anyio.create_task_group() as tg:
            async def from_client():
                await self._from_client(client_read, client_write, server_write)
                tg.cancel_scope.cancel()  # the client left: so does the server

            async def from_server():
                await self._from_server(server_read, client_write)
                self.server_left = True
                tg.cancel_scope.cancel()

            tg.start_soon(from_client)
            tg.start_soon(from_server)
        # The transports' writers drain until their stream closes: close ours, or they wait for ever.
        for stream in (server_write, client_write):
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    async def _from_client(self, client_read, client_write, server_write) -> None:
        async for item in client_read:
            if isinstance(item, Exception):
                await client_write.send(unreadable(item))
                continue
            msg = item.message
            if isinstance(msg, types.JSONRPCRequest):
                token = ((msg.params or {}).get("_meta") or {}).get("progressToken") \
                    if isinstance((msg.params or {}).get("_meta"), dict) else None
                if token is not None:
                    if len(self.progress) >= PROGRESS_MAX:
                        self.progress.clear()  # a client that never finishes its requests stays bounded
                    self.progress[str(token)] = msg.id
                if msg.method == "tools/call":
                    answer = await self._admit(msg)
                    if answer is not None:
                        await client_write.send(answer)
                        continue
            elif isinstance(msg, types.JSONRPCNotification) and msg.method == "notifications/cancelled":
                rid = (msg.params or {}).get("requestId")
                call = self.pending.pop(str(rid), None) if rid is not None else None
                if call is not None:
                    await anyio.to_thread.run_sync(
                        lambda: self.witness.finish(call, ok=False, error=ToolFailed("cancelled by the client")))
            await server_write.send(item)

    async def _admit(self, msg: types.JSONRPCRequest) -> SessionMessage | None:
        """None: relay the call; else the answer to send the client instead."""
        why = bad_call(msg.params)
        if why is not None:
            return error(msg.id, INVALID_PARAMS, why)
        params = msg.params or {}
        name, args = params["name"], params.get("arguments") or {}
        verdict: Admitted | str | None = None
        with anyio.move_on_after(ADMIT_DEADLINE_S):
            verdict = await anyio.to_thread.run_sync(self.witness.admit, name, args, msg.id,
                                                     abandon_on_cancel=True)
        if verdict is None:  # the store is too slow: fail open
            self.witness.outage(TimeoutError(f"no answer within {ADMIT_DEADLINE_S:g} s"))
            return None
        if isinstance(verdict, str):
            return refusal(msg.id, verdict)
        self.pending[str(msg.id)] = verdict
        return None

    async def _from_server(self, server_read, client_write) -> None:
        async for item in server_read:
            if isinstance(item, Exception):
                log.warning("agent-watchdog mcp-proxy: the server sent an unreadable message (%s)",
                            type(item).__name__)
                continue
            msg = item.message
            if isinstance(msg, (types.JSONRPCResponse, types.JSONRPCError)) and msg.id is not None:
                call = self.pending.pop(str(msg.id), None)
                if call is not None:
                    ok, err = outcome(msg)
                    await anyio.to_thread.run_sync(lambda: self.witness.finish(call, ok=ok, error=err))
                await client_write.send(SessionMessage(msg))
                continue
            related = None
            if self.http and isinstance(msg, types.JSONRPCNotification) and msg.method == "notifications/progress":
                related = self.progress.get(str((msg.params or {}).get("progressToken")))
            await client_write.send(SessionMessage(msg, metadata=ServerMessageMetadata(related_request_id=related))
                                    if related is not None else SessionMessage(msg))
