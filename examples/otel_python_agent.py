"""A Python agent loop instrumented only by OpenTelemetry: no agent-watchdog import anywhere.

It emits what GenAI instrumentations emit (semantic conventions for generative AI): an
`invoke_agent` root span, and inside it a `chat` span per model call (model, token usage)
and an `execute_tool` span per tool call (tool name, call id, arguments). The OTLP/HTTP
exporter sends them wherever OTEL_EXPORTER_OTLP_TRACES_ENDPOINT says; under
`agent-watchdog exec` that is the daemon's receiver, and the run is exec's.

    agent-watchdog exec --agent research-bot --max-tool-calls 10 -- python examples/otel_python_agent.py

Environment: AGENT_LOOPS (model + tool rounds, default 50), AGENT_PAUSE_S (between rounds,
default 0.05), AGENT_SIMPLE_PROCESSOR=1 (export each span as it ends instead of in batches),
plus the standard OTEL_* variables (OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_SCHEDULE_DELAY, ...).
"""

from __future__ import annotations

import json
import os
import sys
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

MODEL = os.environ.get("AGENT_MODEL", "gpt-4o")
AGENT = os.environ.get("AGENT_NAME", "research-bot")


def setup() -> TracerProvider:
    resource = Resource.create({"service.name": AGENT})  # + OTEL_RESOURCE_ATTRIBUTES, detectors
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, protobuf
    simple = os.environ.get("AGENT_SIMPLE_PROCESSOR") == "1"
    provider.add_span_processor(SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def search(query: str) -> str:
    """The agent's tool: a fake search that always finds 'one more page'."""
    return f"results for {query}: see the next page"


def main() -> int:
    provider = setup()
    tracer = trace.get_tracer("example.agent")
    loops = int(os.environ.get("AGENT_LOOPS", "50"))
    pause_s = float(os.environ.get("AGENT_PAUSE_S", "0.05"))
    print(f"agent pid {os.getpid()} starting {loops} rounds", flush=True)
    with tracer.start_as_current_span(f"invoke_agent {AGENT}", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT}):
        for i in range(loops):
            with tracer.start_as_current_span(f"chat {MODEL}", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": MODEL}) as chat:
                chat.set_attribute("gen_ai.response.model", MODEL)
                chat.set_attribute("gen_ai.usage.input_tokens", 1000)
                chat.set_attribute("gen_ai.usage.output_tokens", 200)
            args = {"q": f"refund policy page {i}"}
            with tracer.start_as_current_span("execute_tool search", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                    "gen_ai.tool.call.id": f"call_{os.getpid()}_{i}",
                    "gen_ai.tool.call.arguments": json.dumps(args)}) as tool:
                try:
                    search(args["q"])
                except Exception as exc:  # noqa: BLE001 — a failed tool is an ERROR span
                    tool.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            time.sleep(pause_s)
    provider.shutdown()  # flushes the last batch, the root span's end with it
    print("agent done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
