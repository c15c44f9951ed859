"""`POST /v1/logs` (the coding CLIs' log events) under the traces' identity rules, and the hook's
run that nobody else can pre-empt or capture (a hostile review of issues 32 and 33).

The log events come from a real OpenTelemetry exporter (opentelemetry-sdk's OTLPLogExporter, in
a process of its own, configured the way the CLIs are: OTEL_EXPORTER_OTLP_LOGS_ENDPOINT and
OTEL_EXPORTER_OTLP_LOGS_HEADERS), or as raw OTLP/JSON where another Unix user sends them; the
hook is the real `agent-watchdog hook claude-code` command; the daemon is the daemon's own code
(tests/otlp_support.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from attest_support import foreign_python, local_user
from otlp_support import OtlpDaemon, otel_headers, post, wait_for
from watchdog.daemon.otlp import logruns
from watchdog.daemon.otlp.senders import sender_of
from watchdog.store.schema import alerts, runs

AW = str(Path(sys.executable).with_name("agent-watchdog"))
VICTIM_TOKEN = "victim-logs-token-" + "c3" * 10
MALLORY_TOKEN = "mallory-logs-token-" + "d4" * 10
NARROW_TOKEN = "narrow-logs-token-" + "e5" * 10
TOKENS = [f"{VICTIM_TOKEN} agent=victim-bot owner=victim",
          f"{MALLORY_TOKEN} agent=victim-bot,mallory-bot owner=mallory",
          f"{NARROW_TOKEN} agent=other-bot owner=victim"]
JS = {"Content-Type": "application/json"}
LOGS = "/v1/logs"

# The real exporter: `steps` api_request and `tools` tool_result events of session argv[1];
# prints each export's result (SUCCESS / FAILURE).
EXPORT = r"""
import os, sys
from opentelemetry._logs import LogRecord
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

results = []
class Recording(OTLPLogExporter):
    def export(self, batch):
        r = super().export(batch)
        results.append(r.name)
        return r

sid, steps, tools = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
res = {"service.name": "claude-code"}
if os.environ.get("AW_AGENT"):
    res["agent_watchdog.agent"] = os.environ["AW_AGENT"]
provider = LoggerProvider(resource=Resource(res))
provider.add_log_record_processor(SimpleLogRecordProcessor(Recording()))
logger = provider.get_logger("com.anthropic.claude_code.events")
for i in range(steps):
    logger.emit(LogRecord(body="claude_code.api_request", attributes={
        "session.id": sid, "event.name": "api_request", "model": "gpt-4o", "input_tokens": 1000, "output_tokens": 200}))
for i in range(tools):
    logger.emit(LogRecord(body="claude_code.tool_result", attributes={
        "session.id": sid, "event.name": "tool_result", "tool_name": "Bash", "tool_use_id": f"toolu_{i}",
        "success": "true"}))
provider.shutdown()
print(" ".join(results))
"""

POST_AS = """
import http.client, sys
host, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
h = {"Content-Type": "application/json"}
if token != "-":
    h["Authorization"] = "Bearer " + token
