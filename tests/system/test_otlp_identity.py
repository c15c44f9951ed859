"""issue 32 (items 1, 3, 4, 7) on the OTLP receiver: a span counts by WHO sent it, never by the names it carries.

Each attack against a healthy victim (a real OTel Python exporter with its own bearer token in
OTEL_EXPORTER_OTLP_HEADERS) that runs to its normal exit 0; the attacker is another Unix user
(useradd) where the attack needs one. The daemon is the daemon's own code in this process
(tests/otlp_support.py); its receiver listens on loopback.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import time
import uuid

import pytest
from sqlalchemy import select

from attest_support import foreign_python, local_user
from daemon_support import actions
from otlp_support import OtlpDaemon, otel_headers, otlp_runs, post, start_py_agent, wait_for
from watchdog.daemon.otlp import server as otlp_server
from watchdog.daemon.otlp.connections import PER_SENDER_MAX
from watchdog.daemon.otlp.senders import sender_of
from watchdog.store.schema import alerts, runs

VICTIM_TOKEN = "victim-token-" + "a1" * 12
MALLORY_TOKEN = "mallory-token-" + "b2" * 12
TOKENS = [f"{VICTIM_TOKEN} agent=victim-bot owner=victim", f"{MALLORY_TOKEN} agent=victim-bot,mallory-bot owner=mallory"]
JS = {"Content-Type": "application/json"}
VICTIM_ROUNDS = 6  # tool calls of the healthy victim: under the max_tool_calls of 10

# Another user's sender: stdlib only (the body on stdin, the token or "-" for none), prints the status.
POST_AS = """
import http.client, sys
host, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
h = {"Content-Type": "application/json"}
if token != "-":
    h["Authorization"] = "Bearer " + token
c = http.client.HTTPConnection(host, port, timeout=30)
c.request("POST", "/v1/traces", body=sys.stdin.buffer.read(), headers=h)
r = c.getresponse()
print(r.status, r.read().decode()[:300])
"""

# Slowloris: N connections, each trickling a header byte every half second for S seconds.
TRICKLE = """
import socket, sys, time
host, port, n, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
for _ in range(n):
    s = socket.create_connection((host, port))
    s.sendall(b"POST /v1/traces HTTP/1.1\\r\\nHost: x\\r\\n")
    socks.append(s)
end = time.time() + secs
while time.time() < end:
    for s in socks:
        try:
            s.send(b"X")
        except OSError:
            pass
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def mallory():
    with local_user("mallory") as name:
        yield name


def _span(name: str, attrs: dict, trace_id: str) -> dict:
    def value(v):
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": str(v)}

    return {"traceId": trace_id, "spanId": uuid.uuid4().hex[:16], "name": name, "startTimeUnixNano": "1",
            "endTimeUnixNano": "2", "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}


def spans_json(*, agent: str, trace_id: str, tools: int = 0, input_tokens: int = 0,
               claimed_pid: int | None = None) -> str:
    """OTLP/JSON with `tools` execute_tool spans (and a chat span of `input_tokens`) in one trace."""
    spans = [_span(f"execute_tool search", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                                            "gen_ai.tool.call.arguments": json.dumps({"q": i})}, trace_id)
             for i in range(tools)]
    if input_tokens:
        spans.append(_span("chat gpt-4o", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                                           "gen_ai.usage.input_tokens": input_tokens,
                                           "gen_ai.usage.output_tokens": 1}, trace_id))
    attrs = [{"key": "service.name", "value": {"stringValue": agent}}]
    if claimed_pid is not None:
        attrs.append({"key": "process.pid", "value": {"intValue": str(claimed_pid)}})
    return json.dumps({"resourceSpans": [{"resource": {"attributes": attrs}, "scopeSpans": [{"spans": spans}]}]})


def post_as(user: str, address: tuple[str, int], body: str, token: str | None) -> int:
    exe, env = foreign_python()
    p = subprocess.run([exe, "-c", POST_AS, address[0], str(address[1]), token or "-"], user=user, env=env,
                       input=body, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.split()[0])


