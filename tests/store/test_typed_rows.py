"""Rows cross into the CLI, the web view and the demo as typed rows (watchdog.store.rows), read
the same on both backends: every column of the SQLAlchemy row, the budget columns through the
registry, and the budgets a run is held to exactly as before."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import RUN_BUDGET_KEYS, effective_budgets
from watchdog.core.config import load
from watchdog.core.periods import utcnow
from watchdog.store import viewer, views
from watchdog.store.engine import read_connection
from watchdog.store.rows import AlertRow, EventRow, InterventionRow, RunRow
from watchdog.store.schema import runs


def _run(wd, **budgets):
    with wd.run(agent="bot", guards=False, **budgets) as run:
        run.step(model="m", tokens_in=3, tokens_out=2, cost_eur=0.01)
        run.record_tool("search", {"q": 1}, ok=True)
        run.record_tool("search", {"q": 1}, ok=False, error=TimeoutError("slow"))
    return run.id


def test_a_run_row_holds_every_column_and_reads_its_budgets_from_the_registry(wd, engine):
    rid = _run(wd, max_steps=5, max_cost_eur=0.5)
    with engine.connect() as conn:
        raw = conn.execute(select(runs).where(runs.c.id == rid)).one()
        row = views.load_run(conn, rid)
    assert isinstance(row, RunRow)
    for column in runs.c.keys():
        assert getattr(row, column) == getattr(raw, column), column
    assert {k: getattr(row, k) for k in RUN_BUDGET_KEYS} == {k: getattr(raw, k) for k in RUN_BUDGET_KEYS}
    assert (row.max_steps, row.max_cost_eur, row.max_tool_calls) == (5, 0.5, None)
    assert row.started_at.tzinfo is not None and (row.steps, row.tool_calls, row.tool_errors) == (1, 2, 1)
    config = load(None)
    assert effective_budgets(config.profile("bot"), row) == effective_budgets(config.profile("bot"), raw)
    assert effective_budgets(config.profile("bot"), row).max_steps == 5


def test_postmortem_facts_and_the_demos_reads_are_typed(wd, engine):
    rid = _run(wd)
    now = utcnow()
    with read_connection(engine) as conn:
        facts = viewer.postmortem_facts(conn, rid, now)
        active = viewer.active_runs(conn)
        per_min = viewer.tool_calls_since(conn, [rid], now - dt.timedelta(minutes=1))
    assert isinstance(facts.row, RunRow) and facts.row.status == lc.COMPLETED
    assert [type(e) for e in facts.events] == [EventRow] * 3
    assert [(e.kind, e.tool, e.ok) for e in facts.events] == [(lc.EV_STEP, None, None), (lc.EV_TOOL, "search", True),
                                                              (lc.EV_TOOL, "search", False)]
    assert all(isinstance(i, InterventionRow) for i in facts.interventions + facts.circuit)
    assert all(isinstance(a, AlertRow) for a in facts.alerts)
    assert active == [] and per_min == {rid: 2}
    news = viewer.news(engine, [rid], interventions_after=0, alerts_after=0)
    assert list(news.runs) == [rid] and isinstance(news.runs[rid], RunRow)
    ending = viewer.ending(engine, [rid])
    assert [(t.name, t.calls, t.errors) for t in ending.tools[rid]] == [("search", 2, 1)]
    assert viewer.untried_alerts(engine) == 0
