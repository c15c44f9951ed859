"""A local fake model API on 127.0.0.1 that answers every turn with a tool call: a runaway.

One server speaks the three wire formats the CLIs use:
- Anthropic Messages (`POST /v1/messages`, streamed as SSE or not) for Claude Code;
- OpenAI Responses (`POST /v1/responses`, SSE) and Chat Completions for Codex;
- Gemini (`POST /v1beta/models/M:streamGenerateContent` / `:generateContent`) for Gemini CLI.

`command(n)` gives the shell command of the n-th tool call (1-based). Every request body is kept
(`requests`), so a test can read what the model was told (a refused call's reason).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class FakeModel:
    def __init__(self, command: Callable[[int], str]):
        self.command = command
        self.calls = 0
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.raw: list[tuple[str, dict[str, str], bytes]] = []  # every POST as it came (path, headers, body)
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeModel":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def next_command(self) -> tuple[int, str]:
        with self._lock:
            self.calls += 1
            return self.calls, self.command(self.calls)

    def texts(self) -> str:
        """Everything the CLIs sent, as one string (to look for what the model was told)."""
        return "\n".join(json.dumps(body) for _, body in self.requests)


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    out = []
    for name, data in events:
        if name:
            out.append(f"event: {name}\n")
        out.append(f"data: {json.dumps(data)}\n\n")
    return "".join(out).encode()


def _anthropic(n: int, cmd: str, model: str, stream: bool) -> tuple[str, bytes]:
    tool = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": "Bash",
            "input": {"command": cmd, "description": "the next step"}}
    usage = {"input_tokens": 100, "output_tokens": 20}
    if not stream:
        return "application/json", json.dumps({
            "id": f"msg_{n}", "type": "message", "role": "assistant", "model": model, "content": [tool],
            "stop_reason": "tool_use", "stop_sequence": None, "usage": usage}).encode()
    return "text/event-stream", _sse([
        ("message_start", {"type": "message_start", "message": {
            "id": f"msg_{n}", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {**tool, "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "input_json_delta", "partial_json": json.dumps(tool["input"])}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"output_tokens": 20}}),
        ("message_stop", {"type": "message_stop"}),
    ])


def _responses(n: int, cmd: str, model: str) -> tuple[str, bytes]:
    """OpenAI Responses API, streamed: one function call `exec_command` (Codex 0.171's shell tool)."""
    call = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n:04d}", "name": "exec_command",
            "arguments": json.dumps({"cmd": cmd}), "status": "completed"}
    resp = {"id": f"resp_{n}", "object": "response", "model": model, "status": "completed", "output": [call],
            "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    return "text/event-stream", _sse([
        ("response.created", {"type": "response.created", "response": {**resp, "status": "in_progress", "output": []}}),
        ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                        "item": {**call, "arguments": "", "status": "in_progress"}}),
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": call}),
        ("response.completed", {"type": "response.completed", "response": resp}),
    ])


def _gemini(n: int, cmd: str, stream: bool) -> tuple[str, bytes]:
    chunk = {"candidates": [{"content": {"role": "model", "parts": [
        {"functionCall": {"name": "run_shell_command", "args": {"command": cmd, "description": "the next step"}}}]},
        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 20, "totalTokenCount": 120},
        "modelVersion": "gemini-2.5-pro"}
    if not stream:
        return "application/json", json.dumps(chunk).encode()
    return "text/event-stream", _sse([(None, chunk)])


def _gemini_text(stream: bool) -> tuple[str, bytes]:
    text = json.dumps({"reasoning": "a simple task", "model_choice": "flash"})
    chunk = {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP",
                             "index": 0}],
             "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}}
    if not stream:
        return "application/json", json.dumps(chunk).encode()
    return "text/event-stream", _sse([(None, chunk)])


def _handler(fake: FakeModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # model lists and the like
            self._send(200, "application/json", json.dumps({"data": [], "models": [], "object": "list"}).encode())

        def do_HEAD(self) -> None:
            self._send(200, "application/json", b"")

        def do_POST(self) -> None:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():  # OTel JS exporters
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                raw = b"".join(parts)
            else:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            path = self.path.split("?")[0]
            fake.raw.append((path, dict(self.headers.items()), raw))
            fake.requests.append((path, body if isinstance(body, dict) else {}))
            if path.endswith("/count_tokens"):
                return self._send(200, "application/json", b'{"input_tokens": 100}')
            if path.endswith("/v1/messages"):
                n, cmd = fake.next_command()
                return self._send(200, *_anthropic(n, cmd, body.get("model", "claude"), bool(body.get("stream"))))
            if path.endswith("/responses"):
                n, cmd = fake.next_command()
                return self._send(200, *_responses(n, cmd, body.get("model", "gpt-5")))
            if (":streamGenerateContent" in path or ":generateContent" in path) and not body.get("tools"):
                # Gemini CLI's own side calls (its model router, ...): a plain JSON text answer.
                return self._send(200, *_gemini_text(":stream" in path))
            if ":streamGenerateContent" in path or ":generateContent" in path:
                n, cmd = fake.next_command()
                return self._send(200, *_gemini(n, cmd, ":stream" in path))
            if ":countTokens" in path:
                return self._send(200, "application/json", b'{"totalTokens": 100}')
            self._send(200, "application/json", b"{}")

    return Handler
