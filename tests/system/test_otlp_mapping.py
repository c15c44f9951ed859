"""Spans → runs, steps and tool calls (pure), with the GenAI names old and new and OpenInference's;
and the same through a real `agent-watchdog run` daemon process with [otlp] on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_support import daemon_toml
from otlp_support import PRICES, STEP_EUR, TOKEN, free_port, otlp_runs, post, start_py_agent, tokens_file, wait_for
from watchdog.core.lifecycle import hash_args
from watchdog.daemon.otlp.decode import ResourceSpans, Span
from watchdog.daemon.otlp.mapping import groups
from watchdog.store.engine import make_engine

CLI = str(Path(sys.executable).with_name("agent-watchdog"))


def span(name, attrs, *, trace="t1", sid="s", parent="p", error=False, msg=""):
    return Span(trace, sid, parent, name, 1_000_000_000, 1_500_000_000, attrs, error, msg)


def test_new_and_old_genai_names_and_openinference_map_alike():
    rs = ResourceSpans({"service.name": "svc", "process.pid": 4242}, (
        span("chat gpt-4o", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                             "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 2}, sid="a"),
        span("chat old", {"gen_ai.operation.name": "text_completion", "gen_ai.response.model": "gpt-4o-mini",
                          "gen_ai.usage.prompt_tokens": 11, "gen_ai.usage.completion_tokens": 3}, sid="b"),
        span("llm", {"openinference.span.kind": "LLM", "llm.model_name": "claude",
                     "llm.token_count.prompt": 12, "llm.token_count.completion": 4}, sid="c"),
        span("execute_tool search", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                                     "gen_ai.tool.call.id": "call-1",
                                     "gen_ai.tool.call.arguments": '{"q": "x", "n": 1}'}, sid="d"),
        span("tool", {"openinference.span.kind": "TOOL", "tool.name": "fetch", "input.value": "not json"},
             sid="e", error=True, msg="boom at https://user:secret@example.com/x?token=abc"),
        span("GET /health", {"http.method": "GET"}, sid="f"),
        span("invoke_agent bot", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "bot"}, sid="g",
             parent=""),
    ))
    (g,) = groups([rs])
    assert (g.key, g.agent, g.claimed_pid, g.spans, g.root_ended) == (("trace", "t1"), "bot", 4242, 7, True)
    steps = [(c.model, c.tokens_in, c.tokens_out) for c in g.calls if c.kind == "step"]
    assert steps == [("gpt-4o", 10, 2), ("gpt-4o-mini", 11, 3), ("claude", 12, 4)]
    tools = [c for c in g.calls if c.kind == "tool"]
    assert [(t.tool, t.ok, t.call_id) for t in tools] == [("search", True, "call-1"), ("fetch", False, None)]
    assert tools[0].args_hash == hash_args({"n": 1, "q": "x"})  # as the SDK hashes the same arguments
    assert tools[0].duration_s == pytest.approx(0.5)
    assert tools[1].error_class == "SpanError" and "secret" not in (tools[1].error_msg or "")


def test_run_keys_exec_then_conversation_then_trace():
    a = ResourceSpans({"agent_watchdog.run_id": "r" * 32}, (span("chat", {"gen_ai.operation.name": "chat"}),))
    b = ResourceSpans({"service.name": "s"}, (
        span("chat", {"gen_ai.operation.name": "chat"}, trace="t2", sid="1"),
        span("invoke_agent", {"gen_ai.operation.name": "invoke_agent", "session.id": "sess"}, trace="t2", sid="2"),
        span("chat", {"gen_ai.operation.name": "chat"}, trace="t3", sid="3"),
    ))
    keys = [g.key for g in groups([a, b])]
    assert keys == [("run", "r" * 32), ("conversation", "sess"), ("trace", "t3")]


def test_a_real_daemon_process_receives_spans(sqlite_url, tmp_path):
    """`agent-watchdog run` with [otlp] listen: an OTel agent straight to it is stopped, and an
    OpenInference-style JSON request is counted."""
    port = free_port()
    cfg = tmp_path / "watchdog.toml"
    prices = "".join(f'[prices."{m}"]\ninput_eur_per_mtok = {p["input_eur_per_mtok"]}\n'
                     f'output_eur_per_mtok = {p["output_eur_per_mtok"]}\n' for m, p in PRICES.items())
    tokens = tokens_file(str(tmp_path), [f"{TOKEN} agent=oi-bot,research-bot owner=tests"])
    cfg.write_text(daemon_toml(tick_s=0.25) + f'[otlp]\nlisten = "127.0.0.1:{port}"\ntokens_file = "{tokens}"\n'
                   "[defaults]\nmax_tool_calls = 10\n" + prices)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG")}
    log = open(tmp_path / "daemon.log", "w")
    daemon = subprocess.Popen([CLI, "--config", str(cfg), "--db", sqlite_url, "run", "-v"], env=env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    engine = make_engine(sqlite_url)
    agent = None
    try:
        body = {"resourceSpans": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "oi-bot"}}]},
            "scopeSpans": [{"spans": [
                {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": f"b7ad6b71692033{i:02x}",
                 "name": "tool", "startTimeUnixNano": "1", "endTimeUnixNano": "2",
                 "attributes": [{"key": "openinference.span.kind", "value": {"stringValue": "TOOL"}},
                                {"key": "tool.name", "value": {"stringValue": "lookup"}},
                                {"key": "session.id", "value": {"stringValue": "s-1"}}]} for i in range(3)]}]}]}
        assert wait_for(lambda: _answers(port), 30), (tmp_path / "daemon.log").read_text()[-2000:]
        status, answer = post(("127.0.0.1", port), json.dumps(body).encode(), {"Content-Type": "application/json"})
        assert (status, json.loads(answer)) == (200, {})
        oi = wait_for(lambda: [r for r in otlp_runs(engine) if r.agent == "oi-bot"])
        assert oi and oi[0].tool_calls == 3 and oi[0].labels == {"gen_ai.conversation.id": "s-1"}
        agent = start_py_agent(f"http://127.0.0.1:{port}/v1/traces")
        stopped = wait_for(lambda: [r for r in otlp_runs(engine) if r.agent == "research-bot"
                                    and r.stop_reason == "max_tool_calls"], 60)
        assert stopped, (tmp_path / "daemon.log").read_text()[-2000:]
        # Every step counted at the stop gets priced (the agent keeps exporting, so "none unpriced"
        # at one poll is a race on a loaded machine; see test_otlp_agents).
        assert wait_for(lambda: [r for r in otlp_runs(engine) if r.id == stopped[0].id
                                 and r.cost_eur >= stopped[0].steps * STEP_EUR * 0.999])
    finally:
        if agent is not None:
            agent.kill()
            agent.wait()
        daemon.terminate()
        assert daemon.wait(30) == 0
        log.close()
        engine.dispose()


def _answers(port: int) -> bool:
    try:
        return post(("127.0.0.1", port), b"{}", {"Content-Type": "application/json"}, timeout_s=2)[0] == 200
    except OSError:
        return False