c = http.client.HTTPConnection(host, port, timeout=30)
c.request("POST", "/v1/logs", body=sys.stdin.buffer.read(), headers=h)
r = c.getresponse()
print(r.status, r.read().decode()[:300])
"""


@pytest.fixture(scope="module")
def mallory():
    with local_user("mallory") as name:
        yield name


@pytest.fixture
def short_hold(monkeypatch):
    monkeypatch.setattr(logruns, "HOLD_S", 0.5)  # no hook in these tests: the sender's own run soon


def export(d: OtlpDaemon, session: str, *, steps: int = 0, tools: int = 0, token: str | None = VICTIM_TOKEN,
           agent: str | None = "victim-bot") -> list[str]:
    host, port = d.address
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_WATCHDOG_"))}
    env["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"] = f"http://{host}:{port}{LOGS}"
    if token:
        env["OTEL_EXPORTER_OTLP_LOGS_HEADERS"] = otel_headers(token)
    if agent:
        env["AW_AGENT"] = agent
    done = subprocess.run([sys.executable, "-c", EXPORT, session, str(steps), str(tools)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def logs_json(session: str, *, tools: int = 0, steps: int = 0, agent: str | None = "victim-bot") -> str:
    def rec(body: str, attrs: dict) -> dict:
        return {"body": {"stringValue": body}, "attributes": [
            {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": str(v)}}
            for k, v in {"session.id": session, **attrs}.items()]}

    records = [rec("claude_code.api_request", {"model": "gpt-4o", "input_tokens": 1000, "output_tokens": 200})
               for _ in range(steps)]
    records += [rec("claude_code.tool_result", {"tool_name": "Bash", "tool_use_id": uuid.uuid4().hex,
                                                "success": "true"}) for _ in range(tools)]
    res = [{"key": "service.name", "value": {"stringValue": "claude-code"}}]
    if agent:
        res.append({"key": "agent_watchdog.agent", "value": {"stringValue": agent}})
    return json.dumps({"resourceLogs": [{"resource": {"attributes": res}, "scopeLogs": [{"logRecords": records}]}]})


def post_as(user: str, address: tuple[str, int], body: str, token: str | None) -> int:
    exe, env = foreign_python()
    p = subprocess.run([exe, "-c", POST_AS, address[0], str(address[1]), token or "-"], user=user, env=env,
                       input=body, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.split()[0])


def all_runs(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(runs).order_by(runs.c.started_at)).all()


def session_runs(engine, session: str) -> list:
    return [r for r in all_runs(engine) if (r.labels or {}).get("session") == session]


def hook(url: str, session: str, home: Path, *, agent: str = "victim-bot", tool_use_id: str = "toolu_0",
         env: dict | None = None, command: str = "true", config: str | None = None,
         **fields: str) -> subprocess.CompletedProcess:
    """One real PreToolUse hook call of Claude Code's session (in-process: no resident helper);
    `fields`: more of the hook input (a sub-agent's agent_id, agent_type)."""
    event = json.dumps({"session_id": session, "hook_event_name": "PreToolUse", "tool_name": "Bash",
                        "tool_input": {"command": command}, "tool_use_id": tool_use_id, **fields})
    e = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_WATCHDOG_", "XDG_"))}
    e.update(HOME=str(home), AGENT_WATCHDOG_HOOK_RESIDENT="0", **(env or {}))
    return subprocess.run([AW, "hook", "claude-code", "--agent", agent, "--db", url,
                           *(["--config", config] if config else [])], input=event, env=e,
                          capture_output=True, text=True, timeout=60)


# --- item 1: the traces' rules on /v1/logs ---------------------------------------------


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_log_events_are_booked_under_their_token_and_only_for_its_agents(db_url, short_hold):
    """No token: 401. A token for agent other-bot sending the victim's agent: refused, no run.
    The victim's token: a run of its own, booked under its owner in a sealed sender record."""
    with OtlpDaemon(db_url, tokens=TOKENS) as d:
        assert export(d, "s-none", steps=1, tools=1, token=None) == ["FAILURE"] * 2
        status, body = post(d.address, logs_json("s-narrow", tools=3).encode(), JS, token=NARROW_TOKEN, path=LOGS)
        assert status == 200 and b"may not report for agent" in body, body
        assert export(d, "s-victim", steps=2, tools=3) == ["SUCCESS"] * 5
        got = wait_for(lambda: [r for r in session_runs(d.engine, "s-victim") if r.tool_calls == 3])
        assert got, all_runs(d.engine)
        (run,) = got
        assert (run.source, run.agent, run.steps, run.tokens_in) == ("otlp", "victim-bot", 2, 2000)
        with d.engine.connect() as conn:
            assert sender_of(conn, d.daemon.sealer, run.id) == ("victim", False)
        assert session_runs(d.engine, "s-narrow") == [] and session_runs(d.engine, "s-none") == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_anonymous_log_events_are_their_senders_run_judged_by_defaults(db_url):
    """allow_anonymous: events claiming the victim's agent (its profile: 100 tool calls) are a run
    of `uid N`, judged by [defaults] (10): stopped there, never the victim's budget."""
    with OtlpDaemon(db_url, tokens=TOKENS, otlp={"allow_anonymous": True},
                    defaults={"max_tool_calls": 10, "max_identical_calls": 100},
                    agents={"victim-bot": {"max_tool_calls": 100, "max_identical_calls": 100}}) as d:
        assert export(d, "s-anon", tools=15, token=None) == ["SUCCESS"] * 15
        got = wait_for(lambda: [r for r in session_runs(d.engine, "s-anon") if r.stop_reason])
        assert got, all_runs(d.engine)
        (run,) = got
        assert (run.stop_reason, run.agent) == ("max_tool_calls", "victim-bot")
        with d.engine.connect() as conn:
            assert sender_of(conn, d.daemon.sealer, run.id) == (f"uid {os.getuid()}", True)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_log_sessions_past_the_cap_get_429_and_one_alert(db_url, short_hold):
    """max_new_runs_per_min = 3: a sender's fourth and fifth new session get 429 (one alert);
    another sender's new session is still taken."""
    with OtlpDaemon(db_url, tokens=TOKENS, otlp={"max_new_runs_per_min": 3}) as d:
        statuses = [post(d.address, logs_json(f"flood-{i}", tools=1, agent="mallory-bot").encode(), JS,
                         token=MALLORY_TOKEN, path=LOGS)[0] for i in range(5)]
        assert statuses == [200] * 3 + [429] * 2
        assert export(d, "s-victim", tools=1) == ["SUCCESS"]
        assert wait_for(lambda: session_runs(d.engine, "s-victim"))
        assert wait_for(lambda: len([r for r in all_runs(d.engine) if r.agent == "mallory-bot"]) == 3)
        with d.engine.connect() as conn:
            keys = conn.execute(select(alerts.c.dedupe_key).where(alerts.c.dedupe_key.like("otlp-flood:%"))).all()
        assert [k[0].split(":")[1] for k in keys] == ["mallory"]


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_another_users_log_events_with_the_same_session_never_reach_the_first_users_run(db_url, mallory,
                                                                                        short_hold):
    """Mallory (another Unix user, a token for the victim's agent) sends 20 tool results naming
    the victim's session id: they are a run of Mallory's own; the victim's run keeps its 3."""
    with OtlpDaemon(db_url, tokens=TOKENS) as d:
        assert export(d, "shared-session", tools=3) == ["SUCCESS"] * 3
        (victim,) = wait_for(lambda: [r for r in session_runs(d.engine, "shared-session") if r.tool_calls == 3])
        assert post_as(mallory, d.address, logs_json("shared-session", tools=20), MALLORY_TOKEN) == 200
        theirs = wait_for(lambda: [r for r in session_runs(d.engine, "shared-session") if r.id != victim.id])
        assert [r.tool_calls for r in theirs] == [20]
        with d.engine.connect() as conn:
            assert sender_of(conn, d.daemon.sealer, theirs[0].id) == ("mallory", False)
        assert [r.tool_calls for r in session_runs(d.engine, "shared-session") if r.id == victim.id] == [3]


# --- item 2: the hook's run, on SQLite ------------------------------------------------------


def _old_predictable_id(session: str, uid: int) -> str:
    """What the hook's run id was before: uuid5 of (cli, uid, session, generation), anyone's to compute."""
    ns = uuid.UUID("6f1d3c1e-2b7a-4c55-9a0e-7d1b0c2f9e41")
    return uuid.uuid5(ns, f"claude-code\x00{uid}\x00{session}\x000").hex


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_run_made_first_under_the_hooks_id_is_not_the_sessions_run_sqlite(db_url, tmp_path):
    """A writer makes the session's run first, as the hook would have named it, already killed
    (so that every call is refused) or with 999 tool calls: the hook's own run is another one."""
    from watchdog.store import witness
    from watchdog.store.engine import make_engine

    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            witness.create_run(conn, run_id=_old_predictable_id("s-pre", os.getuid()), agent="victim-bot",
                               source="hook", host="x", kill_mode="cooperative",
                               labels={"cli": "claude-code", "session": "s-pre"}, now=witness.store_now(conn))
            conn.execute(runs.update().values(status="killed", stop_reason="manual"))
        done = hook(db_url, "s-pre", tmp_path / "home")
        assert done.returncode == 0 and "stopped" not in done.stdout, (done.stdout, done.stderr)
        assert "fail-open" not in done.stderr, done.stderr
        mine = [r for r in session_runs(engine, "s-pre") if r.status == "running"]
        assert [(r.tool_calls, r.owner) for r in mine] == [(1, f"uid {os.getuid()}")]
        key = tmp_path / "home" / ".local" / "state" / "agent-watchdog" / "hook-session.key"
        assert (key.stat().st_mode & 0o777) == 0o600
    finally:
        engine.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_log_events_before_the_first_hook_call_land_on_the_hooks_own_run_sqlite(db_url, tmp_path):
    """The CLI exports its first API request before its first tool call: the receiver makes no
    run for it (none the hook would have to own), holds it, and counts it on the hook's run."""
    with OtlpDaemon(db_url, tokens=[f"{VICTIM_TOKEN} agent=victim-bot owner=victim"]) as d:
        assert export(d, "s-first", steps=1) == ["SUCCESS"]
        assert d.daemon.otlp_server.logs.held == 1 and session_runs(d.engine, "s-first") == []
        done = hook(db_url, "s-first", tmp_path / "home")
        assert done.returncode == 0 and "fail-open" not in done.stderr, done.stderr
        got = wait_for(lambda: [r for r in session_runs(d.engine, "s-first") if r.steps == 1])
        assert [(r.source, r.tool_calls, r.steps) for r in got] == [("hook", 1, 1)], all_runs(d.engine)
        # Later events count there directly; the same tool call (its tool_use_id) once.
        assert export(d, "s-first", steps=1, tools=1) == ["SUCCESS"] * 2
        got = wait_for(lambda: [r for r in session_runs(d.engine, "s-first") if r.steps == 2])
        assert [(r.source, r.tool_calls) for r in got] == [("hook", 1)], all_runs(d.engine)
        assert len(session_runs(d.engine, "s-first")) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_token_for_another_agent_cannot_feed_a_hooks_run(db_url, tmp_path):
    """The hook's run is agent victim-bot: a token of the same owner for other-bot only is refused."""
    with OtlpDaemon(db_url, tokens=TOKENS) as d:
        assert hook(db_url, "s-scope", tmp_path / "home").returncode == 0
        status, body = post(d.address, logs_json("s-scope", tools=5, agent="other-bot").encode(), JS,
                            token=NARROW_TOKEN, path=LOGS)
        assert status == 200 and b"may not report for agent 'victim-bot'" in body, body
        assert [(r.source, r.tool_calls) for r in session_runs(d.engine, "s-scope")] == [("hook", 1)]


# --- a hostile review of the hook run's lookup and the hold (R11, R6) --------------------------------


def _look_alike(engine, real_id: str, status: str) -> str:
    """A plain-SQL writer of the same SQLite file copies the hook's run (labels, owner), newer."""
    with engine.begin() as conn:
        row = conn.execute(select(runs).where(runs.c.id == real_id)).one()
        rid = uuid.uuid4().hex
        later = row.started_at + dt.timedelta(seconds=1)
        conn.execute(runs.insert().values(
            id=rid, agent=row.agent, status=status, kill_mode="cooperative", host="x", source="hook",
            owner=row.owner, labels=row.labels, started_at=later, last_seen_at=later,
            ended_at=None if status == "running" else later, stop_reason=None if status == "running" else "manual"))
    return rid


def _steps(engine, run_id: str) -> tuple[int, int]:
    with engine.connect() as conn:
        r = conn.execute(select(runs.c.steps, runs.c.tokens_in).where(runs.c.id == run_id)).one()
    return r.steps, r.tokens_in


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_look_alike_of_the_hooks_run_neither_blinds_nor_captures_its_log_events_sqlite(db_url, tmp_path):
    """R11. A `failed` copy of the hook's run (newer, same labels and owner): the events still count
    on the hook's run. A `running` copy too: neither run gets them; they count on a run of the
    sender's own (nothing lost), and the daemon alerts once for the session."""
    with OtlpDaemon(db_url, tokens=[f"{VICTIM_TOKEN} agent=victim-bot owner=victim"]) as d:
        assert hook(db_url, "s-alike", tmp_path / "home").returncode == 0
        (real,) = session_runs(d.engine, "s-alike")
        failed = _look_alike(d.engine, real.id, "failed")
        assert export(d, "s-alike", steps=1) == ["SUCCESS"]
        assert wait_for(lambda: _steps(d.engine, real.id) == (1, 1000)), all_runs(d.engine)
        running = _look_alike(d.engine, real.id, "running")
        assert export(d, "s-alike", steps=2) == ["SUCCESS"] * 2
        own = wait_for(lambda: [r for r in session_runs(d.engine, "s-alike") if r.source == "otlp" and r.steps == 2])
        assert [(r.owner, r.tokens_in) for r in own] == [("victim", 2000)], all_runs(d.engine)
        with d.engine.connect() as conn:
            assert sender_of(conn, d.daemon.sealer, own[0].id) == ("victim", False)
        assert export(d, "s-alike", steps=1) == ["SUCCESS"]
        assert wait_for(lambda: _steps(d.engine, own[0].id) == (3, 3000)), all_runs(d.engine)
        assert [_steps(d.engine, r) for r in (real.id, failed, running)] == [(1, 1000), (0, 0), (0, 0)]
        with d.engine.connect() as conn:
            keys = conn.execute(select(alerts.c.dedupe_key, alerts.c.body)
                                .where(alerts.c.dedupe_key.like("forged:session-%"))).all()
        assert len(keys) == 1 and "s-alike" in keys[0].body and real.id in keys[0].body, keys


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_sender_filling_the_hold_leaves_room_for_another_senders_session(db_url, tmp_path, monkeypatch):
    """R6. Mallory's token opens more new sessions than one sender may hold (the hold, all senders,
    just above that): the victim's new session is still held, and lands on its hook's run."""
    monkeypatch.setattr(logruns, "HOLD_S", 120.0)  # the hold outlasts the test: what is held stays held
    monkeypatch.setattr(logruns, "MAX_HELD", logruns.MAX_HELD_PER_SENDER + 8)
    with OtlpDaemon(db_url, tokens=TOKENS, otlp={"max_new_runs_per_min": 1000}) as d:
        for i in range(logruns.MAX_HELD_PER_SENDER + 8):
            status, _ = post(d.address, logs_json(f"fill-{i}", steps=1, agent="mallory-bot").encode(), JS,
                             token=MALLORY_TOKEN, path=LOGS)
            assert status == 200
        logs = d.daemon.otlp_server.logs
        assert logs.held_by(("mallory", os.getuid())) == logruns.MAX_HELD_PER_SENDER
        assert wait_for(lambda: len([r for r in all_runs(d.engine) if r.agent == "mallory-bot"]) == 8)
        assert export(d, "s-room", steps=1) == ["SUCCESS"]
        assert logs.held_by(("victim", os.getuid())) == 1 and session_runs(d.engine, "s-room") == []
        assert hook(db_url, "s-room", tmp_path / "home").returncode == 0
        got = wait_for(lambda: [r for r in session_runs(d.engine, "s-room") if r.steps == 1])
        assert [(r.source, r.tool_calls) for r in got] == [("hook", 1)], all_runs(d.engine)
        assert len(session_runs(d.engine, "s-room")) == 1


def test_held_sessions_are_flushed_by_the_idle_timer_outside_the_traces_lock(tmp_path):
    """R6. A request never flushes the hold (its cost is the idle timer's), and the flush does
    not wait for the lock /v1/traces holds: it counts a held session on the hook run that
    appeared while a traces request holds that lock."""
    from watchdog.core import lifecycle as lc
    from watchdog.core.config import Config
    from watchdog.daemon.otlp.auth import Identity
    from watchdog.daemon.otlp.ingest import Receiver
    from watchdog.daemon.otlp.logs import Session
    from watchdog.daemon.otlp.mapping import Call
    from watchdog.daemon.otlp.sender import Peer
    from watchdog.store import hooks, access
    from watchdog.store.engine import make_engine

    engine = make_engine(f"sqlite:///{tmp_path}/s.db")
    access.upgrade(engine, "head")
    now_s = [0.0]
    receiver = Receiver(engine, Config(), None, "h")
    lr = logruns.LogsReceiver(engine, receiver, clock=lambda: now_s[0])
    peer, ident = Peer(("127.0.0.1", 1), os.getuid(), None), Identity(name="victim", agents=None)

    def session(sid: str) -> Session:
        return Session(cli="claude-code", session_id=sid, agent="victim-bot", records=1, calls=[
            Call(kind=lc.EventKind.STEP, span_id="", end_ns=0, duration_s=None, model="m", tokens_in=7, tokens_out=1)])

    try:
        assert lr.ingest([session("s-late")], peer, ident).accepted == 1 and lr.held == 1
        rid = uuid.uuid4().hex
        assert hooks.open_session(engine, rid, agent="victim-bot", host="h",
                                  labels={"cli": "claude-code", "session": "s-late"}, uid=os.getuid())
        now_s[0] = logruns.HOLD_S + 1
        assert lr.ingest([session("s-other")], peer, ident).accepted == 1
        assert lr.held == 2 and _steps(engine, rid) == (0, 0)  # the request flushed nothing
        with receiver.lock:  # a /v1/traces request in progress
            t = threading.Thread(target=lr.flush)
            t.start()
            t.join(timeout=30)
            assert not t.is_alive()
        assert _steps(engine, rid) == (1, 7) and lr.held == 1  # s-other: held since now_s, not due
    finally:
        engine.dispose()


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_the_hook_run_lookup_filters_in_sql_and_keeps_the_active_claimants_first(db_url):
    """held_runs: one statement for many held sessions; each gets only the runs of its CLI,
    session, owner and Unix uid (300 other sessions of the same owner around), active first."""
    from watchdog.store import hooks, run_rows, witness
    from watchdog.store.engine import make_engine

    engine = make_engine(db_url)
    uid, tag = os.getuid(), uuid.uuid4().hex[:8]
    try:
        ids = {}
        for i in range(300):
            ids[i] = uuid.uuid4().hex
            assert hooks.open_session(engine, ids[i], agent="victim-bot", host="h",
                                      labels={"cli": "claude-code", "session": f"{tag}-{i}"}, uid=uid)
        stopped = uuid.uuid4().hex
        assert hooks.open_session(engine, stopped, agent="victim-bot", host="h",
                                  labels={"cli": "claude-code", "session": f"{tag}-7"}, uid=uid)
        assert hooks.open_session(engine, uuid.uuid4().hex, agent="victim-bot", host="h",  # another Unix user's
                                  labels={"cli": "claude-code", "session": f"{tag}-8"}, uid=uid + 1)
        with engine.begin() as conn:
            run_rows.move(conn, stopped, "killed", was="running", stop_reason="manual",
                          ended_at=witness.store_now(conn))
            (owner,) = conn.execute(select(runs.c.owner).where(runs.c.id == ids[0])).one()
            keys = [("claude-code", f"{tag}-{i}", owner, uid) for i in (5, 7, 8)]
            keys += [("codex", f"{tag}-5", owner, uid), ("claude-code", f"{tag}-5", "someone-else", uid + 2)]
            got = hooks.held_runs(conn, keys)
        assert [[r.id for r in got[k]] for k in keys] == [[ids[5]], [ids[7], stopped], [ids[8]], [], []]
        assert [r.active for r in got[keys[1]]] == [True, False]
        assert logruns.pick(got[keys[1]]).id == ids[7]  # an active run beats a stopped look-alike
    finally:
        engine.dispose()


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_log_events_with_nul_and_lone_surrogates_never_break_the_receiver(db_url, short_hold):
    """JSON carries NUL and lone surrogates in any string (PostgreSQL's text takes no NUL): a
    session id or tool use id with them is still its sender's session, and the receiver goes on
    answering everyone else."""
    with OtlpDaemon(db_url, tokens=TOKENS) as d:
        odd = logs_json("s-odd-\u0000\ud800\x1b[31m", steps=1, tools=1).replace(
            '"tool_use_id", "value": {"stringValue": "', '"tool_use_id", "value": {"stringValue": "\\u0000\\ud800')
        assert '\\u0000\\ud800' in odd
        status, body = post(d.address, odd.encode(), JS, token=VICTIM_TOKEN, path=LOGS)
        assert status == 200, body
        status, body = post(d.address, logs_json("s-plain", steps=1, tools=2).encode(), JS, token=VICTIM_TOKEN,
                            path=LOGS)
        assert status == 200, body
        assert wait_for(lambda: [(r.steps, r.tool_calls) for r in session_runs(d.engine, "s-plain")] == [(1, 2)], 15)
        assert wait_for(lambda: [(r.steps, r.tool_calls) for r in all_runs(d.engine)
                                 if str((r.labels or {}).get("session", "")).startswith("s-odd-")] == [(1, 1)], 15)
