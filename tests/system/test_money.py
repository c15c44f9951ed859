"""Money that is right by default, end to end on SQLite and PostgreSQL.

Real stores, real genai-prices, real agent processes for the shared daily budget; the
daemon's tick driven with an explicit clock; alerts read from the outbox the daemon
fills. Nothing is mocked.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select, text

from agent_procs import wait_until
from daemon_support import SEALER, alerts_of, config, later, run_row
from failsafe_support import constraints_off
from watchdog import RunKilled, Watchdog
from watchdog.cli import main
from watchdog.core import lifecycle as lc
from watchdog.core.periods import CLOSED_KEY
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.process.service import Daemon
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.ledger import first_bucket_after
from watchdog.store.schema import events, runs, settings, spend_ledger, utcnow


def genai_eur(model: str, tokens_in: int, tokens_out: int, rate: float) -> float:
    from genai_prices import Usage, calc_price

    return float(calc_price(Usage(input_tokens=tokens_in, output_tokens=tokens_out), model).total_price) * rate


def ticker(engine, cfg) -> Ticker:
    return Ticker(engine, cfg, Killer(), sealer=SEALER)


def money_alerts(engine, prefix: str) -> list:
    return [a for a in alerts_of(engine) if a.dedupe_key.startswith(prefix)]


# -- prices from genai-prices, with no [prices] ------------------------------------------------


def test_five_gpt_4o_steps_with_no_price_table_are_stopped_for_max_cost(engine, db_url, wd):
    """5 × (100,000 in + 20,000 out) of gpt-4o: 2.25 USD at the list price. At 0.95 EUR/USD that is
    2.14 EUR, over the default 2.00 EUR budget (at the documented default 0.86 it would be 1.94)."""
    daemon = Daemon(engine, config(pricing={"eur_per_usd": 0.95}), notifier=Notifier([]))
    expected = 5 * genai_eur("gpt-4o", 100_000, 20_000, 0.95)
    assert expected > 2.0
    with pytest.raises(RunKilled) as stop:
        with wd.run("support-bot") as run:  # guards on: the SDK knows no price for gpt-4o yet
            for _ in range(5):
                run.step(model="gpt-4o", tokens_in=100_000, tokens_out=20_000)
            row = run_row(engine, run.id)
            assert (row.cost_eur, row.cost_unpriced_tokens) == (0.0, 600_000)  # recorded unpriced, never 0
            rep = daemon.tick_job(utcnow())
            assert rep.stops == [(run.id, lc.MAX_COST)] and rep.priced_steps == 5
            run.heartbeat()
    assert stop.value.reason == lc.MAX_COST
    row = run_row(engine, run.id)
    assert row.cost_eur == pytest.approx(expected, rel=0.01)
    assert row.cost_unpriced_tokens == 0 and row.status == lc.KILLED
    with engine.connect() as conn:
        costs = conn.execute(select(events.c.cost_eur).where(events.c.run_id == run.id)
                             .where(events.c.kind == "step")).scalars().all()
    assert costs == pytest.approx([expected / 5] * 5, rel=0.01)
    (alert,) = alerts_of(engine, run.id)
    assert "reason max_cost: cost 2.14/2.00 EUR" in alert.body
    assert re.search(r"^at [\d.]+ EUR/min this run reached its 2\.00 EUR budget in ", alert.body, re.M)
    assert "the daily budget of agent «support-bot» lasts the day" in alert.body or (
        "the daily budget of agent «support-bot» runs out" in alert.body)
    assert money_alerts(engine, "unpriced:") == []  # genai-prices knows gpt-4o: nothing to report

    # The daemon published gpt-4o's price: the SDK now prices the step itself, the same amount.
    wd2 = Watchdog(db_url)
    try:
        with wd2.run("support-bot") as run2:
            run2.step(model="gpt-4o", tokens_in=100_000, tokens_out=20_000)
        row2 = run_row(engine, run2.id)
        assert row2.cost_unpriced_tokens == 0
        assert row2.cost_eur == pytest.approx(expected / 5, rel=0.01)
    finally:
        wd2.close()


def test_cached_and_reasoning_tokens_are_priced_at_their_rates(engine, wd):
    from genai_prices import Usage, calc_price

    tk = ticker(engine, config())
    with wd.run("bot", guards=False) as run:
        run.step(model="openai/gpt-4o", tokens_in=100_000, tokens_out=20_000, cached_tokens_in=80_000,
                 reasoning_tokens=5_000)
        tk.tick(utcnow())
    usd = calc_price(Usage(input_tokens=100_000, output_tokens=20_000, cache_read_tokens=80_000,
                           output_reasoning_tokens=5_000), "gpt-4o").total_price
    row = run_row(engine, run.id)
    assert row.cost_eur == pytest.approx(float(usd) * 0.86, rel=1e-6)
    assert (row.cached_tokens_in, row.reasoning_tokens) == (80_000, 5_000)
    assert row.cost_eur < genai_eur("gpt-4o", 100_000, 20_000, 0.86)


def test_an_override_wins_over_genai_prices(engine, wd):
    tk = ticker(engine, config(prices={"gpt-4o": {"input_eur_per_mtok": 1.0, "output_eur_per_mtok": 1.0}}))
    with wd.run("bot", guards=False) as run:
        run.step(model="gpt-4o", tokens_in=1_000_000, tokens_out=1_000_000)
        tk.tick(utcnow())
    assert run_row(engine, run.id).cost_eur == pytest.approx(2.0)


def test_two_daemons_price_a_step_once(engine, wd):
    """Two daemons (two hosts) on one store: the compare-and-set on the event prices it once."""
    a, b = ticker(engine, config()), ticker(engine, config())
    with wd.run("bot", guards=False) as run:
        run.step(model="gpt-4o-mini", tokens_in=1_000_000, tokens_out=0)
        now = utcnow()
        a.tick(now)
        b.tick(now)
    assert run_row(engine, run.id).cost_eur == pytest.approx(genai_eur("gpt-4o-mini", 1_000_000, 0, 0.86))
    a.tick(later(now, 5))
    b.tick(later(now, 5))
    with engine.connect() as conn:
        booked = conn.execute(select(spend_ledger.c.runs).where(spend_ledger.c.scope == "agent:bot")
                              .where(spend_ledger.c.period == "day")).scalar()
    assert booked == 1  # booked once, whichever daemon got there


# -- no silent zero ------------------------------------------------------------------------------


def test_an_unknown_model_raises_one_alert_and_a_max_tokens_stop(engine, db_url, wd):
    tk = ticker(engine, config())
    with pytest.raises(RunKilled) as stop:
        with wd.run("support-bot", guards=False) as run:
            for _ in range(5):
                run.step(model="foo-7b", tokens_in=400_000, tokens_out=100_000)  # 2.5M > max_tokens 2M
            now = utcnow()
            rep = tk.tick(now)
            assert rep.stops == [(run.id, lc.MAX_TOKENS)] and rep.unpriced == {"foo-7b": 2_500_000}
            run.heartbeat()
    assert stop.value.reason == lc.MAX_TOKENS
    (alert,) = money_alerts(engine, "unpriced:")
    assert alert.title == "agent-watchdog: a model has no price: cost budgets are not enforced"
    assert alert.body.startswith('model «foo-7b» has no price: cost budgets are not enforced for agent '
                                 '«support-bot»; add [prices."MODEL"]')
    assert '[prices."MODEL"]' in alert.body and "max_tokens" in alert.body
    (stop_alert,) = alerts_of(engine, run.id)
    assert "tokens 2500000/2000000  ← OVER" in stop_alert.body
    assert "unpriced: 2500000 tokens" in stop_alert.body

    # More of it the same day, another run, later ticks: still the one alert.
    with wd.run("support-bot", guards=False) as again:
        again.step(model="foo-7b", tokens_in=10, tokens_out=10)
        tk.tick(later(now, 5))
        tk.tick(later(now, 10))
    assert len(money_alerts(engine, "unpriced:")) == 1
    # A restarted daemon (a fresh Ticker: cold start) does not alert it again either.
    ticker(engine, config()).tick(later(now, 15))
    assert len(money_alerts(engine, "unpriced:")) == 1

    # show --json / runs --json mark the cost as unpriced.
    runner = CliRunner()
    shown = json.loads(runner.invoke(main, ["--db", db_url, "show", run.id, "--json"]).stdout)
    assert shown["cost_unpriced_tokens"] == 2_500_000 and shown["cost_eur"] == 0.0
    listed = json.loads(runner.invoke(main, ["--db", db_url, "runs", "--all", "--json"]).stdout)
    assert {r["id"]: r["cost_unpriced_tokens"] for r in listed} == {run.id: 2_500_000, again.id: 20}


def test_the_unpriced_metric_counts_the_tokens(engine, wd):
    from watchdog.daemon.process.metrics import Metrics

    metrics = Metrics()
    daemon = Daemon(engine, config(), notifier=Notifier([]), metrics=metrics)
    with wd.run("bot", guards=False) as run:
        run.step(model="foo-7b", tokens_in=300, tokens_out=20)
        daemon.tick_job(utcnow())
    value = metrics.registry.get_sample_value("agent_watchdog_unpriced_tokens_total", {"model": "foo-7b"})
    assert value == 320


# -- period budgets ------------------------------------------------------------------------------


def test_a_daily_budget_spent_by_several_agent_processes_stops_them_and_refuses_the_next_run(
        engine, db_url, procs, tmp_path, wd):
    """Three real processes start at once on an empty ledger; none is near its own budget; their
    sum crosses the agent's daily budget: one tick stops all three, and new runs are refused."""
    cfg = config(agents={"spend-bot": {"max_cost_eur_per_day": 1.0, "max_cost_eur": 100.0, "max_steps": 100_000}})
    tk = ticker(engine, cfg)
    nxt, go = tmp_path / "next", tmp_path / "go"
    agents = [procs.start("spender", db_url, step_cost=0.004, interval=0.02, next=str(nxt), go=str(go))
              for _ in range(3)]
    ids = {a.run_id for a in agents}
    tk.tick(utcnow())
    assert {s.scope.name: s.spent_eur for s in tk.money.states if s.period == "day"}["spend-bot"] == 0.0
    go.touch()  # all three spend at once, on an empty ledger
    stops = []
    assert wait_until(lambda: bool(stops.extend(tk.tick(utcnow()).stops) or stops), timeout_s=60, poll_s=0.05)
    states = {(s.scope.name, s.period): s for s in tk.money.states}
    assert sorted(stops) == sorted((rid, lc.DAILY_BUDGET) for rid in ids)  # all three, in the same tick
    day = states[("spend-bot", "day")]
    assert day.closed and day.spent_eur >= 1.0
    costs = [run_row(engine, rid).cost_eur for rid in ids]
    assert max(costs) < 1.0  # no single run was over anything: the sum was
    for rid in ids:
        row = run_row(engine, rid)
        assert row.status in (lc.STOPPING, lc.KILLED) and row.stop_reason == lc.DAILY_BUDGET
        assert "the daily budget of agent «spend-bot» is spent" in row.stop_detail

    # This process too: refused at once, before any model call.
    with pytest.raises(RunKilled) as refused:
        wd.run("spend-bot")
    assert refused.value.reason == lc.DAILY_BUDGET
    with wd.run("other-bot") as fine:  # other agents are not concerned
        fine.step(model="gpt-x", tokens_in=1, tokens_out=1)

    nxt.touch()
    for a in agents:
        assert a.wait() == 0, a.log()
        assert a.result() == {"killed": lc.DAILY_BUDGET, "detail": a.result()["detail"], "next": lc.DAILY_BUDGET}
    (closed,) = money_alerts(engine, "budget-closed:")
    assert closed.title.startswith("agent-watchdog: a daily budget is spent — ")
    assert "action stopped 3 running runs (daily_budget)" in closed.body
    assert len(money_alerts(engine, "budget-warning:")) <= 1

    # The runs end, get booked; the budget stays spent through later ticks and a daemon restart.
    tk.tick(utcnow())
    fresh = ticker(engine, cfg)
    fresh.tick(utcnow())
    assert ("agent:spend-bot" in fresh.money.closed) and len(money_alerts(engine, "budget-closed:")) == 1
    with engine.connect() as conn:
        ledger = conn.execute(select(spend_ledger.c.cost_eur).where(spend_ledger.c.scope == "agent:spend-bot")
                              .where(spend_ledger.c.period == "day")).scalar()
    assert ledger == pytest.approx(sum(run_row(engine, rid).cost_eur for rid in ids))


