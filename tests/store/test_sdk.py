"""The agent SDK against real stores (SQLite and PostgreSQL): registration, records,
counters, stops, thread safety, argument checks and the store-outage buffer.

The SDK swallows store failures into its outage buffer so that it never takes an
agent down. A test that only looked at return values would therefore pass while
nothing reached the database: every `wd` here is checked at teardown for an
empty buffer, and the outage warning is an error in every test that does not
expect one.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import warnings

import psutil
import pytest
from sqlalchemy import create_engine, insert, select, text

from watchdog import RunKilled, Watchdog

from watchdog.store import access
from watchdog.core.config import parse as parse_config
from watchdog.core.lifecycle import hash_args
from watchdog.store.engine import make_engine
from watchdog.store.schema import events, runs, settings, utcnow

# An outage warning in a test that does not stage an outage is a failure (tests
# that expect one catch it explicitly with warnings.catch_warnings).
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

WAIT_S = 15.0


# --- helpers ------------------------------------------------------------------


@pytest.fixture
def make_wd():
    """Watchdog factory; at teardown nothing may be left buffered or dropped."""
    made = []

    def factory(url=None, **kw):
        wd = Watchdog(url, **kw)
        made.append(wd)
        return wd

    yield factory
    for wd in made:
        leftover, dropped = wd.buffered, wd.dropped_events
        wd.close()
        if not getattr(wd, "_expect_loss", False):
            assert (leftover, dropped) == (0, 0), "records were buffered or dropped: the store rejected writes"


def publish(engine, config: dict):
    """Publish settings the way the daemon does: one JSON row under key 'config'."""
    with engine.begin() as conn:
        conn.execute(settings.delete().where(settings.c.key == "config"))
        conn.execute(insert(settings).values(key="config", value=config, updated_at=utcnow()))


def run_row(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def event_rows(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.seq)).all()


def request_stop(engine, run_id, reason="max_steps", detail="step 13 > max_steps 12"):
    """What the daemon does: one plain SQL UPDATE from another connection."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE runs SET status = 'stopping', stop_reason = :r, stop_detail = :d WHERE id = :id"),
            {"r": reason, "d": detail, "id": run_id},
        )


def canonical_sha256(args) -> str:
    return hashlib.sha256(
        json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    ).hexdigest()


def assert_counters_match_events(engine, run_id):
    """The denormalised counters equal what the events table says."""
    row = run_row(engine, run_id)
    evs = event_rows(engine, run_id)
    tools = [e for e in evs if e.kind == "tool"]
    assert row.steps == sum(e.kind == "step" for e in evs)
    assert row.tool_calls == len(tools)
    assert row.tool_errors == sum(e.ok is False for e in tools)
    assert row.tokens_in == sum(e.tokens_in or 0 for e in evs)
    assert row.tokens_out == sum(e.tokens_out or 0 for e in evs)
    assert row.cost_eur == pytest.approx(sum(e.cost_eur or 0 for e in evs))
    assert row.last_seq == max((e.seq for e in evs), default=0)
    return row, evs


PROFILE_TOML = """
[defaults]
max_steps = 12
max_cost_eur = 2.0

[agents.support-bot]
max_steps = 8
max_tool_calls = 20

[prices."gpt-x"]
input_eur_per_mtok = 2.0
output_eur_per_mtok = 12.0
"""


# --- registration and lifecycle -------------------------------------------------


def test_run_registration_records_identity_kill_mode_labels_and_lower_budgets(db_url, engine, make_wd):
    publish(engine, parse_config(__import__("tomllib").loads(PROFILE_TOML)).published())
    wd = make_wd(db_url)
    before = utcnow()
    with wd.run(agent="support-bot", kill_mode="process", labels={"team": "care", "ticket": 42},
                max_steps=5, max_cost_eur=0.5) as run:
        row = run_row(engine, run.id)
        assert row.agent == "support-bot"
        assert row.status == "running"
        assert row.host == socket.gethostname()
        assert row.pid == os.getpid()
        # Equal to psutil's own reading, bit for bit: the daemon compares them.
        assert row.pid_create_time == psutil.Process().create_time()
        assert row.kill_mode == "process"
        assert row.labels == {"team": "care", "ticket": 42}
        assert (row.max_steps, row.max_cost_eur) == (5, 0.5)
        assert (row.max_tool_calls, row.max_wall_s, row.max_identical_calls, row.heartbeat_timeout_s) == (None,) * 4
        assert (row.steps, row.tool_calls, row.cost_eur) == (0, 0, 0.0)
        assert before <= row.started_at <= utcnow()
        assert row.ended_at is None
    row = run_row(engine, run.id)
    assert row.status == "completed"
    assert row.stop_reason is None
    assert row.started_at <= row.ended_at <= utcnow()


