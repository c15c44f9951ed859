"""Shared ground for the OTLP tests: a real daemon (in this process) with its receiver on a free
loopback port and its tick in a thread, real OTel exporters in agent processes, raw HTTP."""

from __future__ import annotations

import base64
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import select

from daemon_support import config
from watchdog.daemon.process.service import Daemon
from watchdog.store.engine import make_engine
from watchdog.store.schema import runs

REPO = Path(__file__).resolve().parents[1]
PY_AGENT = REPO / "examples" / "otel_python_agent.py"
JS_AGENT_DIR = REPO / "examples" / "otel-js"
TICK_S = 0.25
# gpt-4o at these prices: 1,000 in + 200 out = 0.0045 EUR per step (examples/otel_python_agent.py).
PRICES = {"gpt-4o": {"input_eur_per_mtok": 2.5, "output_eur_per_mtok": 10.0}}
STEP_EUR = 1000 * 2.5e-6 + 200 * 10e-6
# The receiver refuses spans without a known bearer token ([otlp] allow_anonymous = false): the
# tests' exporters send this one, written to the daemon's tokens_file for the agents they name.
TOKEN = "test-otlp-token-5f0c2a9e41d7"
TEST_AGENTS = ("json-bot", "research-bot", "js-bot", "honest-bot", "liar-bot", "brief-bot", "short-bot", "inside",
               "outside", "oi-bot", "svc", "bot", "otlp", "py-exec-bot", "js-exec-bot", "bench-bot", "victim-bot",
               "runaway-bot", "support")
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def otel_headers(token: str = TOKEN) -> str:
    """OTEL_EXPORTER_OTLP_HEADERS for a bearer token (the value percent-encoded, as the spec says)."""
    return f"Authorization=Bearer%20{token}"


def tokens_file(directory: str, lines: list[str]) -> str:
    path = os.path.join(directory, "otlp-tokens")
    with open(path, "w", encoding="utf-8") as f:
        f.write("# test tokens\n" + "".join(line + "\n" for line in lines))
    os.chmod(path, 0o600)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OtlpDaemon:
    """The daemon's own code: Daemon with [otlp] on, its tick and delivery every TICK_S in a thread."""

    def __init__(self, url: str, *, kill_mode: str = "cooperative", max_request_bytes: int | None = None,
                 defaults: dict | None = None, tokens: list[str] | None = None, otlp: dict | None = None,
                 **sections):
        import tempfile

        self._dir = tempfile.mkdtemp(prefix="aw-otlp-")
        lines = tokens if tokens is not None else [f"{TOKEN} agent={','.join(TEST_AGENTS)} owner=tests"]
        otlp = {"listen": f"127.0.0.1:{free_port()}", "kill_mode": kill_mode,
                "tokens_file": tokens_file(self._dir, lines), **(otlp or {})}
        if max_request_bytes:
            otlp["max_request_bytes"] = max_request_bytes
        daemon = {"tick_s": TICK_S, **sections.pop("daemon", {})}
        self.config = config(otlp=otlp, daemon=daemon, defaults=defaults or {"max_tool_calls": 10},
                             prices=PRICES, **sections)
        self.engine = make_engine(url)
        self.daemon = Daemon(self.engine, self.config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self.daemon.otlp_server.address
        return f"http://{host}:{port}/v1/traces"

    @property
    def address(self) -> tuple[str, int]:
        return self.daemon.otlp_server.address

    def start(self) -> "OtlpDaemon":
        self.daemon.start_otlp()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(TICK_S):
            self.daemon.once()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.daemon.stop_otlp()
        self.engine.dispose()
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "OtlpDaemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def agent_env(endpoint: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_WATCHDOG_"))}
    env.update(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100", AGENT_PAUSE_S="0.03",
               OTEL_EXPORTER_OTLP_HEADERS=otel_headers())
    env.update(extra)
    return env


def start_py_agent(endpoint: str, *, loops: int = 1000, prefix: list[str] | None = None, **extra: str):
    env = agent_env(endpoint, AGENT_LOOPS=str(loops), **extra)
    return subprocess.Popen([*(prefix or []), sys.executable, str(PY_AGENT)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def otlp_runs(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.source == "otlp").order_by(runs.c.started_at)).all()


def post(address: tuple[str, int], body: bytes, headers: dict, *, chunks: list[bytes] | None = None,
         timeout_s: float = 30.0, token: str | None = TOKEN, path: str = "/v1/traces") -> tuple[int, bytes]:
    """One request over its own connection; with the tests' bearer token unless `token` is None."""
    headers = {**headers, **({"Authorization": f"Bearer {token}"} if token else {})}
    conn = http.client.HTTPConnection(*address, timeout=timeout_s)
    try:
        if chunks is not None:
            conn.putrequest("POST", path)
            for k, v in {**headers, "Transfer-Encoding": "chunked"}.items():
                conn.putheader(k, v)
            conn.endheaders()
            for c in chunks:
                conn.send(f"{len(c):x}\r\n".encode() + c + b"\r\n")
            conn.send(b"0\r\n\r\n")
        else:
            conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def spans_request(n_tools: int, *, run_id: str | None = None, conversation: str | None = None,
                  claimed_pid: int | None = None, service: str = "json-bot", tool: str = "lookup"):
    """An ExportTraceServiceRequest made by the real OTel SDK (spans ended, encoded by its encoder)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    attrs = {"service.name": service}
    if run_id:
        attrs["agent_watchdog.run_id"] = run_id
    if claimed_pid:
        attrs["process.pid"] = claimed_pid
    provider = TracerProvider(resource=Resource(attrs))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    conv = {"gen_ai.conversation.id": conversation} if conversation else {}
    for i in range(n_tools):
        with tracer.start_as_current_span("chat gpt-4o", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.input_tokens": 1000, "gen_ai.usage.output_tokens": 200, **conv}):
            pass
        with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                "gen_ai.tool.call.arguments": f'{{"page": {i}}}', **conv}):
            pass
    provider.shutdown()
    return encode_spans(memory.get_finished_spans())


def to_json(request) -> bytes:
    """The OTLP/JSON encoding of a request: lowerCamelCase, ids in hex (not proto3 JSON's base64)."""
    import json

    from google.protobuf.json_format import MessageToDict

    d = MessageToDict(request)
    for rs in d.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = base64.b64decode(s[k]).hex()
    return json.dumps(d).encode()


def wait_for(pred, timeout_s: float = 30.0, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll_s)
    return pred()