def victim(d: OtlpDaemon, *, rounds: int = VICTIM_ROUNDS, pause_s: float = 0.4, **env: str) -> subprocess.Popen:
    return start_py_agent(d.endpoint, loops=rounds, AGENT_NAME="victim-bot", AGENT_PAUSE_S=str(pause_s),
                          OTEL_EXPORTER_OTLP_HEADERS=otel_headers(VICTIM_TOKEN), **env)


def victim_run(d: OtlpDaemon):
    got = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.agent == "victim-bot" and r.tool_calls > 0])
    assert got, otlp_runs(d.engine)
    return got[0]


def exits_healthy(p: subprocess.Popen, d: OtlpDaemon, run_id: str) -> None:
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, (p.returncode, out)
    done = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.id == run_id and r.status == "completed"])
    assert done and done[0].tool_calls == VICTIM_ROUNDS and done[0].stop_reason is None, otlp_runs(d.engine)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_unauthenticated_spans_naming_the_victims_agent_get_401_and_book_nothing(db_url, caplog):
    """Item 1 (receiver side), on PostgreSQL: 2e9 tokens claimed for the victim's agent with no token,
    an unknown one, or a token of another agent get nothing booked; the victim's run is its token owner's."""
    caplog.set_level(logging.WARNING, logger="watchdog.otlp")
    with OtlpDaemon(db_url, tokens=TOKENS, otlp={"allow_anonymous": False}) as d:
        p = victim(d)
        run = victim_run(d)
        trace = run.labels["otel.trace_id"]
        poison = spans_json(agent="victim-bot", trace_id=trace, tools=20, input_tokens=2_000_000_000)
        assert post(d.address, poison.encode(), JS, token=None)[0] == 401
        assert post(d.address, poison.encode(), JS, token="not-a-token-of-this-daemon")[0] == 401
        status, body = post(d.address, spans_json(agent="mallory-bot", trace_id=trace, tools=1).encode(), JS,
                            token=MALLORY_TOKEN)
        assert status == 200  # a token's own agent: counted, as a run of its owner's
        exits_healthy(p, d, run.id)
        assert d.daemon.otlp_server.unauthenticated == 2
        assert "refused spans from 127.0.0.1" in caplog.text and "no bearer token" in caplog.text
        assert all(r.tokens_in < 1_000_000 for r in otlp_runs(d.engine)), otlp_runs(d.engine)
        with d.engine.connect() as conn:
            assert sender_of(conn, d.daemon.sealer, run.id) == ("victim", False)
            theirs = [r for r in otlp_runs(d.engine) if r.agent == "mallory-bot"]
            assert len(theirs) == 1 and sender_of(conn, d.daemon.sealer, theirs[0].id) == ("mallory", False)


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_spans_naming_a_pinned_runs_trace_from_another_sender_start_their_own_run(db_url, mallory):
    """Item 3: kill_mode process; another user with a token for the same agent sends 20 tool spans
    in the victim's trace, claiming its pid; so does another process of the victim's own user.
    Neither counts for the victim's pinned run: each is a run of its own sender, never signalled."""
    with OtlpDaemon(db_url, kill_mode="process", tokens=TOKENS) as d:
        p = victim(d, OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="process")
        run = victim_run(d)
        assert run.kill_mode == "process" and run.pid == p.pid
        trace = run.labels["otel.trace_id"]
        attack = spans_json(agent="victim-bot", trace_id=trace, tools=20, claimed_pid=p.pid)
        assert post_as(mallory, d.address, attack, MALLORY_TOKEN) == 200
        # The same user, the victim's own token, another process (this one): not the pinned process.
        assert post(d.address, attack.encode(), JS, token=VICTIM_TOKEN)[0] == 200
        exits_healthy(p, d, run.id)
        others = [r for r in otlp_runs(d.engine) if r.id != run.id]
        assert sorted(r.tool_calls for r in others) == [20, 20], others
        assert all(r.kill_mode == "cooperative" for r in others)
        with d.engine.connect() as conn:
            assert sorted(sender_of(conn, d.daemon.sealer, r.id)[0] for r in others) == ["mallory", "victim"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_row_inflated_by_a_store_writer_does_not_get_a_pinned_sender_signalled(db_url):
    """Item 4 (SQLite): UPDATE runs SET tool_calls = 999 on a kernel-pinned span run stops it in
    the store, but the signal rests only on the events the receiver MAC'd: held, the victim exits 0.
    (The honest control, a pinned runaway SIGTERMed: test_otlp_agents' kill_mode process test.)"""
    with OtlpDaemon(db_url, kill_mode="process", tokens=TOKENS) as d:
        p = victim(d, pause_s=0.6, OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="process")
        run = victim_run(d)
        assert run.kill_mode == "process"
        path = db_url.removeprefix("sqlite:///")
        with sqlite3.connect(path, timeout=30) as raw:  # any writer of the store's file
            raw.execute("UPDATE runs SET tool_calls = 999 WHERE id = ?", (run.id,))
        assert wait_for(lambda: "signal_held" in actions(d.engine, run.id)), actions(d.engine, run.id)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, (p.returncode, out)
        assert "sigterm" not in actions(d.engine, run.id)
        with d.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run.id)).one()
        assert row.stop_reason == "max_tool_calls"  # stopped in the store, on the row's word: cooperatively


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_trickling_headers_from_another_user_do_not_keep_honest_exports_out(db_url, mallory, monkeypatch):
    """Item 7: 16 connections trickling header bytes hold at most that user's share of the slots
    and are cut off at the header deadline; honest exports meanwhile all get 200 and are counted."""
    monkeypatch.setattr(otlp_server, "HEADERS_DEADLINE_S", 3.0)
    with OtlpDaemon(db_url, tokens=TOKENS) as d:
        exe, env = foreign_python()
        slow = subprocess.Popen([exe, "-c", TRICKLE, *map(str, d.address), "16", "6"], user=mallory, env=env)
        try:
            srv = d.daemon.otlp_server._server
            uid = int(subprocess.run(["id", "-u", mallory], capture_output=True, text=True).stdout)
            assert wait_for(lambda: srv.held(uid) == PER_SENDER_MAX, 10), srv.held(uid)
            p = victim(d, pause_s=0.3)
            run = victim_run(d)
            statuses = []
            for i in range(5):
                body = spans_json(agent="victim-bot", trace_id=uuid.uuid4().hex, tools=1)
                statuses.append(post(d.address, body.encode(), JS, token=VICTIM_TOKEN, timeout_s=5)[0])
                time.sleep(0.3)
            assert statuses == [200] * 5
            exits_healthy(p, d, run.id)
            assert wait_for(lambda: srv.deadlines.cut >= 8, 10), srv.deadlines.cut
        finally:
            slow.kill()
            slow.wait()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_sender_starting_runs_past_the_cap_gets_429_and_one_alert(db_url):
    """Item 7: each trace complete in its own request; past max_new_runs_per_min the sender gets
    429 (one alert), while another sender's new run is still taken."""
    with OtlpDaemon(db_url, tokens=TOKENS, otlp={"max_new_runs_per_min": 5}) as d:
        statuses = [post(d.address, spans_json(agent="mallory-bot", trace_id=uuid.uuid4().hex, tools=1).encode(),
                         JS, token=MALLORY_TOKEN)[0] for _ in range(8)]
        assert statuses == [200] * 5 + [429] * 3
        p = victim(d, pause_s=0.1)
        run = victim_run(d)
        exits_healthy(p, d, run.id)
        assert len([r for r in otlp_runs(d.engine) if r.agent == "mallory-bot"]) == 5
        with d.engine.connect() as conn:
            keys = conn.execute(select(alerts.c.dedupe_key).where(alerts.c.dedupe_key.like("otlp-flood:%"))).all()
        assert [k[0].split(":")[1] for k in keys] == ["mallory"]
        # A token revoked in the file (the daemon reads it again on SIGHUP): 401 from then on.
        tokens = d.config.otlp.tokens_file
        with open(tokens, "w") as f:
            f.write(TOKENS[0] + "\n")
        d.daemon.otlp_server.reload_tokens()
        body = spans_json(agent="mallory-bot", trace_id=uuid.uuid4().hex, tools=1).encode()
        assert post(d.address, body, JS, token=MALLORY_TOKEN)[0] == 401


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_anonymous_spans_count_only_for_their_senders_own_runs_judged_by_defaults(db_url):
    """allow_anonymous = true: spans without a token claiming the victim's agent (whose profile
    allows 100 tool calls) make a run of `uid N`, judged by [defaults] (10), never the victim's."""
    with OtlpDaemon(db_url, tokens=TOKENS, otlp={"allow_anonymous": True},
                    agents={"victim-bot": {"max_tool_calls": 100}}) as d:
        p = victim(d)
        run = victim_run(d)
        body = spans_json(agent="victim-bot", trace_id=run.labels["otel.trace_id"], tools=15).encode()
        assert post(d.address, body, JS, token=None)[0] == 200
        exits_healthy(p, d, run.id)
        (anon,) = [r for r in otlp_runs(d.engine) if r.id != run.id]
        assert anon.tool_calls == 15
        with d.engine.connect() as conn:
            assert sender_of(conn, d.daemon.sealer, anon.id) == (f"uid {os.getuid()}", True)
        stopped = wait_for(lambda: [r for r in otlp_runs(d.engine) if r.id == anon.id and r.stop_reason])
        assert stopped and stopped[0].stop_reason == "max_tool_calls", otlp_runs(d.engine)  # [defaults]' 10