def test_cooperative_is_the_default_kill_mode_and_run_ids_are_unique(db_url, engine, make_wd):
    wd = make_wd(db_url)
    ids = set()
    for _ in range(3):
        with wd.run(agent="a") as run:
            ids.add(run.id)
    assert len(ids) == 3
    with engine.connect() as conn:
        modes = conn.execute(select(runs.c.kill_mode)).scalars().all()
    assert modes == ["cooperative"] * 3


def test_exception_marks_the_run_failed_and_is_re_raised(db_url, engine, make_wd):
    wd = make_wd(db_url)
    with pytest.raises(KeyError):
        with wd.run(agent="a") as run:
            run.step(tokens_in=1)
            raise KeyError("missing-thing")
    row = run_row(engine, run.id)
    assert row.status == "failed"
    assert row.stop_reason is None
    assert "KeyError" in row.stop_detail and "missing-thing" in row.stop_detail
    assert row.ended_at is not None


# --- records: events and counters --------------------------------------------------


def test_every_record_writes_its_event_and_the_run_counters(db_url, engine, make_wd):
    wd = make_wd(db_url)
    t0 = utcnow()
    with wd.run(agent="a") as run:
        run.step(model="gpt-x", tokens_in=204, tokens_out=23, cost_eur=0.01)
        row = run_row(engine, run.id)
        assert (row.steps, row.tokens_in, row.tokens_out, row.cost_eur, row.last_seq) == (1, 204, 23, 0.01, 1)

        assert run.tool_call("search", {"q": "refund"}, lambda q: [q, q]) == ["refund", "refund"]
        run.record_tool("fetch", {"url": "u"}, ok=True, duration_s=0.25)
        run.record_tool("fetch", {"url": "v"}, ok=False, error=TimeoutError("read timed out"), duration_s=1.5)
        run.record_tool("lookup", None, error="HTTP 503")
        run.heartbeat("scanned 200 of 1200 files")
        run.heartbeat()
        run.step(tokens_in=10, tokens_out=5, cost_eur=0.02)

        row, evs = assert_counters_match_events(engine, run.id)
        assert (row.steps, row.tool_calls, row.tool_errors) == (2, 4, 2)
        assert (row.tokens_in, row.tokens_out) == (214, 28)
        assert row.cost_eur == pytest.approx(0.03)
        assert row.progress == "scanned 200 of 1200 files"  # a bare heartbeat keeps the last progress
        assert row.last_seen_at == max(e.at for e in evs)
        assert t0 <= row.last_seen_at <= utcnow()

    assert [e.seq for e in evs] == list(range(1, 9))
    assert [e.kind for e in evs] == ["step", "tool", "tool", "tool", "tool", "heartbeat", "heartbeat", "step"]
    step = evs[0]
    assert (step.model, step.tokens_in, step.tokens_out, step.cost_eur, step.tool) == ("gpt-x", 204, 23, 0.01, None)
    search = evs[1]
    assert (search.tool, search.ok, search.error_class) == ("search", True, None)
    assert search.duration_s is not None and search.duration_s >= 0
    assert search.args_hash == canonical_sha256({"q": "refund"})
    assert (evs[2].tool, evs[2].ok, evs[2].duration_s) == ("fetch", True, 0.25)
    assert (evs[3].ok, evs[3].error_class, evs[3].error_msg, evs[3].duration_s) == (
        False, "TimeoutError", "read timed out", 1.5)
    assert (evs[4].tool, evs[4].ok, evs[4].error_class, evs[4].error_msg) == ("lookup", False, "Error", "HTTP 503")
    assert evs[4].args_hash == canonical_sha256({})
    assert (evs[5].progress, evs[6].progress) == ("scanned 200 of 1200 files", None)


def _forbid_third_step(engine):
    """Make the run UPDATE (not the event INSERT) fail from the third step on."""
    if engine.dialect.name == "sqlite":
        ddl = ["CREATE TRIGGER test_forbid BEFORE UPDATE OF steps ON runs WHEN NEW.steps >= 3 "
               "BEGIN SELECT RAISE(ABORT, 'test: third step forbidden'); END"]
        undo = ["DROP TRIGGER test_forbid"]
    else:
        ddl = ["ALTER TABLE runs ADD CONSTRAINT test_forbid CHECK (steps < 3)"]
        undo = ["ALTER TABLE runs DROP CONSTRAINT test_forbid"]
    with engine.begin() as conn:
        for sql in ddl:
            conn.execute(text(sql))

    def restore():
        with engine.begin() as conn:
            for sql in undo:
                conn.execute(text(sql))

    return restore


