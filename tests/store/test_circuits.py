"""Tool circuit breakers across runs, end to end: SDK records → daemon tick → SDK fails fast.

The daemon's clock is passed in; the SDK's is real, so `open_s` is kept short
and the test waits (bounded) for it to pass before probing.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from watchdog import ToolUnavailable, Watchdog
from watchdog.daemon.stops.circuits import CircuitBreakers
from watchdog.cli import main
from watchdog.core.config import parse
from watchdog.daemon.stops.killer import Killer
from watchdog.store.schema import alerts, interventions, tool_circuits
from watchdog.daemon.tick.ticker import Ticker

OPEN_S = 0.6


def utcnow():
    return dt.datetime.now(dt.timezone.utc)


@pytest.fixture
def config():
    return parse({"circuit": {"errors": 5, "window_s": 60, "open_s": OPEN_S},
                  "defaults": {"max_identical_calls": 100, "max_tool_calls": 100}})


@pytest.fixture
def ticker(engine, config, sealer):
    return Ticker(engine, config, Killer(), circuits=CircuitBreakers(config, sealer=sealer), sealer=sealer)


@pytest.fixture
def wd(db_url):
    w = Watchdog(db_url, circuit_cache_s=0)  # see every circuit row at once
    yield w
    w.close()


def failing(**_):
    raise RuntimeError("500 Internal Server Error")


def ok(**_):
    return "valid"


def _errors(run, n, tool="verify_iban"):
    for i in range(n):
        with pytest.raises(RuntimeError):
            run.tool_call(tool, {"iban": f"{run.id[:4]}{i}"}, failing)


def _circuit(engine, tool="verify_iban"):
    with engine.connect() as conn:
        return conn.execute(select(tool_circuits).where(tool_circuits.c.tool == tool)).first()


def _actions(engine):
    with engine.connect() as conn:
        return [r.action for r in conn.execute(select(interventions).order_by(interventions.c.id))
                if r.action.startswith("circuit")]


def test_errors_from_three_runs_open_the_circuit_and_a_fourth_run_fails_fast(engine, wd, ticker):
    runs = [wd.run(agent=f"a{i}").start() for i in range(3)]
    _errors(runs[0], 2)
    _errors(runs[1], 2)
    _errors(runs[2], 1)
    # The tick's clock 30 s ahead: the errors are still inside the 60 s window, and the circuit
    # stays open for the SDK's real clock however slow this machine is (open_s is 0.6 s here).
    ticker.tick(utcnow() + dt.timedelta(seconds=30))
    row = _circuit(engine)
    assert row.state == "open" and row.errors_in_window == 5
    assert row.last_error == "500 Internal Server Error"

    fourth = wd.run(agent="a3").start()
    called = []
    with pytest.raises(ToolUnavailable) as exc:
        fourth.tool_call("verify_iban", {"iban": "x"}, lambda iban: called.append(iban))
    assert called == []  # failed fast: the tool never ran
    msg = str(exc.value)
    assert msg.startswith("ToolUnavailable: verify_iban is unavailable until ")
    # The tool, the count and the error's class: other runs' message text never reaches this run's model.
    assert msg.endswith("(5 errors in 60 s, RuntimeError); do not retry it")
    assert "500" not in msg and row.last_error_class == "RuntimeError"
    # Another tool is untouched: one tool, never everything.
    assert fourth.tool_call("get_order", {"id": 1}, lambda id: "order") == "order"

    with engine.connect() as conn:
        alert = conn.execute(select(alerts).where(alerts.c.dedupe_key.like("circuit_open:%"))).one()
    assert alert.title == "agent-watchdog: a tool's circuit is OPEN — 5 errors in 60 s"
    assert "most common error: «500 Internal Server Error»" in alert.body
    assert "runs affected: 3" in alert.body


def test_a_success_inside_the_window_does_not_reset_the_count(engine, wd, ticker):
    run = wd.run(agent="a").start()
    _errors(run, 4)
    run.tool_call("verify_iban", {"iban": "good"}, ok)
    ticker.tick(utcnow())
    assert _circuit(engine) is None  # 4 errors: still closed
    _errors(wd.run(agent="b").start(), 1)
    ticker.tick(utcnow())
    assert _circuit(engine).state == "open"  # 5 errors in the window, the success in between changed nothing


def test_half_open_lets_exactly_one_probe_through_and_its_success_closes(engine, wd, ticker):
    _errors(wd.run(agent="a").start(), 5)
    ticker.tick(utcnow())
    assert _circuit(engine).state == "open"
    time.sleep(OPEN_S + 0.2)  # the SDK's clock is real: let open_until pass
    ticker.tick(utcnow())
    assert _circuit(engine).state == "half_open"

    calls, results = [], []
    gate = threading.Barrier(4)
    others_refused = threading.Event()

    def verify(iban, i):
        calls.append(i)
        # Answer once the three others were refused: a successful probe closes the circuit at
        # once, and a caller arriving after that would rightly go through.
        others_refused.wait(60)
        return "valid"

    def probe(i):
        run = Watchdog(wd.engine.url.render_as_string(hide_password=False), circuit_cache_s=0).run(agent=f"p{i}")
        run.start()
        gate.wait()
        try:
            results.append(run.tool_call("verify_iban", {"iban": "probe"}, lambda iban: verify(iban, i)))
        except ToolUnavailable as exc:
            results.append(str(exc))
            if sum("being probed" in str(r) for r in results) == 3:
                others_refused.set()

    threads = [threading.Thread(target=probe, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(calls) == 1  # exactly one probe ran
    assert results.count("valid") == 1
    assert sum("being probed" in r for r in results) == 3

    # Closed at once for every process, by the probe's mark on its claim (no tick in between);
    # the circuit's row is the daemon's to change.
    assert _circuit(engine).state == "half_open"
    run = wd.run(agent="after").start()
    wd.circuits.refresh(force=True)
    assert wd.circuit_for("verify_iban") is None
    assert run.tool_call("verify_iban", {"iban": "ok"}, ok) == "valid"
    ticker.tick(utcnow())  # the daemon closes the row, audits and alerts, once
    assert _circuit(engine).state == "closed"
    ticker.tick(utcnow())
    assert _actions(engine) == ["circuit_open", "circuit_half_open", "circuit_closed"]


def test_a_failed_probe_opens_the_circuit_again(engine, wd, ticker):
    _errors(wd.run(agent="a").start(), 5)
    ticker.tick(utcnow())
    time.sleep(OPEN_S + 0.2)
    prober = wd.run(agent="p").start()
    with pytest.raises(RuntimeError):
        prober.tool_call("verify_iban", {"iban": "probe"}, failing)
    ticker.tick(utcnow())
    row = _circuit(engine)
    assert row.state == "open" and row.probe_run_id is None
    assert _actions(engine)[-1] == "circuit_open"


def test_circuits_command_lists_and_closes_by_hand(db_url, engine, wd, ticker):
    _errors(wd.run(agent="a").start(), 5)
    ticker.tick(utcnow())
    runner = CliRunner()
    listed = runner.invoke(main, ["--db", db_url, "circuits"])
    assert listed.exit_code == 0 and "verify_iban" in listed.output and "open" in listed.output
    closed = runner.invoke(main, ["--db", db_url, "circuits", "close", "verify_iban"])
    assert closed.exit_code == 0, closed.output
    assert _circuit(engine).state == "closed"
    again = runner.invoke(main, ["--db", db_url, "circuits", "close", "verify_iban"])
    assert again.exit_code == 1


def test_many_runs_hammering_one_tool_raise_the_all_runs_rate_alarm(engine, wd, sealer):
    config = parse({"circuit": {"max_calls_per_min": 10}, "defaults": {"max_tool_calls_per_min": 100,
                                                                       "max_identical_calls": 100}})
    ticker = Ticker(engine, config, Killer(), circuits=CircuitBreakers(config, sealer=sealer), sealer=sealer)
    for i in range(4):
        run = wd.run(agent=f"r{i}").start()
        for j in range(3):  # 3 calls each: no single run is over its own rate
            run.tool_call("search", {"q": f"{i}-{j}"}, lambda q: q)
    rep = ticker.tick(utcnow())
    assert rep.alarms == []  # no per-run alarm
    with engine.connect() as conn:
        alert = conn.execute(select(alerts).where(alerts.c.dedupe_key.like("toolrate:search:%"))).one()
    assert alert.title == "agent-watchdog: LOOP? a tool: 12 calls/min over all runs"
