"""The pure money pieces: prices, calendar periods, period states, forecasts, drift verdicts.

Plain values in, values out; the price book is checked against genai-prices itself
(its real table, not a copy of its numbers).
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from watchdog.core import drift, messages
from watchdog.core.periods import (DAY, MONTH, LabelBudget, build_states, closed_entry, live_by_scope, period_bounds,
                                   period_key, refusal, sum_spend, zone)
from watchdog.core.pricing import Price
from watchdog.daemon.money.prices import PriceBook

UTC = dt.timezone.utc
T0 = dt.datetime(2025, 3, 14, 15, 30, tzinfo=UTC)


# -- prices ------------------------------------------------------------------------------


def test_flat_price_with_cached_and_reasoning_tokens():
    p = Price(input_eur_per_mtok=2.0, output_eur_per_mtok=10.0, cached_input_eur_per_mtok=0.5)
    # 1M in of which 400k cached, 100k out of which 60k reasoning (priced as output: no own price)
    assert p.cost_eur(1_000_000, 100_000, 400_000, 60_000) == pytest.approx(0.6 * 2.0 + 0.4 * 0.5 + 0.1 * 10.0)
    assert Price(1.0, 1.0, reasoning_eur_per_mtok=5.0).cost_eur(0, 1_000_000, 0, 500_000) == pytest.approx(3.0)
    # more cached than input (a confused caller) is capped, never a negative cost
    assert p.cost_eur(100, 0, 500, 0) == pytest.approx(100 * 0.5 / 1e6)
    tiered = Price(1.0, 1.0, up_to_tokens_in=200_000)
    assert tiered.cost_eur(200_000, 0) == pytest.approx(0.2)
    assert tiered.cost_eur(200_001, 0) is None  # the daemon prices the higher tier itself


@pytest.mark.parametrize("raw", [None, [], {}, {"input_eur_per_mtok": 1}, {"input_eur_per_mtok": "1", "output_eur_per_mtok": 1},
                                 {"input_eur_per_mtok": -1, "output_eur_per_mtok": 1},
                                 {"input_eur_per_mtok": float("nan"), "output_eur_per_mtok": 1},
                                 {"input_eur_per_mtok": 1, "output_eur_per_mtok": 1, "up_to_tokens_in": "x"}])
def test_a_malformed_published_price_is_no_price(raw):
    assert Price.from_json(raw) is None


def test_published_price_round_trip():
    p = Price(2.0, 8.0, 0.5, None, 200_000)
    assert Price.from_json(p.to_json()) == p


def genai_usd(model, tokens_in, tokens_out, cached=0, reasoning=0, at=None, provider_id=None):
    from genai_prices import Usage, calc_price

    usage = Usage(input_tokens=tokens_in, output_tokens=tokens_out, cache_read_tokens=cached,
                  output_reasoning_tokens=reasoning)
    return float(calc_price(usage, model, provider_id=provider_id, genai_request_timestamp=at).total_price)


def test_price_book_prices_with_genai_prices_in_euros():
    book = PriceBook({}, eur_per_usd=0.86)
    assert book.cost_eur("gpt-4o", T0, 100_000, 20_000) == pytest.approx(genai_usd("gpt-4o", 100_000, 20_000) * 0.86)
    assert book.cost_eur("gpt-4o", T0, 100_000, 20_000, 60_000) == pytest.approx(
        genai_usd("gpt-4o", 100_000, 20_000, 60_000) * 0.86)
    assert book.cost_eur("gpt-4o", T0, 100_000, 20_000, 60_000) < book.cost_eur("gpt-4o", T0, 100_000, 20_000)
    # provider-prefixed spellings (LiteLLM "openai/...", pydantic-ai "openai:...") match the same model
    for name in ("openai/gpt-4o", "openai:gpt-4o"):
        assert book.cost_eur(name, T0, 1000, 1000) == pytest.approx(book.cost_eur("gpt-4o", T0, 1000, 1000))
    assert book.cost_eur("foo-7b", T0, 1000, 1000) is None
    assert book.cost_eur(None, T0, 1000, 1000) is None
    assert not book.known("foo-7b") and book.known("gpt-4o")


def test_overrides_win_and_prices_follow_the_rate():
    book = PriceBook({"gpt-4o": Price(1.0, 1.0), "foo-7b": Price(3.0, 6.0)}, eur_per_usd=1.0)
    assert book.cost_eur("gpt-4o", T0, 1_000_000, 0) == pytest.approx(1.0)
    assert book.cost_eur("foo-7b", T0, 1_000_000, 1_000_000) == pytest.approx(9.0)
    assert PriceBook({}, 1.0).cost_eur("gpt-4o", T0, 1e6, 0) == pytest.approx(
        2 * PriceBook({}, 0.5).cost_eur("gpt-4o", T0, 1e6, 0))


def test_prices_by_date_come_from_genai_prices():
    """The step's own date is passed through: the result is genai-prices' for that date."""
    book = PriceBook({}, eur_per_usd=1.0)
    old = dt.datetime(2023, 6, 1, tzinfo=UTC)
    for model in ("gpt-4o", "claude-3-5-sonnet", "gemini-2.5-pro"):
        assert book.cost_eur(model, old, 300_000, 1000) == pytest.approx(genai_usd(model, 300_000, 1000, at=old))


def test_the_published_flat_price_agrees_with_the_exact_one():
    book = PriceBook({}, eur_per_usd=0.86)
    for model in ("gpt-4o", "gpt-4o-mini", "o3", "claude-3-5-sonnet"):
        assert book.learn(model, T0)
        flat = Price.from_json(book.published()[model])
        assert flat.cost_eur(123_456, 7_890, 23_456, 1_000) == pytest.approx(
            book.cost_eur(model, T0, 123_456, 7_890, 23_456, 1_000))
    # a tiered model: flat up to its first tier, the rest left to the daemon
    assert book.learn("gemini-2.5-pro", T0)
    flat = Price.from_json(book.published()["gemini-2.5-pro"])
    assert flat.up_to_tokens_in == 200_000
    assert flat.cost_eur(100_000, 1000) == pytest.approx(book.cost_eur("gemini-2.5-pro", T0, 100_000, 1000))
    assert flat.cost_eur(300_000, 1000) is None
    assert not book.learn("foo-7b", T0) and "foo-7b" not in book.published()


# -- calendar periods ------------------------------------------------------------------------


def test_days_and_months_in_utc():
    assert period_bounds(DAY, T0, UTC) == (dt.datetime(2025, 3, 14, tzinfo=UTC), dt.datetime(2025, 3, 15, tzinfo=UTC))
    assert period_bounds(MONTH, T0, UTC) == (dt.datetime(2025, 3, 1, tzinfo=UTC), dt.datetime(2025, 4, 1, tzinfo=UTC))
    dec = dt.datetime(2024, 12, 31, 23, 59, tzinfo=UTC)
    assert period_bounds(MONTH, dec, UTC)[1] == dt.datetime(2025, 1, 1, tzinfo=UTC)
    assert period_key(DAY, T0, UTC) == "2025-03-14" and period_key(MONTH, T0, UTC) == "2025-03"


def test_periods_follow_budget_tz_across_dst():
    paris = zone("Europe/Paris")
    # 2025-03-30: clocks go 02:00 → 03:00 in Paris; that day has 23 hours
    start, end = period_bounds(DAY, dt.datetime(2025, 3, 30, 12, tzinfo=UTC), paris)
    assert start == dt.datetime(2025, 3, 29, 23, tzinfo=UTC) and end == dt.datetime(2025, 3, 30, 22, tzinfo=UTC)
    # 23:30 UTC on the 14th is already the 15th in Paris
    assert period_key(DAY, dt.datetime(2025, 3, 14, 23, 30, tzinfo=UTC), paris) == "2025-03-15"
    kolkata = zone("Asia/Kolkata")  # a half-hour offset
    assert period_bounds(DAY, T0, kolkata)[0] == dt.datetime(2025, 3, 13, 18, 30, tzinfo=UTC)
    with pytest.raises(ValueError, match="Mars/Olympus"):
        zone("Mars/Olympus")


# -- period spend and states -------------------------------------------------------------------


def _profile(day=50.0, month=500.0, warn_at=0.8):
    return SimpleNamespace(max_cost_eur_per_day=day, max_cost_eur_per_month=month, warn_at=warn_at)


def test_spend_is_ledger_plus_unbooked_plus_live_each_once():
    acme = LabelBudget({"tenant": "acme"}, max_cost_eur_per_day=5.0)
    ledger = {("agent:bot", DAY): 10.0, ("agent:bot", MONTH): 100.0, (acme.scope, DAY): 1.0}
    # ended runs not booked yet, summed per (agent, labels): (cost ended today, this month)
    unbooked = [("bot", {"tenant": "acme"}, 2.0, 2.0), ("bot", None, 0.0, 7.0)]
    live = [("r1", "bot", 0.5), ("r2", "other", 0.25)]
    labels = {"r1": {"tenant": "acme", "team": "x"}, "r2": {"tenant": "globex"}}
    spent, agents = sum_spend(ledger, unbooked, live_by_scope(live, (acme,), labels.get), (acme,))
    assert spent[("agent:bot", DAY)] == pytest.approx(12.5)
    assert spent[("agent:bot", MONTH)] == pytest.approx(109.5)
    assert spent[(acme.scope, DAY)] == pytest.approx(3.5)
    assert spent[("agent:other", DAY)] == pytest.approx(0.25)
    assert agents == {"bot", "other"}


def test_states_warn_close_and_forecast():
    spent = {("agent:bot", DAY): 41.0, ("agent:bot", MONTH): 41.0, ("agent:big", DAY): 50.0}
    states = build_states(spent, {"bot", "big"}, lambda a: _profile(), (), T0, UTC,
                          rate_of=lambda scope, p, k, s, start: 0.5)
    by = {(s.scope.name, s.period): s for s in states}
    bot_day = by[("bot", DAY)]
    assert bot_day.warned and not bot_day.closed
    assert bot_day.runs_out_at == T0 + dt.timedelta(minutes=18)  # 9 EUR left at 0.5 EUR/min
    month = by[("bot", MONTH)]
    assert not month.warned and month.runs_out_at == T0 + dt.timedelta(minutes=918)  # 459 EUR left
    assert messages.period_line(month, T0, UTC) == (
        "bot's monthly budget runs out at 2025-03-15 06:48 UTC at 0.50 EUR/min (41.00/500.00 EUR)")
    slow = build_states(spent, {"bot"}, lambda a: _profile(), (), T0, UTC, rate_of=lambda *a: 0.001)
    assert messages.period_line(slow[1], T0, UTC) == (
        "bot's monthly budget lasts the month at 0.0010 EUR/min (41.00/500.00 EUR)")
    big = by[("big", DAY)]
    assert big.closed and big.reason == "daily_budget" and big.runs_out_at == T0
    line = messages.period_line(bot_day, T0, UTC)
    assert line == "bot's daily budget runs out at 15:48 UTC at 0.50 EUR/min (41.00/50.00 EUR)"
    entry = closed_entry(big)
    assert refusal([entry], "big", None, T0) == ("daily_budget", entry["detail"])
    assert refusal([entry], "bot", None, T0) is None
    assert refusal([entry], "big", None, big.end) is None  # the period is over: not refused on a stale row


def test_a_huge_budget_at_a_tiny_rate_lasts_the_period():
    from watchdog.core.periods import runs_out_at

    assert runs_out_at(0.0, 1e12, 1e-9, T0, T0 + dt.timedelta(days=1)) is None


def test_zero_budget_is_no_budget():
    states = build_states({("agent:bot", DAY): 1000.0}, {"bot"}, lambda a: _profile(day=0, month=0), (), T0, UTC)
    assert states and not any(s.closed or s.warned for s in states)


def test_label_refusal_matches_a_subset_of_the_run_labels():
    acme = LabelBudget({"tenant": "acme"}, max_cost_eur_per_day=5.0)
    s = build_states({(acme.scope, DAY): 5.0}, set(), None, (acme,), T0, UTC)[0]
    entry = closed_entry(s)
    assert refusal([entry], "any", {"tenant": "acme", "team": "x"}, T0)[0] == "daily_budget"
    assert refusal([entry], "any", {"tenant": "globex"}, T0) is None
    assert refusal([entry], "any", None, T0) is None
    # hand-written garbage in the published row is ignored, never raised
    assert refusal([None, {"until": "soon"}, {"scope": "agent", "name": "any", "until": "2999-01-01T00:00:00+00:00",
                                                "reason": "rm -rf"}], "any", None, T0) is None
    assert refusal("nope", "any", None, T0) is None


def test_run_forecast_lines():
    assert messages.run_line(1.23, 2.0, 180) == "at 0.41 EUR/min this run reaches its 2.00 EUR budget in 2 min"
    assert messages.run_line(2.46, 2.0, 360) == "at 0.41 EUR/min this run reached its 2.00 EUR budget in 6 min"
    assert messages.run_line(0.0, 2.0, 100) is None


def test_rate_tracker_uses_recent_spend_and_survives_a_clock_jump():
    r = messages.RateTracker()
    start = T0.replace(hour=0, minute=0)
    # the first sample: the period's average (15.5 h for 9.3 EUR = 0.01 EUR/min)
    assert r.rate("agent:bot", DAY, "k", 9.3, T0, start) == pytest.approx(9.3 / (15.5 * 60))
    for i in range(1, 11):  # then 1 EUR a minute
        rate = r.rate("agent:bot", DAY, "k", 9.3 + i, T0 + dt.timedelta(minutes=i), start)
    assert rate == pytest.approx(1.0)
    assert r.rate("agent:bot", DAY, "k", 20.0, T0 - dt.timedelta(hours=1), start) is not None  # no crash, no negative
    assert r.rate("agent:bot", DAY, "next-day", 0.0, T0, start) is None  # a new period starts from nothing


# -- drift ------------------------------------------------------------------------------------


CFG = drift.DriftConfig()


def test_drift_fires_on_a_ninefold_tool_calls_per_run():
    baseline = drift.Totals(runs=1000, stopped=10, steps=4000, tool_calls=3100, cost_eur=12.0)
    window = drift.Totals(runs=61, stopped=1, steps=250, tool_calls=1708, cost_eur=0.75)
    verdicts = drift.evaluate(window, baseline, CFG)
    assert [v.metric for v in verdicts] == ["tool calls/run"]
    line = drift.line("support-bot", verdicts[0], CFG.window_s, ("search.read", 412), window.runs)
    assert line == ("agent «support-bot»: tool calls/run 3.1 → 28.0 (×9.0) in the last hour; "
                    "top tool «search.read» ×412; 61 runs")


def test_no_drift_on_a_steady_agent_too_few_runs_or_no_baseline():
    baseline = drift.Totals(runs=1000, stopped=10, steps=4000, tool_calls=3100, cost_eur=12.0)
    steady = drift.Totals(runs=50, stopped=1, steps=210, tool_calls=160, cost_eur=0.6)
    assert drift.evaluate(steady, baseline, CFG) == []
    few = drift.Totals(runs=9, tool_calls=900)
    assert drift.evaluate(few, baseline, CFG) == []
    assert drift.evaluate(drift.Totals(runs=50, tool_calls=5000), drift.Totals(), CFG) == []
    assert drift.evaluate(drift.Totals(runs=50, tool_calls=5000), baseline, drift.DriftConfig(factor=0)) == []


def test_drift_on_stops_from_a_baseline_without_any():
    baseline = drift.Totals(runs=1000, steps=4000, tool_calls=3000, cost_eur=10.0)
    window = drift.Totals(runs=20, stopped=8, steps=80, tool_calls=60, cost_eur=0.2)
    (v,) = drift.evaluate(window, baseline, CFG)
    assert v.metric == "runs stopped" and v.shown_window == "40%" and v.ratio >= 3


def test_names_from_the_store_are_one_printable_line_in_alerts():
    from watchdog.core.money_alerts import unpriced_alert

    title, body = unpriced_alert("evil\nmodel\x1b[2J", ["a\nb"] + [f"bot{i}" for i in range(12)], 10, 1, False)
    assert "\n" not in title and "\x1b" not in title
    # The title is the daemon's words only (issue 32); the names are marked fields of the body.
    assert title == "agent-watchdog: a model has no price: cost budgets are not enforced"
    assert body.startswith("model «evil model [2J» has no price: cost budgets are not enforced for agents «a b», ")
    assert "\x1b" not in body and "(+3 more)" in body.splitlines()[0]
    v = drift.DriftVerdict("tool calls/run", 3.0, 27.0, 9.0, "3.0", "27.0")
    assert "\n" not in drift.line("bot\n", v, 3600, ("x\ny", 5), 61)