def test_event_and_counters_commit_together_or_not_at_all(db_url, engine, make_wd):
    """The event INSERT succeeds, then the counter UPDATE fails: the event must not stay."""
    wd = make_wd(db_url)
    wd._expect_loss = True
    with wd.run(agent="a") as run:
        run.step(tokens_in=1)
        run.step(tokens_in=1)
        restore = _forbid_third_step(engine)
        try:
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                run.step(tokens_in=1)  # the store refuses the UPDATE: the agent goes on
            row, evs = assert_counters_match_events(engine, run.id)
            assert (row.steps, len(evs)) == (2, 2)
        finally:
            restore()
        run.step(tokens_in=1)
        assert_counters_match_events(engine, run.id)
    assert run_row(engine, run.id).status == "completed"


def test_a_record_the_store_rejects_is_dropped_not_retried_forever(db_url, engine, make_wd):
    """A record that can never be written (here: its seq already exists, as after a commit
    whose acknowledgement was lost) must not block every later record in the buffer, or
    the run would never again see a stop request."""
    wd = make_wd(db_url)
    with wd.run(agent="a") as run:
        run.step(tokens_in=1)  # seq 1
        with engine.begin() as conn:
            conn.execute(insert(events).values(run_id=run.id, seq=2, at=utcnow(), kind="heartbeat"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run.step(tokens_in=1)  # seq 2: a unique violation, every time it is tried
            run.step(tokens_in=1)  # seq 3: must land
        assert wd.buffered == 0
        assert wd.rejected_events == 1
        assert any("rejected" in str(w.message) for w in caught)
        request_stop(engine, run.id)
        with pytest.raises(RunKilled):
            run.heartbeat()
    row = run_row(engine, run.id)
    assert (row.steps, row.last_seq, row.status) == (2, 4, "killed")
    assert [e.seq for e in event_rows(engine, run.id)] == [1, 2, 3, 4]


def test_args_hash_is_sha256_of_canonical_json_and_args_are_not_stored(db_url, engine, make_wd):
    wd = make_wd(db_url)
    a = {"b": 1, "a": {"y": [1, 2, {"k": "é"}], "x": None}}
    b = {"a": {"x": None, "y": [1, 2, {"k": "é"}]}, "b": 1}  # same content, other key order
    with wd.run(agent="a") as run:
        run.record_tool("t", a)
        run.tool_call("t", b, lambda a, b: None)
        run.record_tool("t", {"b": 2, "a": {"x": None, "y": [1, 2, {"k": "é"}]}})
    evs = event_rows(engine, run.id)
    assert evs[0].args_hash == evs[1].args_hash != evs[2].args_hash
    # The contract, spelled out for another language: sorted keys, no spaces, UTF-8.
    canonical = '{"a":{"x":null,"y":[1,2,{"k":"é"}]},"b":1}'.encode("utf-8")
    assert evs[0].args_hash == hashlib.sha256(canonical).hexdigest() == hash_args(b)
    assert hash_args({"q": "refund"}) == hashlib.sha256(b'{"q":"refund"}').hexdigest()
    # Arguments carry secrets: never stored unless the published settings say so.
    assert [e.args for e in evs] == [None, None, None]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM events WHERE args IS NOT NULL")).scalar() == 0


def test_raw_args_are_stored_only_when_this_agent_says_record_args(db_url, engine, make_wd, monkeypatch):
    wd = make_wd(db_url, record_args=True)
    with wd.run(agent="a") as run:
        run.tool_call("search", {"q": "refund", "n": 3}, lambda q, n: None)
        run.record_tool("fetch", {"url": "https://x"}, ok=False, error="boom")
        run.step(tokens_in=1)
    evs = event_rows(engine, run.id)
    assert [e.args for e in evs] == [{"n": 3, "q": "refund"}, {"url": "https://x"}, None]
    assert evs[0].args_hash == canonical_sha256({"q": "refund", "n": 3})
    # The environment says so too; the constructor wins over it.
    monkeypatch.setenv("AGENT_WATCHDOG_RECORD_ARGS", "1")
    assert make_wd(db_url).record_args is True and make_wd(db_url, record_args=False).record_args is False
    monkeypatch.setenv("AGENT_WATCHDOG_RECORD_ARGS", "maybe")
    with pytest.raises(ValueError, match="AGENT_WATCHDOG_RECORD_ARGS"):
        make_wd(db_url)


def test_the_store_cannot_turn_record_args_on(db_url, engine, make_wd):
    """Anyone who can write the store can write `settings`: what agents record must not follow it."""
    publish(engine, {**parse_config({}).published(), "record_args": True, "store": {"record_args": True}})
    wd = make_wd(db_url)
    with wd.run(agent="a") as run:
        run.tool_call("charge", {"api_key": "sk-live-VICTIM", "card": "4111111111111111"}, lambda **kw: None)
    (ev,) = event_rows(engine, run.id)
    assert ev.args is None and ev.args_hash == canonical_sha256({"api_key": "sk-live-VICTIM",
                                                                 "card": "4111111111111111"})
    assert wd.record_args is False


def test_record_errors_class_keeps_no_message(db_url, engine, make_wd, monkeypatch):
    monkeypatch.setenv("AGENT_WATCHDOG_RECORD_ERRORS", "class")
    wd = make_wd(db_url)
    with pytest.raises(ValueError):
        with wd.run(agent="a", guards=False) as run:
            run.record_tool("fetch", {}, ok=False, error=ConnectionError("api_key=sk-live-X refused"))
            raise ValueError("token=abc in the agent's own error")
    (ev,) = event_rows(engine, run.id)
    assert (ev.error_class, ev.error_msg) == ("ConnectionError", None)
    row = run_row(engine, run.id)
    assert (row.status, row.stop_detail) == ("failed", "ValueError")
    with pytest.raises(ValueError, match="record_errors"):
        make_wd(db_url, record_errors="everything")


def test_tool_exception_is_re_raised_and_recorded_with_class_and_short_message(db_url, engine, make_wd):
    wd = make_wd(db_url)
    calls = []

    class IbanServiceDown(RuntimeError):
        pass

    boom = IbanServiceDown("upstream said:\n" + "x" * 5000)

    def verify_iban(iban):
        calls.append(iban)
        raise boom

    with wd.run(agent="a") as run:
        with pytest.raises(IbanServiceDown) as raised:
            run.tool_call("verify_iban", {"iban": "DE00"}, verify_iban)
        assert raised.value is boom
        assert calls == ["DE00"]
        row = run_row(engine, run.id)
        assert (row.tool_calls, row.tool_errors) == (1, 1)
    (ev,) = event_rows(engine, run.id)
    assert (ev.kind, ev.tool, ev.ok, ev.error_class) == ("tool", "verify_iban", False, "IbanServiceDown")
    assert ev.error_msg.startswith("upstream said: xxx")
    assert "\n" not in ev.error_msg and len(ev.error_msg) <= 200
    assert run_row(engine, run.id).status == "completed"  # the agent handled the tool error


# --- cost ---------------------------------------------------------------------------


def test_cost_comes_from_the_published_price_table_unless_given(db_url, engine, make_wd):
    import tomllib

    # Exactly what the daemon publishes from its [prices] table.
    publish(engine, parse_config(tomllib.loads(PROFILE_TOML)).published())
    wd = make_wd(db_url)
    with wd.run(agent="a") as run:
        run.step(model="gpt-x", tokens_in=1000, tokens_out=500)  # 1000*2/1e6 + 500*12/1e6
        run.step(model="gpt-x", tokens_in=1000, tokens_out=500, cost_eur=0.5)  # explicit wins
        run.step(model="unpriced-model", tokens_in=1000, tokens_out=1000)
        run.step(tokens_in=7)
        run.step(model="unpriced-model")  # no tokens: nothing to price, free whatever the model
    evs = event_rows(engine, run.id)
    # Never a silent zero: a step no published price covers is recorded with no cost (NULL),
    # its tokens counted as unpriced on the run, for the daemon to price or report.
    assert [e.cost_eur for e in evs[:2]] == pytest.approx([0.008, 0.5])
    assert [e.cost_eur for e in evs[2:]] == [None, None, 0.0]
    row = run_row(engine, run.id)
    assert row.cost_eur == pytest.approx(0.508) and row.cost_unpriced_tokens == 2007
    assert run.cost_unpriced_tokens == 2007


# --- stops ----------------------------------------------------------------------------


def test_run_killed_is_a_base_exception():
    assert issubclass(RunKilled, BaseException)
    assert not issubclass(RunKilled, Exception)
    stop = RunKilled("max_cost", "2.10 EUR > 2.00")
    assert (stop.reason, stop.detail) == ("max_cost", "2.10 EUR > 2.00")


def test_stop_requested_by_another_connection_raises_run_killed_through_except_exception(db_url, engine, make_wd):
    wd = make_wd(db_url)
    tool_ran = []
    with pytest.raises(RunKilled) as killed:
        with wd.run(agent="a", kill_mode="process") as run:
            run.step(tokens_in=1)
            request_stop(engine, run.id)
            try:
                run.step(tokens_in=1)  # the daemon's stop is seen on this write
            except Exception:  # noqa: BLE001 — exactly what agents do
                pytest.fail("except Exception: swallowed RunKilled")
            pytest.fail("the write after a stop request did not raise RunKilled")
    assert killed.value.reason == "max_steps"
    assert killed.value.detail == "step 13 > max_steps 12"
    # Once stopped, nothing else runs: not even a tool.
    with pytest.raises(RunKilled):
        run.tool_call("t", {}, lambda: tool_ran.append(1))
    assert tool_ran == []
    row = run_row(engine, run.id)
    assert (row.status, row.stop_reason, row.stop_detail) == ("killed", "max_steps", "step 13 > max_steps 12")
    assert row.ended_at is not None


@pytest.mark.parametrize("record", ["step", "tool_call", "record_tool", "heartbeat"])
def test_every_kind_of_record_sees_the_stop(db_url, engine, make_wd, record):
    wd = make_wd(db_url)
    with pytest.raises(RunKilled) as killed:
        with wd.run(agent="a") as run:
            request_stop(engine, run.id, reason="loop_detected", detail="verify_iban 3x")
            {
                "step": lambda: run.step(tokens_in=1),
                "tool_call": lambda: run.tool_call("t", {"x": 1}, lambda x: x),
                "record_tool": lambda: run.record_tool("t", {"x": 1}),
                "heartbeat": lambda: run.heartbeat("working"),
            }[record]()
    assert killed.value.reason == "loop_detected"
    row = run_row(engine, run.id)
    assert (row.status, row.stop_reason) == ("killed", "loop_detected")


def test_a_caught_stop_still_ends_the_run_killed(db_url, engine, make_wd):
    wd = make_wd(db_url)
    with wd.run(agent="a") as run:
        request_stop(engine, run.id, reason="manual", detail="by cli@host")
        try:
            run.heartbeat()
        except RunKilled:
            pass  # the agent catches it explicitly and leaves the block normally
    row = run_row(engine, run.id)
    assert (row.status, row.stop_reason, row.stop_detail) == ("killed", "manual", "by cli@host")


def test_a_stop_without_a_reason_is_manual(db_url, engine, make_wd):
    wd = make_wd(db_url)
    with pytest.raises(RunKilled) as killed:
        with wd.run(agent="a") as run:
            with engine.begin() as conn:
                conn.execute(text("UPDATE runs SET status = 'stopping' WHERE id = :id"), {"id": run.id})
            run.step()
    assert killed.value.reason == "manual"
    assert run_row(engine, run.id).status == "killed"


def test_normal_exit_completes_and_never_overwrites_a_daemon_verdict(db_url, engine, make_wd):
    wd = make_wd(db_url)
    with wd.run(agent="a") as run:
        run.step()
    assert run_row(engine, run.id).status == "completed"
    # A run the daemon already marked lost is not resurrected as completed.
    with wd.run(agent="a") as run2:
        run2.step()
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET status = 'lost', stop_reason = 'process_gone', ended_at = started_at "
                              "WHERE id = :id"), {"id": run2.id})
    row = run_row(engine, run2.id)
    assert (row.status, row.stop_reason) == ("lost", "process_gone")