def midday_zone(now: dt.datetime) -> str:
    """A fixed-offset IANA zone in which `now` falls near noon. The SDK stamps events with the
    real clock, so a test whose ticks run minutes past it would see a second day's budget open
    when started just before midnight UTC; in this zone its day does not turn for hours."""
    offset_h = 12 - now.hour  # in -11..12; Etc/GMT's sign is inverted (Etc/GMT-3 is UTC+3)
    return "Etc/GMT" if offset_h == 0 else f"Etc/GMT{-offset_h:+d}"


def test_the_warning_goes_out_once_at_warn_at(engine, wd):
    now = utcnow()
    cfg = config(agents={"warn-bot": {"max_cost_eur_per_day": 10.0, "max_cost_eur": 100.0, "heartbeat_timeout_s": 3600.0}},
                 pricing={"budget_tz": midday_zone(now)})
    tk = ticker(engine, cfg)
    with wd.run("warn-bot", guards=False) as run:
        run.step(model="gpt-x", cost_eur=7.9)
        tk.tick(now)
        assert money_alerts(engine, "budget-warning:") == []  # 79 %: not yet
        run.step(model="gpt-x", cost_eur=0.6)
        tk.tick(later(now, 60))
        (warning,) = money_alerts(engine, "budget-warning:")
        assert warning.title == "agent-watchdog: a daily budget at 85% — 8.50/10.00 EUR"
        assert "the daily budget of agent «warn-bot»" in warning.body.splitlines()[0]
        for s in (120, 180, 240):
            assert tk.tick(later(now, s)).stops == []
        ticker(engine, cfg).tick(later(now, 300))  # a restarted daemon does not warn again
        assert len(money_alerts(engine, "budget-warning:")) == 1
    # The run ended: the warning still holds, from the ledger.
    tk.tick(later(now, 360))
    assert len(money_alerts(engine, "budget-warning:")) == 1
    assert money_alerts(engine, "budget-closed:") == []


