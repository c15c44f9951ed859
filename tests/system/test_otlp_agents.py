"""Real agents with real OTel exporters (no watchdog import in them) against the daemon's receiver.

- The OTel Python SDK agent (examples/otel_python_agent.py) and the OTel JS agent
  (examples/otel-js/agent.js), looping chat + execute_tool, are stopped for max_tool_calls,
  their cost from the price table, the alert naming the top tool.
- `[otlp] kill_mode = "process"`: a sender the kernel confirms (its socket's owner, holding the
  socket, is the claimed process.pid) is signalled; one claiming an unrelated victim's pid is
  recorded and alerted, and the victim is never signalled.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from agent_procs import process_gone
from daemon_support import actions, alerts_of
from otlp_support import JS_AGENT_DIR, STEP_EUR, OtlpDaemon, agent_env, otlp_runs, start_py_agent, wait_for
from watchdog.daemon.stops.stopping import SPANS_UNPROVEN


def _stopped(engine, agent: str):
    return wait_for(lambda: [r for r in otlp_runs(engine) if r.agent == agent and r.status != "running"], 60)


def _check_stopped_run(d, agent: str, tool: str) -> None:
    stopped = _stopped(d.engine, agent)
    assert stopped, f"no stopped run of {agent}: {otlp_runs(d.engine)}"
    run = stopped[0]
    assert (run.stop_reason, run.source, run.kill_mode) == ("max_tool_calls", "otlp", "cooperative")
    assert run.tool_calls > 10
    # Priced by the daemon from [prices] (the steps arrive unpriced), within a tick or two: every step
    # counted at the stop is priced. Not "no token unpriced at one instant": the agent is never
    # signalled and keeps exporting (~30 steps/s), so on a loaded machine a poll can always land
    # between an export and the tick that prices it (seen in CI: 984 steps, 900 priced).
    priced = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.id == run.id
                               and r.cost_eur >= run.steps * STEP_EUR * 0.999])
    assert priced, otlp_runs(d.engine)
    stop = wait_for(lambda: [a for a in alerts_of(d.engine, run.id) if a.dedupe_key == f"stop:{run.id}"])
    assert stop and "max_tool_calls" in stop[0].title
    assert f"top tool: «{tool}» ×" in stop[0].body and SPANS_UNPROVEN in stop[0].body


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_an_otel_python_agent_is_stopped_for_max_tool_calls(db_url):
    with OtlpDaemon(db_url) as d:
        agent = start_py_agent(d.endpoint)
        try:
            _check_stopped_run(d, "research-bot", "search")
            # Nothing can signal it: the ladder says so once, and the agent is untouched.
            run = _stopped(d.engine, "research-bot")[0]
            assert wait_for(lambda: "not_signalled" in actions(d.engine, run.id))
            assert agent.poll() is None
        finally:
            agent.kill()
            agent.wait()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_otel_js_agent_is_counted_the_same(db_url):
    node = shutil.which("node")
    assert node, "node is needed (.ci/run installs it)"
    assert (JS_AGENT_DIR / "node_modules" / "@opentelemetry" / "exporter-trace-otlp-proto").is_dir(), \
        "run `npm ci` in examples/otel-js (.ci/run does)"
    with OtlpDaemon(db_url) as d:
        env = agent_env(d.endpoint, AGENT_LOOPS="1000", AGENT_PAUSE_MS="30")
        agent = subprocess.Popen([node, str(JS_AGENT_DIR / "agent.js")], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        try:
            _check_stopped_run(d, "js-bot", "search")  # its token from OTEL_EXPORTER_OTLP_HEADERS (agent_env)
        finally:
            agent.kill()
            agent.wait()
        # The same exporter without the header: 401, and no run of its own.
        env.pop("OTEL_EXPORTER_OTLP_HEADERS")
        bare = subprocess.run([node, str(JS_AGENT_DIR / "agent.js")], env={**env, "AGENT_LOOPS": "3", "AGENT_NAME": "js-anon"},
                              capture_output=True, text=True, timeout=60)
        assert d.daemon.otlp_server.unauthenticated >= 1, bare.stdout + bare.stderr
        assert not [r for r in otlp_runs(d.engine) if r.agent == "js-anon"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_kernel_confirmed_sender_is_signalled_and_a_claimed_victim_never(db_url):
    victim = subprocess.Popen(["sleep", "600"])
    with OtlpDaemon(db_url, kill_mode="process") as d:
        # The honest one: the SDK's process detector puts its own pid in the resource.
        honest = start_py_agent(d.endpoint, AGENT_NAME="honest-bot", OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="process")
        liar = start_py_agent(d.endpoint, AGENT_NAME="liar-bot", OTEL_RESOURCE_ATTRIBUTES=f"process.pid={victim.pid}")
        try:
            assert wait_for(lambda: honest.poll() is not None, 60), "the confirmed sender was not stopped"
            run = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.agent == "honest-bot" and r.status == "killed"])
            assert run and (run[0].kill_mode, run[0].pid, run[0].stop_reason) == ("process", honest.pid,
                                                                                 "max_tool_calls")
            assert "sigterm" in actions(d.engine, run[0].id)

            lied = _stopped(d.engine, "liar-bot")
            assert lied and (lied[0].kill_mode, lied[0].pid) == ("cooperative", None)
            assert wait_for(lambda: "not_signalled" in actions(d.engine, lied[0].id))
            texts = [a.body for a in alerts_of(d.engine, lied[0].id)]
            assert any(SPANS_UNPROVEN in t for t in texts), texts
            assert "sigterm" not in actions(d.engine, lied[0].id)
            assert victim.poll() is None and not process_gone(victim.pid)
            assert liar.poll() is None  # cooperative: nobody signals it either
        finally:
            for p in (honest, liar, victim):
                if p.poll() is None:
                    p.kill()
                p.wait()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_agent_instrumented_by_an_otel_instrumentation_package_is_stopped(db_url):
    """examples/openinference_agent.py: the OpenAI Agents SDK traced by OpenInference's
    instrumentation (TOOL spans named by tool.name, arguments in input.value), offline."""
    import sys

    from otlp_support import REPO

    with OtlpDaemon(db_url) as d:
        env = agent_env(d.endpoint, AGENT_TURNS="400")
        env.pop("OPENAI_API_KEY", None)
        agent = subprocess.Popen([sys.executable, str(REPO / "examples" / "openinference_agent.py")], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            stopped = _stopped(d.engine, "support")
            assert stopped, otlp_runs(d.engine)
            assert (stopped[0].stop_reason, stopped[0].source) == ("max_tool_calls", "otlp")
            stop = wait_for(lambda: [a for a in alerts_of(d.engine, stopped[0].id)
                                     if a.dedupe_key == f"stop:{stopped[0].id}"])
            assert stop and "top tool: «search» ×" in stop[0].body
        finally:
            agent.kill()
            agent.wait()


BRIEF = """
import os, sys
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
p = TracerProvider(resource=Resource({"service.name": "brief-bot", "process.pid": os.getpid()}))
p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1])))
with p.get_tracer("brief").start_as_current_span("execute_tool ls", attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "ls"}):
    pass
p.shutdown()
"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_confirmed_sender_that_exits_without_its_root_span_completes_its_run(db_url):
    """Pinned by the kernel (kill_mode process), then gone: done, not lost, and no alert."""
    import sys

    with OtlpDaemon(db_url, kill_mode="process") as d:
        proc = subprocess.run([sys.executable, "-c", BRIEF, d.endpoint], env=agent_env(d.endpoint), timeout=60)
        assert proc.returncode == 0
        done = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.agent == "brief-bot" and r.status == "completed"])
        assert done, otlp_runs(d.engine)
        assert (done[0].kill_mode, done[0].tool_calls, done[0].stop_reason) == ("process", 1, None)
        assert alerts_of(d.engine, done[0].id) == []