# --- threads ------------------------------------------------------------------------


def _hammer(run, thread_no: int, n: int, errors: list):
    try:
        for i in range(n):
            if i % 3 == 0:
                run.step(tokens_in=2, tokens_out=1, cost_eur=0.001)
            elif i % 3 == 1:
                run.record_tool(f"tool{thread_no}", {"i": i, "t": thread_no}, ok=(i % 2 == 0),
                                error=None if i % 2 == 0 else "bad")
            else:
                run.heartbeat(f"{thread_no}:{i}")
    except BaseException as exc:  # noqa: BLE001 — reported to the main thread
        errors.append(repr(exc))


def _expected(n):
    steps = sum(1 for i in range(n) if i % 3 == 0)
    tools = [i for i in range(n) if i % 3 == 1]
    return steps, len(tools), sum(1 for i in tools if i % 2)


def test_eight_threads_on_one_run_keep_exact_counters_and_unique_seq(db_url, engine, make_wd):
    wd = make_wd(db_url)
    errors: list = []
    with wd.run(agent="threads", guards=False) as run:
        threads = [threading.Thread(target=_hammer, args=(run, t, 100, errors)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
    assert errors == []
    row, evs = assert_counters_match_events(engine, run.id)
    steps, tools, tool_errors = _expected(100)
    assert (row.steps, row.tool_calls, row.tool_errors) == (8 * steps, 8 * tools, 8 * tool_errors)
    assert row.tokens_in == 8 * steps * 2 and row.cost_eur == pytest.approx(8 * steps * 0.001)
    assert sorted(e.seq for e in evs) == list(range(1, 801))
    assert row.last_seq == 800
    assert row.status == "completed"


def test_four_runs_in_four_threads_of_one_process(db_url, engine, make_wd):
    wd = make_wd(db_url)
    errors: list = []
    ids: list = []

    def agent(no):
        try:
            with wd.run(agent=f"agent{no}", labels={"no": no}, guards=False) as run:
                ids.append(run.id)
                _hammer(run, no, 60, errors)
        except BaseException as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert len(ids) == 4
    steps, tools, tool_errors = _expected(60)
    for rid in ids:
        row, evs = assert_counters_match_events(engine, rid)
        assert (row.steps, row.tool_calls, row.tool_errors, row.status) == (steps, tools, tool_errors, "completed")
        assert [e.seq for e in evs] == list(range(1, 61))
        assert {e.tool for e in evs if e.tool} == {f"tool{row.labels['no']}"}


def _forked_agent(wd, n, queue):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            with wd.run(agent="child", guards=False) as run:
                for _ in range(n):
                    run.step(tokens_in=1)
        queue.put((run.id, wd.buffered, wd.dropped_events, wd.rejected_events, None))
    except BaseException as exc:  # noqa: BLE001 — reported to the parent
        queue.put((None, None, None, None, repr(exc)))


def test_a_forked_child_uses_its_own_connection(db_url, engine, make_wd):
    """multiprocessing (fork) copies the parent's Watchdog: the child must not write
    through the parent's connection (a shared socket or SQLite handle corrupts both)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    wd = make_wd(db_url)
    queue = ctx.Queue()
    with wd.run(agent="parent", guards=False) as run:
        run.step(tokens_in=1)  # the connection the child inherits is open and in use
        child = ctx.Process(target=_forked_agent, args=(wd, 150, queue))
        child.start()
        for _ in range(150):
            run.step(tokens_in=1)
        try:
            child_id, buffered, dropped, rejected, error = queue.get(timeout=120)
            child.join(60)
        finally:
            if child.is_alive():
                child.kill()
        assert error is None, error
        assert child.exitcode == 0
        assert (buffered, dropped, rejected) == (0, 0, 0)
        run.step(tokens_in=1)  # the parent's connection survived the child
    parent = run_row(engine, run.id)
    kid = run_row(engine, child_id)
    assert (parent.steps, parent.status) == (152, "completed")
    assert (kid.steps, kid.status) == (150, "completed")
    assert kid.pid == child.pid != parent.pid


# --- import weight, construction, argument checks ----------------------------------------


def test_watchdog_reads_the_store_url_from_the_environment(db_url, engine, make_wd, monkeypatch):
    monkeypatch.setenv("AGENT_WATCHDOG_DB", db_url)
    wd = make_wd()
    with wd.run(agent="from-env") as run:
        run.step()
    assert run_row(engine, run.id).agent == "from-env"


def test_watchdog_without_any_url_names_the_variable(monkeypatch):
    monkeypatch.delenv("AGENT_WATCHDOG_DB", raising=False)
    with pytest.raises(ValueError, match="AGENT_WATCHDOG_DB"):
        Watchdog()


BAD_RUN_ARGS = [
    ({"kill_mode": "nuke"}, "kill_mode"),
    ({"max_steps": 9}, "max_steps"),  # above the published support-bot profile (8)
    ({"max_cost_eur": 2.5}, "max_cost_eur"),  # above the published defaults (2.0)
    ({"max_steps": 0}, "max_steps"),
    ({"max_steps": 2.5}, "max_steps"),
    ({"max_wall_s": -1}, "max_wall_s"),
    ({"max_stepz": 3}, "max_stepz"),
    ({"labels": ["not", "a", "dict"]}, "labels"),
]


@pytest.mark.parametrize("kwargs,name", BAD_RUN_ARGS, ids=[n + "-" + str(i) for i, (_, n) in enumerate(BAD_RUN_ARGS)])
def test_bad_run_arguments_raise_value_error_naming_the_argument(db_url, engine, make_wd, kwargs, name):
    import tomllib

    publish(engine, parse_config(tomllib.loads(PROFILE_TOML)).published())
    wd = make_wd(db_url)
    agent = "support-bot" if name == "max_steps" else "other"
    with pytest.raises(ValueError) as err:
        wd.run(agent=agent, **kwargs)
    assert name in str(err.value)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM runs")).scalar() == 0


def test_lower_budgets_are_accepted(db_url, engine, make_wd):
    import tomllib

    publish(engine, parse_config(tomllib.loads(PROFILE_TOML)).published())
    wd = make_wd(db_url)
    with wd.run(agent="support-bot", max_steps=8, max_tool_calls=3, max_cost_eur=1.0) as run:
        pass
    row = run_row(engine, run.id)
    assert (row.max_steps, row.max_tool_calls, row.max_cost_eur) == (8, 3, 1.0)


def test_agent_name_is_checked(db_url, make_wd):
    wd = make_wd(db_url)
    for bad in ("", "   ", None, 3):
        with pytest.raises(ValueError, match="agent"):
            wd.run(agent=bad)
    with pytest.raises(ValueError, match="agent"):
        wd.run(agent="x" * 129)  # longer than runs.agent holds


class NotJson:
    pass


BAD_RECORDS = [
    (lambda run, fn: run.step(tokens_in=-1), "tokens_in"),
    (lambda run, fn: run.step(tokens_out=1.5), "tokens_out"),
    (lambda run, fn: run.step(tokens_in=True), "tokens_in"),
    (lambda run, fn: run.step(cost_eur=-0.01), "cost_eur"),
    (lambda run, fn: run.step(cost_eur=float("nan")), "cost_eur"),
    (lambda run, fn: run.step(model="m" * 129, tokens_in=1), "model"),
    (lambda run, fn: run.tool_call("t", {"x": NotJson()}, fn), "args"),
    (lambda run, fn: run.tool_call("t", {"x": float("inf")}, fn), "args"),
    (lambda run, fn: run.tool_call("t", ["positional"], fn), "args"),
    (lambda run, fn: run.tool_call("t", {}, "not callable"), "fn"),
    (lambda run, fn: run.tool_call("", {}, fn), "name"),
    (lambda run, fn: run.tool_call("t" * 129, {}, fn), "name"),
    (lambda run, fn: run.record_tool("t", {"s": {1, 2}}), "args"),
    (lambda run, fn: run.record_tool("t", {}, duration_s=-1), "duration_s"),
    (lambda run, fn: run.heartbeat(progress=5), "progress"),
]


@pytest.mark.parametrize("call,name", BAD_RECORDS, ids=[f"{n}-{i}" for i, (_, n) in enumerate(BAD_RECORDS)])
def test_bad_record_arguments_raise_value_error_and_record_nothing(db_url, engine, make_wd, call, name):
    wd = make_wd(db_url)
    ran = []
    with wd.run(agent="a") as run:
        with pytest.raises(ValueError) as err:
            call(run, lambda **kw: ran.append(kw))
        assert name in str(err.value)
        run.step(tokens_in=1)  # the run goes on
    assert ran == []  # the tool never ran with arguments that could not be recorded
    row, evs = assert_counters_match_events(engine, run.id)
    assert [e.kind for e in evs] == ["step"]
    assert row.status == "completed"


def test_a_run_id_that_already_exists_is_refused(db_url, engine, make_wd):
    """A retried job reusing its run id must not write into the old run (nor run unwatched)."""
    wd = make_wd(db_url)
    with pytest.raises(ValueError):
        with wd.run(agent="job", run_id="job-42") as first:
            first.step(tokens_in=5)
            raise ValueError("first attempt failed")
    with pytest.raises(ValueError) as err:
        with wd.run(agent="job", run_id="job-42") as second:
            second.step(tokens_in=7)
    assert "run_id" in str(err.value) and "job-42" in str(err.value)
    row, evs = assert_counters_match_events(engine, "job-42")
    assert (row.status, row.steps, row.tokens_in, len(evs)) == ("failed", 1, 5, 1)


def test_malformed_published_settings_never_break_the_agent(db_url, engine, make_wd):
    """The settings row is plain JSON anyone can write: a bad one costs prices, not the agent."""
    for published in ([1, 2, 3], {"prices": [1], "agents": "x"},
                      {"prices": {"gpt-x": {"input_eur_per_mtok": "two"}}, "agents": {"a": 5}, "defaults": 3}):
        publish(engine, published)
        wd = make_wd(db_url)
        with wd.run(agent="a") as run:
            run.step(model="gpt-x", tokens_in=1000, tokens_out=10)
            run.tool_call("t", {"x": 1}, lambda x: x)
        row, _ = assert_counters_match_events(engine, run.id)
        assert (row.status, row.steps, row.tool_calls, row.cost_eur) == ("completed", 1, 1, 0.0)


# --- store outage (PostgreSQL, for real) -----------------------------------------------------


class PgOutage:
    """A PostgreSQL database of its own that can be made unreachable and brought back."""

    def __init__(self, server_url: str):
        base = server_url.rsplit("/", 1)[0]
        self.name = f"aw_outage_{uuid.uuid4().hex[:10]}"
        self.url = f"{base}/{self.name}"
        # Administer from the session database: it stays reachable throughout.
        self.admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        engine = make_engine(self.url)
        access.upgrade(engine)
        engine.dispose()

    def backends(self) -> int:
        with self.admin.connect() as conn:
            return conn.execute(text("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = :n"),
                                {"n": self.name}).scalar()

    def cut(self):
        with self.admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                         {"n": self.name})
        deadline = time.monotonic() + WAIT_S
        while self.backends() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.backends() == 0, "could not stage the outage"
        with pytest.raises(Exception):  # noqa: B017 — really unreachable
            probe = create_engine(self.url)
            try:
                probe.connect().close()
            finally:
                probe.dispose()

    def restore(self):
        with self.admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true'))

    def drop(self):
        self.restore()
        with self.admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                         {"n": self.name})
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}"'))
        self.admin.dispose()


@pytest.fixture
def pg_outage(pg_server_url):
    outage = PgOutage(pg_server_url)
    yield outage
    outage.drop()


def _outage_warnings(caught):
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and "unreachable" in str(w.message)]


@pytest.mark.postgres
def test_store_outage_buffers_in_order_and_flushes_when_back(pg_outage, make_wd, caplog):
    wd = make_wd(pg_outage.url)
    engine = make_engine(pg_outage.url)
    results = []
    try:
        with wd.run(agent="outage", kill_mode="process") as run:
            run.step(model="m", tokens_in=10, tokens_out=1, cost_eur=0.1)
            run.tool_call("search", {"q": 0}, lambda q: q)
            pg_outage.cut()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for i in range(1, 6):  # the agent keeps working, tools keep running
                    run.step(model="m", tokens_in=10, tokens_out=1, cost_eur=0.1)
                    results.append(run.tool_call("search", {"q": i}, lambda q: q * 10))
                run.record_tool("fetch", {"u": 1}, ok=False, error="HTTP 500")
                run.heartbeat("still going")
            assert results == [10, 20, 30, 40, 50]
            assert len(_outage_warnings(caught)) == 1, [str(w.message) for w in caught]
            assert wd.buffered == 12 and wd.dropped_events == 0
            pg_outage.restore()
            with caplog.at_level(logging.WARNING, logger="watchdog.client"):
                run.step(model="m", tokens_in=10, tokens_out=1, cost_eur=0.1)  # flushes everything first
            assert wd.buffered == 0
            assert "reachable again" in caplog.text
        row, evs = assert_counters_match_events(engine, run.id)
        assert [e.seq for e in evs] == list(range(1, 16))
        with engine.connect() as conn:
            by_id = conn.execute(select(events.c.seq).where(events.c.run_id == run.id).order_by(events.c.id)).scalars()
            assert list(by_id) == list(range(1, 16))  # written in the order they happened
        assert (row.steps, row.tool_calls, row.tool_errors) == (7, 7, 1)
        assert row.cost_eur == pytest.approx(0.7)
        assert row.status == "completed"
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_store_outage_overflow_is_bounded_counted_and_reported(pg_outage, make_wd, caplog):
    wd = make_wd(pg_outage.url, buffer_max=5)
    wd._expect_loss = True
    engine = make_engine(pg_outage.url)
    try:
        with wd.run(agent="outage", guards=False) as run:
            run.step(tokens_in=1, cost_eur=0.01)
            pg_outage.cut()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(12):
                    run.step(tokens_in=1, cost_eur=0.01)
            assert len(_outage_warnings(caught)) == 1
            assert (wd.buffered, wd.dropped_events) == (5, 7)
            pg_outage.restore()
            with caplog.at_level(logging.WARNING, logger="watchdog.client"):
                run.step(tokens_in=1, cost_eur=0.01)
            assert wd.buffered == 0
            assert "7 dropped" in caplog.text
        row, evs = assert_counters_match_events(engine, run.id)
        # The oldest buffered records are kept; the overflow is what came after.
        assert [e.seq for e in evs] == [1, 2, 3, 4, 5, 6, 14]
        assert (row.steps, row.tokens_in) == (7, 7)
        assert row.cost_eur == pytest.approx(0.07)
        assert row.status == "completed"
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_run_started_during_an_outage_is_registered_when_the_store_is_back(pg_outage, make_wd):
    pg_outage.cut()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wd = make_wd(pg_outage.url)
        run = wd.run(agent="born-in-outage", kill_mode="tree", max_steps=4)
        run.start()
        run.step(tokens_in=3)
        run.record_tool("t", {"a": 1})
    assert len(_outage_warnings(caught)) == 1
    assert wd.buffered == 3
    pg_outage.restore()
    run.heartbeat("back")
    run.end("completed", None, None)
    assert wd.flush() is True and wd.buffered == 0
    engine = make_engine(pg_outage.url)
    try:
        row, evs = assert_counters_match_events(engine, run.id)
        assert (row.agent, row.kill_mode, row.max_steps, row.status) == ("born-in-outage", "tree", 4, "completed")
        assert [e.kind for e in evs] == ["step", "tool", "heartbeat"]
        assert row.started_at <= evs[0].at <= row.last_seen_at <= row.ended_at
        assert row.ended_at.tzinfo is not None and row.ended_at.utcoffset() == dt.timedelta(0)
    finally:
        engine.dispose()


@pytest.mark.parametrize("name", ["bot\nrun 1234 ok", "bot\x1b[2J", "bot\u202eevil"])
def test_names_with_control_or_bidi_characters_are_refused_at_the_door(sqlite_url, name):
    from watchdog import Watchdog

    wd = Watchdog(sqlite_url)
    try:
        with pytest.raises(ValueError, match="agent: expected printable text on one line"):
            wd.run(agent=name)
        with wd.run(agent="bot") as run:
            with pytest.raises(ValueError, match="name: expected printable text"):
                run.record_tool(name, {})
    finally:
        wd.close()