def test_the_next_period_reopens_what_a_spent_budget_closed(engine, wd):
    cfg = config(agents={"day-bot": {"max_cost_eur_per_day": 1.0}})
    tk = ticker(engine, cfg)
    now = utcnow()
    with wd.run("day-bot", guards=False) as run:
        run.step(model="gpt-x", cost_eur=1.5)
    tk.tick(now)
    with pytest.raises(RunKilled):
        wd.run("day-bot")
    with engine.connect() as conn:
        (closed,) = conn.execute(select(settings.c.value).where(settings.c.key == CLOSED_KEY)).scalar()
    assert closed["name"] == "day-bot" and closed["reason"] == lc.DAILY_BUDGET
    tomorrow = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(0, 5), dt.timezone.utc)
    tk.tick(tomorrow)
    with engine.connect() as conn:
        assert conn.execute(select(settings.c.value).where(settings.c.key == CLOSED_KEY)).scalar() == []
    with wd.run("day-bot") as run2:  # refused no more
        run2.heartbeat()


def test_a_monthly_budget_stops_with_its_own_reason(engine, wd):
    tk = ticker(engine, config(agents={"m-bot": {"max_cost_eur_per_month": 3.0, "max_cost_eur": 10.0}}))
    with pytest.raises(RunKilled) as stop:
        with wd.run("m-bot", guards=False) as run:
            run.step(model="gpt-x", cost_eur=3.5)
            assert tk.tick(utcnow()).stops == [(run.id, lc.MONTHLY_BUDGET)]
            run.heartbeat()
    assert stop.value.reason == lc.MONTHLY_BUDGET


