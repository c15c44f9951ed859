"""The LiteLLM callback end to end: a real `litellm --config` proxy (a mock_response model, a
master key, our callback; loopback, no network) started once for the module, a plain OpenAI
client, a real SQLite store and a real Ticker as the daemon (the clock passed in)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time

import openai
import pytest
from sqlalchemy import select

from daemon_support import config as daemon_config
from litellm_support import call, proxy
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store import access
from watchdog.store.engine import make_engine
from watchdog.store.schema import events, runs

WATCHDOG_TOML = """
[defaults]
max_steps = 5
max_cost_eur_per_day = 0.002
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    folder = tmp_path_factory.mktemp("litellm")
    url = f"sqlite:///{folder / 'runs.db'}"
    engine = make_engine(url)
    access.upgrade(engine)
    with proxy(folder, url, WATCHDOG_TOML) as base:
        yield base, engine
    engine.dispose()


def row(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).first()


def settled(engine, run_id, steps, deadline_s=30.0):
    """The run once its `steps` are recorded (LiteLLM logs a success after answering the client)."""
    end = time.monotonic() + deadline_s
    while True:
        r = row(engine, run_id)
        if r is not None and r.steps >= steps:
            return r
        assert time.monotonic() < end, f"run {run_id} never reached {steps} steps"
        time.sleep(0.05)


def ticker(engine):
    config = daemon_config(defaults={"max_steps": 5, "max_cost_eur_per_day": 0.002})
    return Ticker(engine, config, Killer())


def test_max_steps_stops_the_run_and_only_that_run(gateway):
    base, engine = gateway
    for _ in range(5):
        assert call(base, "trace-a").choices[0].message.content == "Hello from the mock"
    run = settled(engine, "trace-a", 5)
    assert run.source == "litellm" and run.steps == 5 and run.tokens_in > 0 and run.cost_eur > 0
    ticker(engine).tick(dt.datetime.now(dt.timezone.utc))
    with pytest.raises(openai.BadRequestError) as refused:
        call(base, "trace-a")
    assert refused.value.status_code == 400
    body = refused.value.body
    message = body.get("message") if isinstance(body, dict) else None
    assert isinstance(message, str) and message.startswith("agent-watchdog: run stopped: max_steps"), body
    assert row(engine, "trace-a").steps == 5  # the refused call never reached the model
    assert call(base, "trace-b").choices[0].message.content  # another trace on the same proxy: untouched


def test_bad_trace_id_is_a_clear_error_and_serving_goes_on(gateway):
    base, engine = gateway
    with pytest.raises(openai.BadRequestError) as bad:
        call(base, "x" * 200)
    assert "agent-watchdog: bad request" in str(bad.value)
    assert call(base, None).choices[0].message.content  # no trace id: period budgets only


def test_joins_the_sdk_run_its_trace_id_names(gateway):
    from watchdog import RunKilled, Watchdog

    base, engine = gateway
    wd = Watchdog(str(engine.url), attest_socket="")
    try:
        with pytest.raises(RunKilled):
            with wd.run(agent="support-bot") as run:
                assert call(base, run.id).choices[0].message.content
                assert call(base, run.id).choices[0].message.content

                def steps_seen():
                    with engine.connect() as conn:
                        return conn.execute(select(events.c.source, events.c.kind).where(
                            events.c.run_id == run.id)).all()

                end = time.monotonic() + 30
                while len(steps_seen()) < 2:
                    assert time.monotonic() < end
                    time.sleep(0.05)
                assert steps_seen() == [("litellm", "step"), ("litellm", "step")]
                r = row(engine, run.id)
                assert r.source == "sdk" and r.steps == 0  # the writer's row is never updated by the gateway
                killed = subprocess.run([sys.executable, "-m", "watchdog.cli", "--db", str(engine.url), "kill", run.id],
                                        capture_output=True, text=True, timeout=60)
                assert killed.returncode == 0, killed.stderr
                with pytest.raises(openai.BadRequestError) as refused:
                    call(base, run.id)
                assert "agent-watchdog: run stopped: manual" in str(refused.value)
                run.heartbeat()  # the SDK sees the same stop
    finally:
        wd.close()


def test_untraced_calls_count_for_the_period_only(gateway):
    base, engine = gateway
    with engine.connect() as conn:
        before = conn.execute(select(runs.c.id)).all()
    call(base, None)
    end = time.monotonic() + 30
    while True:
        with engine.connect() as conn:
            new = conn.execute(select(runs).where(runs.c.id.not_in([r.id for r in before]))).all()
        if new and new[0].ended_at is not None:
            break
        assert time.monotonic() < end
        time.sleep(0.05)
    (one,) = new
    assert one.source == "litellm" and one.status == "completed" and one.steps == 1 and one.cost_eur > 0


def test_a_trace_whose_run_ended_by_silence_starts_a_new_run(gateway):
    from sqlalchemy import update

    base, engine = gateway
    assert call(base, "trace-quiet").choices[0].message.content
    settled(engine, "trace-quiet", 1)
    with engine.begin() as conn:  # what the daemon does to a gateway's run after heartbeat_timeout_s
        conn.execute(update(runs).where(runs.c.id == "trace-quiet").values(status="completed",
                                                                           ended_at=dt.datetime.now(dt.timezone.utc)))
    with engine.connect() as conn:
        before = {r.id for r in conn.execute(select(runs.c.id))}
    assert call(base, "trace-quiet").choices[0].message.content  # not refused: a new run
    end = time.monotonic() + 30
    while True:
        with engine.connect() as conn:
            fresh = [r for r in conn.execute(select(runs)) if r.id not in before]
        if fresh and fresh[0].steps == 1:
            assert fresh[0].source == "litellm" and fresh[0].status == "running"
            break
        assert time.monotonic() < end
        time.sleep(0.05)
    assert row(engine, "trace-quiet").steps == 1


def test_spent_day_refuses_a_new_traces_first_call(gateway):
    base, engine = gateway
    n = 0
    while True:  # spend the day's 0.002 EUR in runs of at most 5 calls (gpt-4o's mock call costs ~0.0002 EUR)
        for _ in range(5):
            call(base, f"spend-{n}")
        settled(engine, f"spend-{n}", 5)
        n += 1
        with engine.connect() as conn:
            spent = sum(r.cost_eur for r in conn.execute(select(runs.c.cost_eur)))
        if spent > 0.002:
            break
        assert n < 10
    ticker(engine).tick(dt.datetime.now(dt.timezone.utc))
    with pytest.raises(openai.BadRequestError) as refused:
        call(base, "fresh-trace")
    assert "agent-watchdog: run stopped: daily_budget" in str(refused.value)
