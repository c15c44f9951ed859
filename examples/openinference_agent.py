"""A Python agent instrumented only by an OpenTelemetry instrumentation package: the OpenAI Agents
SDK, traced by OpenInference's `openinference-instrumentation-openai-agents`. No agent-watchdog
import: the instrumentation turns the SDK's own traces into OpenInference spans (AGENT, LLM with
`llm.token_count.*`, TOOL with `tool.name`), the OTLP/HTTP exporter sends them to the daemon.

    pip install openai-agents openinference-instrumentation-openai-agents \
        opentelemetry-sdk opentelemetry-exporter-otlp-proto-http
    agent-watchdog exec --agent support --max-tool-calls 10 -- python examples/openinference_agent.py

With OPENAI_API_KEY set it asks gpt-4o; without, a scripted model of the SDK (agents.testing)
plays a runaway that asks for the same search with new arguments on every turn, so the example
runs offline. AGENT_TURNS bounds the turns (default 200).
"""

from __future__ import annotations

import os
import sys

from agents import Agent, ModelProvider, RunConfig, Runner, function_tool
from agents.testing import ModelStep, ScriptedModel, function_call
from agents.usage import Usage
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TURNS = int(os.environ.get("AGENT_TURNS", "200"))


@function_tool
def search(q: str) -> str:
    """Search the help center."""
    return f"results for {q}: see the next page"


class Runaway(ScriptedModel):
    """Offline stand-in for a model that never stops asking for one more search."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def _next(self):
        self.n += 1
        call = function_call("search", {"q": f"refund policy page {self.n}"}, call_id=f"call_{self.n}")
        self.enqueue(ModelStep(output=[call], usage=Usage(requests=1, input_tokens=1000, output_tokens=200,
                                                          total_tokens=1200)))

    async def get_response(self, *args, **kwargs):
        self._next()
        return await super().get_response(*args, **kwargs)

    async def stream_response(self, *args, **kwargs):
        self._next()
        async for event in super().stream_response(*args, **kwargs):
            yield event


class Offline(ModelProvider):
    def __init__(self):
        self.model = Runaway()

    def get_model(self, model_name):
        return self.model


def main() -> int:
    provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    agent = Agent(name="support", instructions="Help the customer.", model="gpt-4o", tools=[search])
    config = RunConfig() if os.environ.get("OPENAI_API_KEY") else RunConfig(model_provider=Offline())
    try:
        Runner.run_sync(agent, "What is the refund policy?", run_config=config, max_turns=TURNS)
    except Exception as exc:  # noqa: BLE001 — MaxTurnsExceeded: the runaway ran out of turns
        print(f"agent stopped: {type(exc).__name__}", flush=True)
    provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
