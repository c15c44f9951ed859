"""issue #22's combined Done-when: a REAL daemon (`agent-watchdog run` with `[otlp] listen`),
real OTel exporters (Python SDK, OTel JS) in agents with no watchdog import, each under
`agent-watchdog exec --max-tool-calls 10`: stopped for max_tool_calls, exec exits 124, cost from
[prices], one alert to an HTTP sink naming the top tool. Spans from outside exec's tree naming
its run id do not count for it. One daemon for the module (it is the slow part)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from sqlalchemy import select

from agent_procs import wait_until
from alertsinks import HttpSink
from daemon_support import wait_ticks
from exec_support import AGENT_WATCHDOG, EXAMPLES, Daemon, daemon_config, exec_env, exec_runs, start_exec
from otlp_support import TOKEN, free_port, post, spans_request, tokens_file
from watchdog.core import lifecycle as lc
from watchdog.store.engine import make_engine
from watchdog.store.joined import WITNESS_SEQ_BASE
from watchdog.store.schema import events, runs

PRICES = '\n[prices."gpt-4o"]\ninput_eur_per_mtok = 2.5\noutput_eur_per_mtok = 10.0\n'
STEP_EUR = 1000 * 2.5e-6 + 200 * 10e-6  # the examples' chat spans: 1,000 in + 200 out
JS_DIR = EXAMPLES / "otel-js"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exec_otlp")
    db_url = f"sqlite:///{tmp / 'runs.db'}"
    sink = HttpSink().__enter__()
    port = free_port()
    # exec's commands get a token of their own run from the daemon; this test's own posts, the tests' token.
    tokens = tokens_file(str(tmp), [f"{TOKEN} agent=quiet-bot owner=tests"])
    extra = (f'\n[otlp]\nlisten = "127.0.0.1:{port}"\ntokens_file = "{tokens}"\n\n[alerts]\nurls = ["{sink.url()}"]\n'
             + PRICES)
    cfg, sock = daemon_config(tmp / "daemon.toml", db_url, extra=extra)
    subprocess.run([AGENT_WATCHDOG, "--db", db_url, "db", "upgrade"], check=True, capture_output=True, env=exec_env())
    d = Daemon(tmp, cfg, sock)
    # The receiver listens once the daemon is up (the socket exists then; the port may follow).
    import socket as _s
    assert wait_until(lambda: _s.socket().connect_ex(("127.0.0.1", port)) == 0, 60), d.log()
    engine = make_engine(db_url)
    yield {"db": db_url, "cfg": cfg, "sock": sock, "port": port, "sink": sink, "daemon": d, "engine": engine}
    engine.dispose()
    d.stop()
    sink.__exit__()


def _exec(world, agent: str, command: list[str], **env: str) -> subprocess.Popen:
    e = {k: v for k, v in exec_env(world["sock"]).items() if not k.startswith("OTEL_")}
    e.update(env)
    return start_exec(["--agent", agent, "--max-tool-calls", "10", "--", *command], db_url=world["db"],
                      cfg=world["cfg"], sock=world["sock"], env=e)


def _check(world, p: subprocess.Popen, agent: str) -> str:
    try:
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    engine = world["engine"]
    run = [r for r in exec_runs(engine) if r.agent == agent][-1]
    assert p.returncode == 124, (p.returncode, err, world["daemon"].log()[-3000:])
    assert "max_tool_calls" in err
    assert (run.status, run.stop_reason, run.source) == ("killed", "max_tool_calls", "exec") or \
        run.stop_reason == "max_tool_calls", run
    with engine.connect() as conn:
        evs = conn.execute(select(events).where(events.c.run_id == run.id)).all()
    tools = [e for e in evs if e.kind == lc.EV_TOOL and e.source == "otlp"]
    # Stopped within a few ticks of the 11th tool span: not dozens of spans later.
    assert 11 <= len(tools) <= 40, len(tools)
    # Witness events live in their own seq range: the run's writer (exec) never loses a number.
    assert all(e.seq >= WITNESS_SEQ_BASE for e in evs if e.source == "otlp")
    assert wait_until(lambda: _row(engine, run.id).cost_eur >= STEP_EUR * 0.999, 30), _row(engine, run.id)
    sink = world["sink"]
    assert wait_until(lambda: any(run.id in json.dumps(m) and "max_tool_calls" in json.dumps(m)
                                  for m in sink.received), 30), sink.received
    body = next(json.dumps(m) for m in sink.received if run.id in json.dumps(m))
    assert "search" in body
    return err


def _row(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).first()


def test_a_python_otel_agent_under_exec_is_stopped(world):
    p = _exec(world, "py-exec-bot", [sys.executable, str(EXAMPLES / "otel_python_agent.py")],
              AGENT_LOOPS="1000", AGENT_PAUSE_S="0.05", AGENT_NAME="py-exec-bot")
    _check(world, p, "py-exec-bot")


def test_a_node_otel_agent_under_exec_is_stopped(world):
    node = shutil.which("node")
    assert node, "node is needed (.ci/run installs it)"
    assert (JS_DIR / "node_modules").is_dir(), "run `npm ci` in examples/otel-js (.ci/run does)"
    p = _exec(world, "js-exec-bot", [node, str(JS_DIR / "agent.js")], AGENT_LOOPS="1000", AGENT_PAUSE_MS="50",
              AGENT_NAME="js-exec-bot")
    _check(world, p, "js-exec-bot")


def test_exec_finds_the_receiver_and_its_token_without_the_daemons_config(world):
    """issue 36 item 1: an agent's user cannot read the daemon's config (0640): exec, given none,
    learns the receiver and the run's own token from the daemon's attestation reply; the command's
    spans (no OTel variable of its own) are counted and it is stopped."""
    e = {k: v for k, v in exec_env(world["sock"]).items() if not k.startswith("OTEL_") and k != "AGENT_WATCHDOG_CONFIG"}
    e.update(AGENT_LOOPS="1000", AGENT_PAUSE_S="0.05", AGENT_NAME="nocfg-bot")
    p = start_exec(["--agent", "nocfg-bot", "--max-tool-calls", "10", "-v", "--", sys.executable,
                    str(EXAMPLES / "otel_python_agent.py")], db_url=world["db"], sock=world["sock"], env=e)
    err = _check(world, p, "nocfg-bot")
    assert f"OTel spans go to http://127.0.0.1:{world['port']}/v1/traces with the run's own token" in err, err


def test_spans_from_outside_execs_tree_do_not_count(world):
    p = _exec(world, "quiet-bot", ["sleep", "60"])
    try:
        engine = world["engine"]
        assert wait_until(lambda: [r for r in exec_runs(engine) if r.agent == "quiet-bot"], 60)
        run = [r for r in exec_runs(engine) if r.agent == "quiet-bot"][-1]
        # This test process is outside exec's tree: it names exec's run id and is refused.
        status, body = post(("127.0.0.1", world["port"]), spans_request(30, run_id=run.id).SerializeToString(),
                            {"Content-Type": "application/x-protobuf"})[:2]
        assert status == 200, (status, body)
        wait_ticks(engine, 2)  # two daemon ticks ended after the post: nothing may have counted meanwhile
        row = _row(engine, run.id)
        assert row.tool_calls == 0 and row.status == "running", row
        with engine.connect() as conn:
            assert not conn.execute(select(events).where(events.c.run_id == run.id,
                                                         events.c.source == "otlp")).all()
    finally:
        p.kill()
        p.wait()


def test_log_events_under_exec_count_for_its_run_with_its_token(world):
    """A coding CLI's OpenTelemetry log events (a real OTLPLogExporter, configured by the
    environment alone) under exec reach the receiver with the run's own token: counted for exec's
    run (never 401, never a run of their own)."""
    from test_otlp_logs_identity import EXPORT

    # Two tool calls, not three: the export's calls are identical, and a third would be a loop
    # (max_identical_calls 3) that stops the run whenever a tick comes before the command ends.
    p = _exec(world, "logs-exec-bot", [sys.executable, "-c", EXPORT, "exec-session", "2", "2"])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, (out, err)
    assert out.split() == ["SUCCESS"] * 4, (out, err)
    engine = world["engine"]
    run = [r for r in exec_runs(engine) if r.agent == "logs-exec-bot"][-1]
    with engine.connect() as conn:
        evs = conn.execute(select(events).where(events.c.run_id == run.id, events.c.source == "otlp")).all()
    assert sorted(e.kind for e in evs) == [lc.EV_STEP] * 2 + [lc.EV_TOOL] * 2
    with engine.connect() as conn:
        assert not [r for r in conn.execute(select(runs).where(runs.c.source == "otlp"))
                    if (r.labels or {}).get("session") == "exec-session"]