def test_a_bad_tokens_file_is_one_loud_line_naming_the_key(tmp_path):
    from watchdog.core.config import parse
    from watchdog.daemon.otlp.auth import load_tokens
    from watchdog.errors import ConfigError

    path = tmp_path / "tokens"
    path.write_text("# ok\n\nshort agent=a\n")
    cfg = parse({"otlp": {"tokens_file": str(path)}})
    with pytest.raises(ConfigError) as e:
        load_tokens(cfg)
    assert "[otlp] tokens_file" in str(e.value) and "line 3" in str(e.value) and "\n" not in str(e.value)
    path.write_text(f"{VICTIM_TOKEN} owner=victim\n")
    with pytest.raises(ConfigError, match="no agent=NAME"):
        load_tokens(cfg)
    os.chmod(path, 0o644)
    path.write_text(f"{VICTIM_TOKEN} agent=a,b owner=victim\n")
    assert [i.name for _d, i in load_tokens(cfg)] == ["victim"]


def test_the_socket_hands_a_runs_token_only_to_the_process_its_row_registers(sqlite_url):
    """exec in a systemd scope asks for the receiver and its run's token before its command runs
    (`otlp_only`, not attested yet): only the process the run's row registers gets it."""
    from attest_support import Attestor
    from watchdog import Watchdog
    from watchdog.sdk.attest import request_reply

    attestor = Attestor(sqlite_url)
    attestor.server.otlp = lambda: "http://127.0.0.1:4318/v1/traces"
    attestor.start()
    wd = Watchdog(sqlite_url, attest_socket="")
    try:
        with wd.run(agent="a", kill_mode="process", guards=False) as run:
            ok, why, key, otlp = request_reply(attestor.socket, run.id, None, otlp_only=True)
            assert ok and key is None, why  # not attested: no evidence key
            assert otlp is not None and otlp["endpoint"] == "http://127.0.0.1:4318/v1/traces"
            assert attestor.sealer.otlp_token_ok(otlp["token"]) == run.id
            with attestor.engine.begin() as conn:  # the row names another process: refused
                conn.execute(runs.update().where(runs.c.id == run.id).values(pid=1))
            ok, why, _key, otlp = request_reply(attestor.socket, run.id, None, otlp_only=True)
            assert not ok and otlp is None and "registered with pid 1" in why
    finally:
        wd.close()
        attestor.close()
