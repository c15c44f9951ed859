"""In-process guards, dedupe, the retry policy and the SDK's view of tool circuits,
through the real SDK on both stores (SQLite file and PostgreSQL).

No timing assertions: wall-clock trips move the run's start back, the dedupe
window's clock and the backoff's sleep are replaced, and circuits are written
with open_until far in the past or the future.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import insert, select

from watchdog import RunKilled, ToolUnavailable, Watchdog
from watchdog.core import lifecycle as lc
from watchdog.errors import ConfigError
from watchdog.sdk import toolcall
from watchdog.store.schema import circuit_probes, events, runs, settings, tool_circuits, utcnow

UNTIL_FMT = "%H:%M:%S"


@pytest.fixture
def wd(db_url):
    w = Watchdog(db_url, circuit_cache_s=0)  # see every circuit row at once
    yield w
    w.close()


def run_row(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def tool_events(engine, run_id):
    with engine.connect() as conn:
        q = select(events).where(events.c.run_id == run_id, events.c.kind == lc.EV_TOOL).order_by(events.c.seq)
        return conn.execute(q).all()


def publish(engine, **defaults):
    """The config the daemon publishes: here only the [defaults] profile."""
    with engine.begin() as conn:
        conn.execute(insert(settings).values(key="config", value={"defaults": defaults, "agents": {}},
                                             updated_at=utcnow()))


def write_circuit(engine, tool="verify_iban", *, state="open", open_until=None, errors=5, window_s=60.0,
                  last_error="500 Internal Server Error", last_error_class="ConnectionError", probe_run_id=None):
    """What the daemon writes when it opens a circuit."""
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(tool_circuits).values(
            tool=tool, state=state, opened_at=now, open_until=open_until, errors_in_window=errors,
            window_s=window_s, last_error=last_error, last_error_class=last_error_class, probe_run_id=probe_run_id,
            updated_at=now))


class Tool:
    """A tool that counts its calls; fails with the given exceptions first, then returns `result`."""

    def __init__(self, result="ok", failures=()):
        self.result = result
        self.failures = list(failures)
        self.calls = []
        self._lock = threading.Lock()

    def __call__(self, **kw):
        with self._lock:
            self.calls.append(kw)
            if self.failures:
                raise self.failures.pop(0)
        return self.result


def assert_killed(engine, run, reason):
    row = run_row(engine, run.id)
    assert (row.status, row.stop_reason) == (lc.KILLED, reason)
    assert "in-process guard" in row.stop_detail


# -- budgets, checked before each model or tool call ---------------------------------


def test_cost_preflight_keeps_overshoot_within_one_call(wd, engine):
    estimate, costs = 0.10, [0.30, 0.05, 0.20, 0.30, 0.25, 0.10, 0.30, 0.30]
    spent = 0.0
    with pytest.raises(RunKilled) as info:
        with wd.run("bot", max_cost_eur=1.0) as run:
            for actual in costs:
                run.check_budget(estimated_cost_eur=estimate)
                spent += actual  # the model was called: the money is gone
                run.step(model="m", cost_eur=actual)
    assert info.value.reason == lc.MAX_COST
    assert spent < 1.0 + max(costs)
    row = run_row(engine, run.id)
    assert row.cost_eur == pytest.approx(spent)
    assert row.cost_eur < 1.0 + max(costs)
    assert_killed(engine, run, lc.MAX_COST)


def test_cost_preflight_refuses_the_call_when_the_estimate_is_right(wd, engine):
    with pytest.raises(RunKilled):
        with wd.run("bot", max_cost_eur=1.0) as run:
            for _ in range(10):
                run.check_budget(estimated_cost_eur=0.3)
                run.step(cost_eur=0.3)
    row = run_row(engine, run.id)
    assert (row.steps, row.cost_eur) == (3, pytest.approx(0.9))  # never over budget
    assert_killed(engine, run, lc.MAX_COST)


def test_max_steps_is_checked_before_the_model_call_and_recorded(wd, engine):
    with pytest.raises(RunKilled) as info:
        with wd.run("bot", max_steps=3) as run:
            for _ in range(10):
                run.check_budget()
                run.step(tokens_in=10, tokens_out=2)
    assert info.value.reason == lc.MAX_STEPS
    assert run_row(engine, run.id).steps == 3
    assert_killed(engine, run, lc.MAX_STEPS)


def test_a_step_without_preflight_is_recorded_then_stopped(wd, engine):
    with pytest.raises(RunKilled):
        with wd.run("bot", max_steps=2) as run:
            for _ in range(10):
                run.step(cost_eur=0.01)
    assert run_row(engine, run.id).steps == 3  # the model call happened: its cost is on the record
    assert_killed(engine, run, lc.MAX_STEPS)


def test_max_tool_calls_is_checked_before_the_call_and_recorded(wd, engine):
    tool = Tool()
    with pytest.raises(RunKilled) as info:
        with wd.run("bot", max_tool_calls=4) as run:
            for i in range(10):
                run.tool_call("search", {"q": i}, tool)
    assert info.value.reason == lc.MAX_TOOL_CALLS
    assert len(tool.calls) == 4
    assert run_row(engine, run.id).tool_calls == 4
    assert_killed(engine, run, lc.MAX_TOOL_CALLS)


def test_wall_clock_is_checked_before_a_tool_call_and_recorded(wd, engine):
    tool = Tool()
    with pytest.raises(RunKilled) as info:
        with wd.run("bot", max_wall_s=300) as run:
            run.tool_call("search", {"q": 1}, tool)
            run._t0 -= 301  # the run has been going for 5 minutes more: no sleeping in tests
            run.tool_call("search", {"q": 2}, tool)
    assert info.value.reason == lc.WALL_CLOCK
    assert len(tool.calls) == 1
    assert_killed(engine, run, lc.WALL_CLOCK)


def test_wall_clock_is_checked_before_a_model_call(wd, engine):
    with pytest.raises(RunKilled):
        with wd.run("bot", max_wall_s=300) as run:
            run._t0 -= 301
            run.check_budget(estimated_cost_eur=0.01)
    assert_killed(engine, run, lc.WALL_CLOCK)


def test_a_caught_guard_stop_still_ends_the_run_killed(wd, engine):
    tool = Tool()
    with wd.run("bot", max_tool_calls=1) as run:
        run.tool_call("search", {"q": 1}, tool)
        try:
            run.tool_call("search", {"q": 2}, tool)
        except RunKilled:  # the agent leaves quietly
            pass
        with pytest.raises(RunKilled):  # and cannot go on
            run.tool_call("search", {"q": 3}, tool)
    assert len(tool.calls) == 1
    assert_killed(engine, run, lc.MAX_TOOL_CALLS)


def test_profile_budgets_apply_without_asking(db_url, engine):
    publish(engine, max_tool_calls=2)
    w = Watchdog(db_url, circuit_cache_s=0)
    try:
        with pytest.raises(RunKilled):
            with w.run("bot") as run:
                for i in range(5):
                    run.tool_call("search", {"q": i}, Tool())
    finally:
        w.close()
    assert_killed(engine, run, lc.MAX_TOOL_CALLS)


# -- loops -----------------------------------------------------------------------------


def test_identical_calls_trip_loop_detected(wd, engine):
    tool = Tool()
    with pytest.raises(RunKilled) as info:
        with wd.run("bot", max_identical_calls=3) as run:
            for _ in range(10):
                run.tool_call("verify_iban", {"iban": "DE00"}, tool)
    assert info.value.reason == lc.LOOP_DETECTED
    assert len(tool.calls) == 2  # like the daemon, 3 identical calls are a loop: the 3rd never runs
    assert_killed(engine, run, lc.LOOP_DETECTED)


def test_oscillation_abab_trips_loop_detected(wd, engine):
    a, b = Tool(), Tool()
    with pytest.raises(RunKilled) as info:
        with wd.run("bot") as run:
            for _ in range(5):
                run.tool_call("open_ticket", {"id": 1}, a)
                run.tool_call("close_ticket", {"id": 1}, b)
    assert info.value.reason == lc.LOOP_DETECTED
    assert "oscillation" in info.value.detail
    assert (len(a.calls), len(b.calls)) == (2, 1)
    assert_killed(engine, run, lc.LOOP_DETECTED)


def test_abcd_does_not_trip_loop_detection(wd, engine):
    tool = Tool()
    with wd.run("bot", max_identical_calls=3) as run:
        for _ in range(2):
            for name in ("a", "b", "c", "d"):
                run.tool_call(name, {"x": 1}, tool)
    assert len(tool.calls) == 8
    assert run_row(engine, run.id).status == lc.COMPLETED


# -- dedupe ------------------------------------------------------------------------------


def test_dedupe_never_swallows_a_write(wd, engine):
    tool = Tool()
    with wd.run("bot") as run:
        for _ in range(2):  # the same write twice is two writes (3 would be a loop)
            assert run.tool_call("send_email", {"to": "a@example.org"}, tool, read_only=False) == "ok"
        assert run.tool_call("send_email", {"to": "b@example.org"}, tool) == "ok"  # default: a write
        assert run.tool_call("send_email", {"to": "b@example.org"}, tool) == "ok"
    assert len(tool.calls) == 4
    assert len(tool_events(engine, run.id)) == 4


def test_read_only_dedupe_returns_the_cached_result_without_calling(wd, engine):
    tool = Tool(result={"hits": [1, 2]})
    with wd.run("bot", max_identical_calls=3) as run:
        first = run.tool_call("search", {"q": "refund"}, tool, read_only=True)
        again = run.tool_call("search", {"q": "refund"}, tool, read_only=True)
        other = run.tool_call("search", {"q": "other"}, tool, read_only=True)
    assert first == again == other == {"hits": [1, 2]}
    assert again is first
    assert tool.calls == [{"q": "refund"}, {"q": "other"}]
    assert len(tool_events(engine, run.id)) == 2  # a cache hit calls and records nothing
    assert run_row(engine, run.id).status == lc.COMPLETED


def test_a_dedupe_hit_counts_as_a_repeat(wd, engine):
    tool = Tool()
    with pytest.raises(RunKilled) as info:
        with wd.run("bot", max_identical_calls=3) as run:
            for _ in range(10):
                run.tool_call("search", {"q": "refund"}, tool, read_only=True)
    assert info.value.reason == lc.LOOP_DETECTED
    assert len(tool.calls) == 1
    assert_killed(engine, run, lc.LOOP_DETECTED)


def test_a_failed_read_is_not_cached(wd, engine):
    tool = Tool(failures=[TimeoutError("slow")])
    with wd.run("bot") as run:
        with pytest.raises(TimeoutError):
            run.tool_call("search", {"q": "x"}, tool, read_only=True)
        assert run.tool_call("search", {"q": "x"}, tool, read_only=True) == "ok"
    assert len(tool.calls) == 2


def test_dedupe_window_from_the_profile(db_url, engine, monkeypatch):
    publish(engine, dedupe_window_s=30.0, max_identical_calls=10)
    now = [1000.0]
    monkeypatch.setattr(toolcall, "_clock", lambda: now[0])
    tool = Tool()
    w = Watchdog(db_url, circuit_cache_s=0)
    try:
        with w.run("bot") as run:
            run.tool_call("search", {"q": "x"}, tool, read_only=True)
            now[0] += 30.0
            run.tool_call("search", {"q": "x"}, tool, read_only=True)  # within the window: cached
            assert len(tool.calls) == 1
            now[0] += 0.5
            run.tool_call("search", {"q": "x"}, tool, read_only=True)  # 30.5 s old: called again
            assert len(tool.calls) == 2
    finally:
        w.close()


def test_guards_off_means_no_dedupe(db_url, engine):
    tool = Tool()
    w = Watchdog(db_url, circuit_cache_s=0)
    try:
        with w.run("bot", guards=False) as run:
            for _ in range(3):
                run.tool_call("search", {"q": "x"}, tool, read_only=True)
    finally:
        w.close()
    assert len(tool.calls) == 3


# -- the one retry policy --------------------------------------------------------------------


def test_retries_fail_twice_then_succeed(wd, engine):
    tool = Tool(result="found", failures=[ConnectionError("reset"), TimeoutError("slow")])
    with wd.run("bot") as run:
        assert run.tool_call("lookup", {"id": 7}, tool, retries=2, backoff_s=0) == "found"
    assert len(tool.calls) == 3
    evs = tool_events(engine, run.id)
    assert [(e.ok, e.error_class) for e in evs] == [
        (False, "ConnectionError"), (False, "TimeoutError"), (True, None)]
    row = run_row(engine, run.id)
    assert (row.tool_calls, row.tool_errors, row.status) == (3, 2, lc.COMPLETED)


def test_retries_exhausted_raise_the_last_error(wd, engine):
    tool = Tool(failures=[TimeoutError("1"), TimeoutError("2"), TimeoutError("3")])
    with wd.run("bot") as run:
        with pytest.raises(TimeoutError, match="2"):
            run.tool_call("lookup", {"id": 7}, tool, retries=1, backoff_s=0)
    assert len(tool.calls) == 2
    assert [e.ok for e in tool_events(engine, run.id)] == [False, False]


def test_retry_on_filters_the_exception_types(wd, engine):
    tool = Tool(failures=[ValueError("bad iban"), TimeoutError("slow")])
    with wd.run("bot") as run:
        with pytest.raises(ValueError):
            run.tool_call("lookup", {"id": 1}, tool, retries=3, retry_on=(TimeoutError,), backoff_s=0)
        assert len(tool.calls) == 1  # not retried
        assert run.tool_call("lookup", {"id": 2}, tool, retries=3, retry_on=TimeoutError, backoff_s=0) == "ok"
        assert len(tool.calls) == 3  # TimeoutError retried once
    assert [e.ok for e in tool_events(engine, run.id)] == [False, False, True]


def test_backoff_doubles_between_attempts(wd, monkeypatch):
    slept = []
    monkeypatch.setattr(toolcall, "_sleep", slept.append)
    tool = Tool(failures=[OSError(), OSError(), OSError()])
    with wd.run("bot") as run:
        run.tool_call("lookup", {"id": 7}, tool, retries=3, backoff_s=0.5)
    assert slept == [0.5, 1.0, 2.0]


def test_retry_attempts_are_not_identical_calls_but_use_the_tool_budget(wd, engine):
    tool = Tool(failures=[OSError(), OSError()])
    with wd.run("bot", max_identical_calls=2) as run:
        run.tool_call("lookup", {"id": 7}, tool, retries=2, backoff_s=0)  # one call, three attempts
    assert len(tool.calls) == 3

    tool = Tool(failures=[OSError()] * 5)
    with pytest.raises(RunKilled) as info:
        with wd.run("bot", max_tool_calls=2) as run:
            run.tool_call("lookup", {"id": 7}, tool, retries=5, backoff_s=0)
    assert info.value.reason == lc.MAX_TOOL_CALLS
    assert len(tool.calls) == 2
    assert_killed(engine, run, lc.MAX_TOOL_CALLS)


@pytest.mark.parametrize("policy", [
    {"retries": -1}, {"retries": 1.5}, {"retries": True}, {"backoff_s": -1},
    {"retry_on": "TimeoutError"}, {"retry_on": (TimeoutError, KeyboardInterrupt)},
])
def test_bad_retry_policy_is_refused_before_calling(wd, policy):
    tool = Tool()
    with wd.run("bot") as run:
        with pytest.raises(ValueError):
            run.tool_call("lookup", {}, tool, **policy)
    assert tool.calls == []


# -- guards switched off -------------------------------------------------------------------


def test_guards_false_lets_a_run_exceed_max_steps_in_process(wd, engine):
    tool = Tool()
    with wd.run("bot", max_steps=2, max_tool_calls=2, max_identical_calls=2, guards=False) as run:
        for _ in range(6):
            run.check_budget(estimated_cost_eur=5.0)
            run.step(cost_eur=0.01)
            run.tool_call("search", {"q": "same"}, tool)
    row = run_row(engine, run.id)
    assert (row.status, row.steps, row.tool_calls) == (lc.COMPLETED, 6, 6)  # only the daemon would stop it
    assert len(tool.calls) == 6


# -- circuits ------------------------------------------------------------------------------------


def test_open_circuit_fails_fast_without_calling_the_tool(wd, engine):
    until = utcnow() + dt.timedelta(seconds=120)
    write_circuit(engine, "verify_iban", open_until=until)
    tool = Tool()
    with wd.run("bot") as run:
        with pytest.raises(ToolUnavailable) as info:
            run.tool_call("verify_iban", {"iban": "DE00"}, tool, retries=3, backoff_s=0)
        assert run.tool_call("search", {"q": 1}, tool) == "ok"  # one tool, never everything
    expected = (f"ToolUnavailable: verify_iban is unavailable until {until.astimezone().strftime(UNTIL_FMT)} "
                "(5 errors in 60 s, ConnectionError); do not retry it")
    assert str(info.value) == expected  # the class and the count: never another run's message
    assert info.value.tool == "verify_iban"
    assert tool.calls == [{"q": 1}]
    evs = tool_events(engine, run.id)
    assert [(e.tool, e.ok, e.error_class) for e in evs] == [
        ("verify_iban", False, "ToolUnavailable"), ("search", True, None)]
    assert evs[0].error_msg == expected
    assert run_row(engine, run.id).status == lc.COMPLETED  # ToolUnavailable is for the agent to read


def test_open_circuit_is_obeyed_with_guards_off(wd, engine):
    write_circuit(engine, "verify_iban", open_until=utcnow() + dt.timedelta(seconds=120))
    tool = Tool()
    with wd.run("bot", guards=False) as run:
        with pytest.raises(ToolUnavailable):
            run.tool_call("verify_iban", {}, tool)
    assert tool.calls == []


def test_retrying_a_failing_fast_tool_trips_loop_detection(wd, engine):
    write_circuit(engine, "verify_iban", open_until=utcnow() + dt.timedelta(seconds=120))
    tool = Tool()
    with pytest.raises(RunKilled) as info:
        with wd.run("bot", max_identical_calls=3) as run:
            for _ in range(10):
                try:
                    run.tool_call("verify_iban", {"iban": "DE00"}, tool)
                except ToolUnavailable:
                    pass  # an agent that does not listen
    assert info.value.reason == lc.LOOP_DETECTED
    assert tool.calls == []
    assert len(tool_events(engine, run.id)) == 2


def test_circuit_state_is_cached_until_refreshed(db_url, engine):
    tool = Tool()
    w = Watchdog(db_url, circuit_cache_s=3600)
    try:
        with w.run("bot") as run:
            run.tool_call("verify_iban", {"iban": "1"}, tool)  # loads the (empty) circuit table
            write_circuit(engine, "verify_iban", open_until=utcnow() + dt.timedelta(seconds=120))
            run.tool_call("verify_iban", {"iban": "2"}, tool)  # cached: still closed for this process
            assert len(tool.calls) == 2
            w.circuits.refresh(force=True)
            with pytest.raises(ToolUnavailable):
                run.tool_call("verify_iban", {"iban": "3"}, tool)
            assert len(tool.calls) == 2
    finally:
        w.close()


def test_circuit_cache_must_be_a_duration(db_url):
    with pytest.raises(ValueError, match="circuit_cache_s"):
        Watchdog(db_url, circuit_cache_s=-1)


def test_closed_circuit_row_lets_calls_through(wd, engine):
    write_circuit(engine, "verify_iban", state="closed", open_until=None)
    tool = Tool()
    with wd.run("bot") as run:
        assert run.tool_call("verify_iban", {}, tool) == "ok"
    assert len(tool.calls) == 1


def test_half_open_lets_exactly_one_probe_through_across_processes(db_url, engine):
    write_circuit(engine, "verify_iban", open_until=utcnow() - dt.timedelta(seconds=1))
    n = 6
    outcomes: dict[str, object] = {}
    lock = threading.Lock()
    refused_all = threading.Event()

    class Probe(Tool):
        def __call__(self, **kw):
            # The probe answers only once every other caller was refused: a successful probe
            # closes the circuit at once, and a caller arriving after that would rightly go through.
            refused_all.wait(120)
            return super().__call__(**kw)

    tool = Probe(result="valid")
    barrier = threading.Barrier(n, timeout=120)

    def agent(i):
        w = Watchdog(db_url, circuit_cache_s=0)  # one Watchdog per thread: like separate processes
        try:
            with w.run(f"bot-{i}") as run:
                barrier.wait()
                try:
                    out = run.tool_call("verify_iban", {"iban": "DE00"}, tool, retries=2, backoff_s=0)
                except ToolUnavailable as exc:
                    out = exc
                with lock:
                    outcomes[run.id] = out
                    if sum(isinstance(o, ToolUnavailable) for o in outcomes.values()) == n - 1:
                        refused_all.set()
        finally:
            w.close()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(outcomes) == n
    assert len(tool.calls) == 1
    winners = [rid for rid, out in outcomes.items() if out == "valid"]
    assert len(winners) == 1
    refused = [out for out in outcomes.values() if isinstance(out, ToolUnavailable)]
    assert len(refused) == n - 1
    assert all("do not retry it" in str(e) for e in refused)
    with engine.connect() as conn:
        row = conn.execute(select(tool_circuits).where(tool_circuits.c.tool == "verify_iban")).one()
        (claim,) = conn.execute(select(circuit_probes)).all()
    # One claim, marked ok by the winner: calls go through at once; the circuit's row is the
    # daemon's to close (agents never write tool_circuits).
    assert (claim.tool, claim.run_id, claim.ok, claim.opened_at) == ("verify_iban", winners[0], True, row.opened_at)
    assert (row.state, row.probe_run_id) == ("open", None)


def test_the_probe_is_one_call_even_for_the_probing_run(wd, engine):
    write_circuit(engine, "verify_iban", open_until=utcnow() - dt.timedelta(seconds=1))
    tool = Tool(failures=[ConnectionError("500 Internal Server Error")] * 5)
    with wd.run("bot") as run:
        with pytest.raises(ConnectionError):  # the probe: one attempt, no retries
            run.tool_call("verify_iban", {"iban": "DE00"}, tool, retries=3, backoff_s=0)
        with pytest.raises(ToolUnavailable, match="being probed"):  # until the daemon decides
            run.tool_call("verify_iban", {"iban": "DE01"}, tool, retries=3, backoff_s=0)
    assert len(tool.calls) == 1
    assert [(e.ok, e.error_class) for e in tool_events(engine, run.id)] == [
        (False, "ConnectionError"), (False, "ToolUnavailable")]


def test_half_open_row_without_a_probe_is_claimable(wd, engine):
    write_circuit(engine, "verify_iban", state="half_open", open_until=utcnow() - dt.timedelta(seconds=1))
    tool = Tool()
    with wd.run("bot") as run:
        assert run.tool_call("verify_iban", {}, tool) == "ok"  # the probe, and it succeeded
        assert run.tool_call("verify_iban", {}, tool) == "ok"  # closed at once: no wait for a daemon tick
    assert len(tool.calls) == 2
    with engine.connect() as conn:
        row = conn.execute(select(tool_circuits)).one()
        claim = conn.execute(select(circuit_probes)).one()
    assert (claim.run_id, claim.ok) == (run.id, True)
    assert (row.state, row.probe_run_id) == ("half_open", None)  # the daemon closes it on its tick


def test_half_open_row_with_a_probe_elsewhere_fails_fast(wd, engine):
    write_circuit(engine, "verify_iban", state="half_open", open_until=utcnow() - dt.timedelta(seconds=1),
                  probe_run_id="0" * 32)
    tool = Tool()
    with wd.run("bot") as run:
        with pytest.raises(ToolUnavailable):
            run.tool_call("verify_iban", {}, tool)
    assert tool.calls == []


# --- guards before any daemon ran -----------------------------------------------------------


def test_on_a_fresh_store_with_no_daemon_a_loop_of_identical_calls_is_stopped(db_url, engine, monkeypatch, caplog):
    monkeypatch.delenv("AGENT_WATCHDOG_CONFIG", raising=False)
    with engine.connect() as conn:
        assert conn.execute(select(settings)).first() is None  # nothing was ever published here
    tool = Tool()
    w = Watchdog(db_url, circuit_cache_s=0)
    try:
        with caplog.at_level("INFO", logger="watchdog.client"):
            with pytest.raises(RunKilled) as info:
                with w.run("bot") as run:
                    for _ in range(60):
                        run.tool_call("search", {"q": "refund"}, tool)
    finally:
        w.close()
    assert info.value.reason == lc.LOOP_DETECTED
    assert len(tool.calls) == 2  # the documented default: the 3rd identical call is refused
    assert_killed(engine, run, lc.LOOP_DETECTED)
    said = [r.getMessage() for r in caplog.records if "judged by" in r.getMessage()]
    assert len(said) == 1 and "built-in default budgets" in said[0]  # says once which it used


def test_on_a_fresh_store_the_guard_judges_by_the_config_it_can_read(db_url, engine, monkeypatch, tmp_path):
    cfg = tmp_path / "agents.toml"
    cfg.write_text("[agents.bot]\nmax_steps = 3\n")
    monkeypatch.setenv("AGENT_WATCHDOG_CONFIG", str(cfg))
    w = Watchdog(db_url, circuit_cache_s=0)
    try:
        with pytest.raises(RunKilled) as info:
            with w.run("bot") as run:
                for _ in range(60):
                    run.check_budget(0.0)
                    run.step(tokens_in=10)
    finally:
        w.close()
    assert info.value.reason == lc.MAX_STEPS
    assert run_row(engine, run.id).steps == 3
    assert_killed(engine, run, lc.MAX_STEPS)


def test_a_broken_agent_config_is_loud_at_once(db_url, monkeypatch, tmp_path):
    cfg = tmp_path / "agents.toml"
    cfg.write_text("[agents.bot]\nmax_stepz = 3\n")
    monkeypatch.setenv("AGENT_WATCHDOG_CONFIG", str(cfg))
    with pytest.raises(ConfigError, match="max_stepz"):
        Watchdog(db_url)