def test_label_budgets_are_shared_across_agents_of_a_tenant(engine, wd):
    cfg = config(budgets=[{"labels": {"tenant": "acme"}, "max_cost_eur_per_day": 1.0}])
    tk = ticker(engine, cfg)
    acme = {"tenant": "acme", "team": "support"}
    with wd.run("bot-a", labels=acme, guards=False) as a, wd.run("bot-b", labels={"tenant": "acme"}, guards=False) as b, \
            wd.run("bot-a", labels={"tenant": "globex"}, guards=False) as g:
        a.step(model="gpt-x", cost_eur=0.6)
        b.step(model="gpt-x", cost_eur=0.5)
        g.step(model="gpt-x", cost_eur=0.9)
        rep = tk.tick(utcnow())
        assert sorted(rep.stops) == sorted([(a.id, lc.DAILY_BUDGET), (b.id, lc.DAILY_BUDGET)])
        assert run_row(engine, g.id).status == lc.RUNNING
        assert "the daily budget of labels «tenant=acme» is spent" in run_row(engine, a.id).stop_detail
        with pytest.raises(RunKilled):
            wd.run("bot-c", labels={"tenant": "acme"})
        with wd.run("bot-c", labels={"tenant": "globex"}) as fine:
            fine.heartbeat()
        for r in (a, b):
            with pytest.raises(RunKilled):
                r.heartbeat()


