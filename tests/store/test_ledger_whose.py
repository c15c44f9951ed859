"""issue 32, the ledger's side, on both backends: the ended runs of an agent whose profile names
its owners are read one by one and summed, then booked, under the name Trust gives each (its
agent's, or its own owner's: then no label budget), never by the agent name they carry."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import insert, select

from watchdog.core import lifecycle as lc
from watchdog.core.config import parse
from watchdog.core.periods import DAY, MONTH, PERIODS, period_bounds, period_key
from watchdog.store import ledger
from watchdog.store.schema import runs, spend_ledger

ACME = {"tenant": "acme"}
UTC = dt.timezone.utc


def _ended(conn, agent: str, cost: float, now: dt.datetime, source: str = "sql") -> str:
    rid = uuid.uuid4().hex
    conn.execute(insert(runs).values(id=rid, agent=agent, status=lc.COMPLETED, kill_mode="cooperative", host="h",
                                     started_at=now, last_seen_at=now, ended_at=now, cost_eur=cost, labels=ACME,
                                     source=source))
    return rid


def test_a_refused_ended_run_is_summed_and_booked_under_its_owner_not_its_agent(engine):
    now = dt.datetime.now(UTC).replace(microsecond=0)
    label_budgets = tuple(parse({"budgets": [{"labels": ACME, "max_cost_eur_per_day": 100.0}]}).budgets)
    with engine.begin() as conn:
        mine = _ended(conn, "bot", 3.0, now)
        _ended(conn, "bot", 4300.0, now, source="otlp")  # as the receiver writes another sender's run
        _ended(conn, "other", 7.0, now)
    asked: list[tuple[str, object]] = []

    def spend_as(rid, agent, owner, source):  # as Trust.spend_as_row: an agent without owners is its own
        if agent != "bot":
            return agent
        asked.append((agent, source))
        return agent if rid == mine else "(owner mallory)"

    keys = {p: period_key(p, now, UTC) for p in PERIODS}
    with engine.connect() as conn:
        _spend, unbooked, n, _labels = ledger.read_period_spend(
            conn, keys, period_bounds(DAY, now, UTC)[0], period_bounds(MONTH, now, UTC)[0], (), ["bot"], spend_as)
    assert n == 3 and sorted(asked) == [("bot", "otlp"), ("bot", "sql")]  # only the bound agent's, one by one
    assert sorted((a, c) for a, _l, c, _m in unbooked) == [("(owner mallory)", 4300.0), ("bot", 3.0), ("other", 7.0)]
    assert [labels for a, labels, _c, _m in unbooked if a == "(owner mallory)"] == [None]  # no label budget
    with engine.begin() as conn:
        rows = ledger.read_unbooked(conn)
        booked = ledger.book(conn, rows, now, UTC, label_budgets,
                             lambda r: spend_as(r.id, r.agent, r.owner, r.source))
    assert len(booked.booked) == 3 and sorted(asked[2:]) == [("bot", "otlp"), ("bot", "sql")]
    with engine.connect() as conn:
        day = {r.scope: r.cost_eur for r in conn.execute(select(spend_ledger).where(spend_ledger.c.period == DAY))}
    assert day["agent:bot"] == 3.0 and day["agent:(owner mallory)"] == 4300.0 and day["agent:other"] == 7.0
    assert day[label_budgets[0].scope] == 10.0  # bot's 3 + other's 7: not the refused run's 4,300
