"""max_tokens: the price-independent backstop (in + out per run, default 2,000,000),
a budget like the others — config, a run's own lower request, the in-process guard,
the daemon's stop, the alert — all from its one entry in watchdog.core.budgets.
"""

from __future__ import annotations

import datetime as dt

import pytest

from daemon_support import SEALER, alerts_of, config, run_row
from watchdog import RunKilled, Watchdog
from watchdog.core import lifecycle as lc
from watchdog.core import policies as p
from watchdog.core.budgets import BY_KEY, Budgets
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.schema import utcnow

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


def snap(tokens: int) -> p.RunSnapshot:
    return p.RunSnapshot(id="r" * 32, agent="bot", started_at=T0, last_seen_at=T0, steps=1, tool_calls=0,
                         tool_errors=0, cost_eur=0.0, tokens=tokens)


def test_default_is_two_million_in_plus_out_and_trips_only_over_it():
    assert Budgets().max_tokens == 2_000_000
    budget = BY_KEY["max_tokens"]
    assert p.check(budget, snap(2_000_000), Budgets(), T0) is None
    v = p.check(budget, snap(2_000_001), Budgets(), T0)
    assert (v.reason, v.detail) == (lc.MAX_TOKENS, "tokens 2000001/2000000")
    # a run over its cost budget too is named for the cost (the more specific cause)
    both = p.RunSnapshot(**{**snap(3_000_000).__dict__, "cost_eur": 5.0})
    assert [v.reason for v in p.evaluate(both, Budgets(), T0)] == [lc.MAX_COST, lc.MAX_TOKENS]


def test_profiles_set_it_and_runs_only_lower_it(db_url):
    cfg = config(defaults={"max_tokens": 50_000}, agents={"big": {"max_tokens": 900_000}})
    assert cfg.profile("other").max_tokens == 50_000 and cfg.profile("big").max_tokens == 900_000
    wd = Watchdog(db_url)
    try:
        with pytest.raises(ValueError, match="max_tokens"):
            wd.run("bot", max_tokens=3_000_000)  # above the documented default profile
        with pytest.raises(ValueError, match="max_tokens"):
            wd.run("bot", max_tokens=0)
    finally:
        wd.close()


def test_the_in_process_guard_stops_a_run_over_its_tokens(engine, db_url):
    wd = Watchdog(db_url)
    try:
        with pytest.raises(RunKilled) as stop:
            with wd.run("bot", max_tokens=1000) as run:
                run.step(model="foo-7b", tokens_in=400, tokens_out=100)
                run.step(model="foo-7b", tokens_in=400, tokens_out=101)  # 1001 > 1000
        assert stop.value.reason == lc.MAX_TOKENS
        row = run_row(engine, run.id)
        assert (row.status, row.stop_reason, row.tokens_in + row.tokens_out) == (lc.KILLED, lc.MAX_TOKENS, 1001)
    finally:
        wd.close()


def test_the_daemon_stops_a_run_over_its_tokens_and_says_so(engine, db_url):
    wd = Watchdog(db_url)
    tk = Ticker(engine, config(defaults={"max_tokens": 100_000}), Killer(), sealer=SEALER)
    try:
        with wd.run("bot", guards=False) as ok, wd.run("bot", guards=False, max_tokens=5_000) as runaway:
            ok.step(model="foo-7b", tokens_in=4000, tokens_out=1000)  # 5000: at its own budget? no: 100k
            runaway.step(model="foo-7b", tokens_in=4000, tokens_out=1001)
            rep = tk.tick(utcnow())
            assert rep.stops == [(runaway.id, lc.MAX_TOKENS)]
            row = run_row(engine, runaway.id)
            assert (row.status, row.stop_reason, row.stop_detail) == (lc.STOPPING, lc.MAX_TOKENS, "tokens 5001/5000")
            (alert,) = alerts_of(engine, runaway.id)
            assert alert.title.endswith("— max_tokens") and "tokens 5001/5000  ← OVER" in alert.body
            assert run_row(engine, ok.id).status == lc.RUNNING
    finally:
        wd.close()