# -- drift ---------------------------------------------------------------------------------------


def _synthetic(engine, now: dt.datetime, burst_calls: int, *, agent="support-bot"):
    """A week of runs of 3 tool calls (one ending every 30 min), then the last hour's 61 runs
    of `burst_calls` each: rows as any writer of the table contract writes them."""
    run_rows, event_rows = [], []

    def add(end: dt.datetime, calls: int):
        rid = uuid.uuid4().hex
        start = end - dt.timedelta(seconds=30)
        run_rows.append(dict(id=rid, agent=agent, status="completed", kill_mode="cooperative", host="elsewhere",
                             steps=2, tool_calls=calls, cost_eur=0.01, started_at=start, last_seen_at=end,
                             ended_at=end, last_seq=calls))
        for i in range(calls):
            event_rows.append(dict(run_id=rid, seq=i + 1, at=start + dt.timedelta(seconds=i * 0.1), kind="tool",
                                   tool="search.read" if i % 4 else "crm.lookup", args_hash=f"{i:04x}", ok=True))

    history_end = now - dt.timedelta(hours=1, minutes=5)
    for k in range(7 * 48):
        add(history_end - dt.timedelta(minutes=30 * k), 3)
    burst_from = first_bucket_after(now - dt.timedelta(hours=1))
    span_s = (now - burst_from).total_seconds() - 5
    for k in range(61):
        add(burst_from + dt.timedelta(seconds=5 + span_s * k / 61), burst_calls)
    with engine.begin() as conn:
        conn.execute(insert(runs), run_rows)
        for i in range(0, len(event_rows), 1000):
            conn.execute(insert(events), event_rows[i : i + 1000])


