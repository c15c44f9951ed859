"""The OTLP/HTTP receiver against real stores: encodings, hostile bodies, exec's tree, silence.

Requests are made by the real OTel SDK (its span encoder) and sent over real HTTP to the
daemon's own receiver; the daemon's tick runs in a thread (tests/otlp_support.py).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time

import pytest
from sqlalchemy import select

from daemon_support import alerts_of
from otlp_support import (OtlpDaemon, STEP_EUR, otlp_runs, post, spans_request, start_py_agent, to_json,
                          wait_for)
from watchdog.core.config import parse
from watchdog.daemon.stops.attest import AttestServer
from watchdog.errors import ConfigError
from watchdog.store import witness
from watchdog.store.schema import events, runs

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def _run(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def test_json_is_counted_as_protobuf(db_url):
    """The same spans in OTLP/JSON (hex ids) and in protobuf make the same run: steps, tool calls,
    tokens, priced from the price table; every event marked source otlp."""
    with OtlpDaemon(db_url, defaults={"max_tool_calls": 40}) as d:
        status, body = post(d.address, spans_request(4, conversation="conv-pb").SerializeToString(), PB)
        assert status == 200 and body == b""  # an empty ExportTraceServiceResponse: all accepted
        status, body = post(d.address, to_json(spans_request(4, conversation="conv-json")), JS)
        assert status == 200 and json.loads(body) == {}

        def priced():
            rs = otlp_runs(d.engine)
            return rs if len(rs) == 2 and all(r.cost_unpriced_tokens == 0 for r in rs) else None

        pb, js = wait_for(priced)
        for r in (pb, js):
            assert (r.source, r.agent, r.status, r.kill_mode) == ("otlp", "json-bot", "running", "cooperative")
            assert (r.steps, r.tool_calls, r.tool_errors, r.tokens_in, r.tokens_out) == (4, 4, 0, 4000, 800)
            assert r.cost_eur == pytest.approx(4 * STEP_EUR)
        assert {pb.labels["gen_ai.conversation.id"], js.labels["gen_ai.conversation.id"]} == {"conv-pb", "conv-json"}
        with d.engine.connect() as conn:
            evs = conn.execute(select(events.c.source, events.c.kind, events.c.tool)
                               .where(events.c.run_id == js.id)).all()
        assert sorted(evs) == sorted([("otlp", "step", None)] * 4 + [("otlp", "tool", "lookup")] * 4)
        # An exporter that retries resends the same spans: counted once.
        again = spans_request(2, conversation="conv-retry").SerializeToString()
        assert post(d.address, again, PB)[0] == 200 and post(d.address, again, PB)[0] == 200
        retry = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.labels.get("gen_ai.conversation.id") == "conv-retry"])
        assert retry[0].tool_calls == 2


def _gzip_bomb(size: int) -> bytes:
    return gzip.compress(b"\0" * size, compresslevel=9)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_hostile_bodies_get_4xx_while_a_runaway_beside_them_is_stopped(db_url):
    limit = 256 * 1024
    with OtlpDaemon(db_url, max_request_bytes=limit) as d:
        agent = start_py_agent(d.endpoint)
        try:
            good = spans_request(3, conversation="hostile").SerializeToString()
            cases = {
                "garbage": (os.urandom(2048), PB, 400),
                "truncated": (good[: len(good) // 2], PB, 400),
                "bad json": (b'{"resourceSpans": [', JS, 400),
                "base64 ids in json": (b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"q83vEjRWeJA="}]}]}]}',
                                       JS, 400),
                "oversized": (b"\0" * (limit + 1), PB, 413),
                "gzip bomb": (_gzip_bomb(64 * limit), {**PB, "Content-Encoding": "gzip"}, 413),
                "broken gzip": (b"\x1f\x8b" + os.urandom(100), {**PB, "Content-Encoding": "gzip"}, 400),
                "wrong type": (good, {"Content-Type": "text/plain"}, 415),
            }
            for name, (body, headers, code) in cases.items():
                status, answer = post(d.address, body, headers)
                assert status == code, (name, status, answer)
            # Chunked bodies (as OTel JS sends them): within the limit counted, above it 413.
            assert post(d.address, b"", PB, chunks=[good[:100], good[100:]])[0] == 200
            assert post(d.address, b"", PB, chunks=[b"\0" * 65536] * 5)[0] == 413
            # A peer that connects and says nothing holds one slot, never the receiver.
            import socket

            idle = socket.create_connection(d.address)
            try:
                stopped = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.agent == "research-bot"
                                            and r.status == "stopping"], 60)
            finally:
                idle.close()
            assert stopped and stopped[0].stop_reason == "max_tool_calls"
            ok = [r for r in otlp_runs(d.engine) if r.labels.get("gen_ai.conversation.id") == "hostile"]
            assert len(ok) == 1 and ok[0].tool_calls == 3  # only the chunked request's spans
        finally:
            agent.kill()
            agent.wait()


def test_spans_naming_a_run_that_is_not_execs_are_refused(db_url):
    with OtlpDaemon(db_url) as d:
        status, body = post(d.address, to_json(spans_request(2, run_id="f" * 32)), JS)
        assert status == 200
        partial = json.loads(body)["partialSuccess"]
        assert partial["rejectedSpans"] == "4" and "names no run of agent-watchdog exec" in partial["errorMessage"]
        assert otlp_runs(d.engine) == []


# A stand-in for `agent-watchdog exec`: waits for its attestation, then runs its command as its child.
EXEC_LIKE = ("import os, subprocess, sys, time\n"
             "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
             "sys.exit(subprocess.call(sys.argv[2:]))\n")


def test_spans_from_outside_execs_tree_do_not_count_for_its_run(db_url, tmp_path):
    """A parent attested as an exec'd run's root (the daemon's attestation path), and a child that
    exports spans naming the run: they count. Another process naming the same run id: refused."""
    go = tmp_path / "go"
    with OtlpDaemon(db_url, defaults={"max_tool_calls": 1000}) as d:
        run_id = "e" * 32
        env = {"OTEL_RESOURCE_ATTRIBUTES": f"agent_watchdog.run_id={run_id}", "AGENT_NAME": "inside"}
        parent = start_py_agent(d.endpoint, loops=5, prefix=[sys.executable, "-c", EXEC_LIKE, str(go)], **env)
        outsider = None
        try:
            import psutil

            create = psutil.Process(parent.pid).create_time()
            with d.engine.begin() as conn:
                witness.create_run(conn, run_id=run_id, agent="exec-bot", source="exec", host=d.daemon.killer.host,
                                   kill_mode="tree", labels=None, pid=parent.pid, pid_create_time=create,
                                   now=witness.store_now(conn))
            AttestServer(d.engine, d.daemon.sealer, str(tmp_path / "unused.sock"), d.daemon.killer.host).attest(
                run_id, parent.pid, os.geteuid(), "tree")
            go.touch()
            outsider = start_py_agent(d.endpoint, loops=5, **{**env, "AGENT_NAME": "outside"})
            assert outsider.wait(60) == 0 and parent.wait(60) == 0
            assert wait_for(lambda: d.daemon.otlp_server.rejected_spans >= 11, 30)
            row = wait_for(lambda: (r := _run(d.engine, run_id)).tool_calls >= 5 and r)
            time.sleep(3 * 0.25)  # a few more ticks: nothing more arrives for it
            row = _run(d.engine, run_id)
            assert (row.tool_calls, row.steps, row.source, row.agent) == (5, 5, "exec", "exec-bot")
            assert otlp_runs(d.engine) == []  # refused spans start no run of their own either
        finally:
            for p in (parent, outsider):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()


def test_span_only_runs_end_by_silence_or_their_root_span_completed_without_alert(db_url):
    with OtlpDaemon(db_url, defaults={"heartbeat_timeout_s": 1.0}) as d:
        assert post(d.address, spans_request(2, conversation="quiet").SerializeToString(), PB)[0] == 200
        quiet = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.status == "completed"], 30)
        assert quiet and quiet[0].stop_reason is None and quiet[0].tool_calls == 2
        # The next span of that conversation starts a new run.
        assert post(d.address, spans_request(1, conversation="quiet").SerializeToString(), PB)[0] == 200
        assert wait_for(lambda: len(otlp_runs(d.engine)) == 2)
        # A run whose root invoke_agent span ended is completed at once.
        agent = start_py_agent(d.endpoint, loops=3, AGENT_NAME="short-bot")
        assert agent.wait(60) == 0
        done = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.agent == "short-bot" and r.status == "completed"])
        assert done and done[0].tool_calls == 3
        assert alerts_of(d.engine) == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_otlp_config_is_checked_loudly(db_url):
    assert parse({}).otlp.listen == ""
    c = parse({"otlp": {"listen": "127.0.0.1:4318", "kill_mode": "process", "max_request_bytes": 1 << 20}}).otlp
    assert (c.listen, c.kill_mode, c.max_request_bytes) == ("127.0.0.1:4318", "process", 1 << 20)
    for bad, key in (({"listen": "4318"}, "otlp.listen"), ({"kill_mode": "tree"}, "otlp.kill_mode"),
                     ({"max_request_bytes": 0}, "otlp.max_request_bytes"), ({"listn": ""}, "otlp.listn")):
        with pytest.raises(ConfigError) as err:
            parse({"otlp": bad})
        assert key in str(err.value) and "\n" not in str(err.value)
    # A port someone else holds: one line naming the key, at start.
    import socket

    from watchdog.daemon.otlp.server import OtlpServer
    from watchdog.store.engine import make_engine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        cfg = parse({"otlp": {"listen": f"127.0.0.1:{s.getsockname()[1]}"}})
        engine = make_engine(db_url)
        with pytest.raises(ConfigError, match=r"\[otlp\] listen"):
            OtlpServer(engine, cfg, None, "h").start()
        engine.dispose()