def test_drift_fires_on_an_hour_of_nine_times_the_tool_calls_and_not_on_a_steady_week(engine):
    now = utcnow()
    _synthetic(engine, now, burst_calls=27, agent="support-bot")
    _synthetic(engine, now, burst_calls=3, agent="steady-bot")
    tk = ticker(engine, config())
    rep = tk.tick(now)
    assert rep.booked == 2 * (7 * 48 + 61)
    (alert,) = money_alerts(engine, "drift:")
    top = 61 * 27 - 61 * 7  # search.read: 3 of every 4 calls (indices not divisible by 4)
    assert alert.title == "agent-watchdog: drift of an agent: tool calls/run ×9.0 in the last hour"
    assert alert.body.startswith(f"agent «support-bot»: tool calls/run 3.0 → 27.0 (×9.0) in the last hour; "
                                 f"top tool «search.read» ×{top}; 61 runs")
    assert "baseline 336 runs over the 7 days before" in alert.body
    # Once per window: later ticks within the hour add nothing, nor does a restarted daemon, even
    # across the top of the clock hour; an hour on, a drift that lasts is alerted again.
    tk.tick(later(now, 120))
    ticker(engine, config()).tick(later(now, 180))
    ticker(engine, config()).tick(later(now, 3500))
    assert len(money_alerts(engine, "drift:")) == 1


def test_drift_needs_min_runs_in_the_window(engine):
    now = utcnow()
    _synthetic(engine, now, burst_calls=27)
    ticker(engine, config(drift={"min_runs": 62})).tick(now)
    assert money_alerts(engine, "drift:") == []


# -- the budgets command, top, the store contract ----------------------------------------------------


def test_budgets_command_shows_spend_against_budgets(engine, db_url, wd, tmp_path):
    cfg_path = tmp_path / "watchdog.toml"
    cfg_path.write_text('[agents.cli-bot]\nmax_cost_eur_per_day = 4.0\n\n'
                        '[[budgets]]\nlabels = { tenant = "acme" }\nmax_cost_eur_per_month = 100.0\n')
    from watchdog.core.config import load

    tk = ticker(engine, load(str(cfg_path)))
    with wd.run("cli-bot", labels={"tenant": "acme"}, guards=False) as run:
        run.step(model="gpt-x", cost_eur=3.5)
        tk.tick(utcnow())
        runner = CliRunner()
        out = runner.invoke(main, ["--db", db_url, "--config", str(cfg_path), "budgets", "--json"])
        assert out.exit_code == 0, out.output
        states = {(s["name"], s["period"]): s for s in json.loads(out.stdout)}
        day = states[("cli-bot", "day")]
        assert (day["spent_eur"], day["budget_eur"], day["closed"]) == (3.5, 4.0, False)
        assert states[("tenant=acme", "month")]["spent_eur"] == 3.5
        assert states[("tenant=acme", "month")]["labels"] == {"tenant": "acme"}
        table = runner.invoke(main, ["--db", db_url, "--config", str(cfg_path), "budgets"]).stdout
        assert re.search(r"^cli-bot\s+day\s+3\.50\s+4\.00\s+88%.*WARN$", table, re.M), table
        top = runner.invoke(main, ["--db", db_url, "--config", str(cfg_path), "top", "--once"]).stdout
        assert "cli-bot's daily budget" in top, top


def test_migration_books_the_history_and_downgrade_keeps_the_events(tmp_path):
    from watchdog.store import access
    from watchdog.store.engine import make_engine

    # Yesterday's run: older history would be pruned by the tick's retention ([store] keep_days).
    day = (dt.date.today() - dt.timedelta(days=1)).isoformat()
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    try:
        access.upgrade(engine, "0002")
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, "
                              f"ended_at, cost_eur) VALUES ('r1', 'old', 'completed', 'process', 'h', "
                              f"'{day} 00:00:00.000000', '{day} 00:01:00.000000', "
                              f"'{day} 00:01:00.000000', 9.0)"))
            conn.execute(text("INSERT INTO events (run_id, seq, at, kind) VALUES "
                              f"('r1', 1, '{day} 00:00:30.000000', 'heartbeat')"))
        access.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(select(runs.c.booked_at)).scalar() is not None  # history: not re-counted
        rep = ticker(engine, config()).tick(utcnow())
        assert rep.booked == 0
        access.downgrade(engine, "0002")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM events")).scalar() == 1
    finally:
        engine.dispose()


def test_hostile_rows_neither_crash_the_tick_nor_poison_the_budgets(engine, db_url, wd):
    """Rows any writer of the table contract may write: a NaN or negative cost, labels that are
    not a table, an ended run without ended_at, an unpriced step with negative tokens and a model
    name carrying control characters. The tick goes on; a real overspend still closes its day."""
    pg = engine.dialect.name == "postgresql"
    now = utcnow()
    bad_cost = float("nan") if pg else -5.0
    with constraints_off(engine) as conn:  # rows from before the store's checks (0007), or by hand
        for row in [
            dict(id="a" * 32, agent="bad-bot", status="running", kill_mode="cooperative", host="elsewhere",
                 cost_eur=bad_cost, labels=[1, 2], started_at=now, last_seen_at=now),
            dict(id="b" * 32, agent="bad-bot", status="completed", kill_mode="cooperative", host="elsewhere",
                 cost_eur=1e308, labels="str", started_at=now, last_seen_at=now, ended_at=None),
            dict(id="c" * 32, agent="bad-bot", status="running", kill_mode="cooperative", host="elsewhere",
                 cost_eur=0.0, started_at=now, last_seen_at=now, cost_unpriced_tokens=5),
        ]:
            conn.execute(insert(runs).values(**row))
        conn.execute(insert(events), [dict(run_id="c" * 32, seq=1, at=now, kind="step", model="evil\nmodel\x1b[2J",
                                           tokens_in=-5, tokens_out=10, cost_eur=None)])
    cfg = config(agents={"ok-bot": {"max_cost_eur_per_day": 1.0}, "bad-bot": {"max_cost_eur_per_day": 1.0}},
                 budgets=[{"labels": {"tenant": "acme"}, "max_cost_eur_per_day": 1.0}])
    tk = ticker(engine, cfg)
    with pytest.raises(RunKilled):
        with wd.run("ok-bot", guards=False) as ok:
            ok.step(model="gpt-x", cost_eur=1.5)
            rep = tk.tick(later(now, 1))
            assert rep.stops == [(ok.id, lc.DAILY_BUDGET)]
            ok.heartbeat()
    states = {(s.scope.name, s.period): s for s in tk.money.states}
    assert states[("bad-bot", "day")].spent_eur == 0.0 and not states[("bad-bot", "day")].closed
    (alert,) = money_alerts(engine, "unpriced:")
    assert "\n" not in alert.title and "\x1b" not in alert.title
    tk.tick(later(now, 40))  # the booking of the bad ended run: counted as 0, no crash
    with engine.connect() as conn:
        assert conn.execute(select(runs.c.booked_at).where(runs.c.id == "b" * 32)).scalar() is not None
        day = conn.execute(select(spend_ledger.c.cost_eur).where(spend_ledger.c.scope == "agent:bad-bot")
                           .where(spend_ledger.c.period == "day")).scalar()
    assert day == 0.0


def test_a_forged_budget_closed_row_is_rewritten_by_the_daemon(engine, wd):
    tk = ticker(engine, config())
    now = utcnow()
    tk.tick(now)
    forged = [{"scope": "agent", "name": "victim", "labels": None, "reason": "daily_budget",
               "until": "2999-01-01T00:00:00+00:00", "detail": "forged"}]
    with engine.begin() as conn:
        conn.execute(settings.update().where(settings.c.key == CLOSED_KEY).values(value=forged))
    with pytest.raises(RunKilled):  # the SDK honours what it reads...
        wd.run("victim")
    tk.tick(later(now, 60))  # ...until the daemon's next refresh of the row
    with wd.run("victim") as run:
        run.heartbeat()
