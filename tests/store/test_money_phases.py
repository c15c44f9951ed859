"""Money in phases (watchdog.daemon.money.moneytick) and the tick's own reads (watchdog.store.run_rows),
on both backends, for real: runs written with plain inserts, as any writer of the table contract
could, then one tick's money work step by step, and each step refused out of its order."""

from __future__ import annotations

import datetime as dt
import os

import pytest
from sqlalchemy import insert

from watchdog.core import lifecycle as lc
from watchdog.core.config import parse
from watchdog.core.periods import CLOSED_KEY
from watchdog.core.seal import Sealer
from watchdog.daemon.money.money import Money
from watchdog.daemon.money.moneytick import MoneyOrderError, Phase
from watchdog.daemon.tick.prefilter import PreFilter
from watchdog.daemon.trust.scan import Scanner
from watchdog.store import run_rows, settings
from watchdog.store.alerts import stop_intervention
from watchdog.store.engine import read_connection
from watchdog.store.schema import alerts, interventions, runs

ACME = {"tenant": "acme"}


def _run(conn, rid: str, *, cost: float, labels, now: dt.datetime, agent: str = "bot") -> None:
    conn.execute(insert(runs).values(id=rid, agent=agent, status=lc.RUNNING, kill_mode="cooperative", host="h1",
                                     started_at=now, last_seen_at=now, cost_eur=cost, labels=labels))


def _config():
    return parse({"budgets": [{"labels": ACME, "max_cost_eur_per_day": 1.0}]})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def test_one_tick_of_money_in_its_order(engine):
    now = _now()
    a, b, g = "a" * 32, "b" * 32, "g" * 32
    with engine.begin() as conn:
        _run(conn, a, cost=0.7, labels=ACME, now=now)
        _run(conn, b, cost=0.6, labels=ACME, now=now)
        _run(conn, g, cost=0.9, labels={"tenant": "globex"}, now=now)
    cfg = _config()
    money = Money(cfg, "test", sealer=Sealer(os.urandom(32), "h1"))  # without the key no alert is queued
    mt = money.begin(now)
    scanner = Scanner()
    with read_connection(engine) as conn:
        light = scanner.load_active(conn)
        # The pre-filter's one pass sums the live spend; the runs' labels are new to it.
        due = PreFilter(cfg).due(light, now, None, mt.spend, stats={}, host="h1", judged=None, resume_seen=set(),
                                 skip_clock=False, defects=[])
        assert sorted(rid for rid, _cost in mt.spend.new) == [a, b, g]
        assert mt.read(conn, scanner.high_water) == []
        assert mt.phase is Phase.READ
    with pytest.raises(MoneyOrderError):  # read once per tick
        mt.read(None, None)
    judged = mt.judge(engine, light, due)
    closed = [s for s in judged.periods if s.closed]
    assert [(s.scope.name, s.period) for s in closed] == [("tenant=acme", "day")]
    assert abs(closed[0].spent_eur - 1.3) < 1e-9
    # The running runs the spent budget covers are judged this tick; the globex run is not.
    assert judged.again == {a, b}
    assert mt.closing(a, "bot") is closed[0] and mt.closing(g, "bot") is None
    with engine.connect() as conn:  # published before the tick stops the runs it covers
        assert [e["name"] for e in settings.get(conn, CLOSED_KEY)] == ["tenant=acme"]
    assert mt.finish(engine, {closed[0].scope.key: [a]}) == 0  # nothing ended: nothing booked
    with engine.connect() as conn:
        keys = [k for (k,) in conn.execute(alerts.select().with_only_columns(alerts.c.dedupe_key))]
    assert [k for k in keys if k.startswith("budget-closed:")] == [f"budget-closed:{closed[0].scope.key}:day:"
                                                                    f"{closed[0].key}"]
    for late in (lambda: mt.finish(engine, {}), lambda: mt.judge(engine, light, due), lambda: mt.closing(a, "bot")):
        with pytest.raises(MoneyOrderError):
            late()
    # The next tick starts over, with what Money learned: the runs' labels are known now.
    again = money.begin(now + dt.timedelta(seconds=5))
    PreFilter(cfg).due(light, now, None, again.spend, stats={}, host="h1", judged=None, resume_seen=set(),
                       skip_clock=False, defects=[])
    assert again.spend.new == [] and abs(again.spend.labelled[closed[0].scope.key] - 1.3) < 1e-9


def test_labels_of_reads_many_runs_and_tells_a_non_table_apart(engine):
    now = _now()
    ids = [f"{i:032d}" for i in range(run_rows.CHUNK + 3)]  # more than one IN (...) chunk
    with engine.begin() as conn:
        for i, rid in enumerate(ids):
            _run(conn, rid, cost=0.0, labels=ACME if i % 2 else [1, 2], now=now)
        _run(conn, "n" * 32, cost=0.0, labels=None, now=now)
    with engine.connect() as conn:
        got = {r.run_id: r.labels for r in run_rows.labels_of(conn, [*ids, "n" * 32, "missing"])}
    assert len(got) == len(ids) + 1
    assert got[ids[1]] == ACME and got[ids[0]] is None and got["n" * 32] is None


def test_stop_alert_and_stop_intervention(engine):
    now = _now()
    rid, other = "s" * 32, "t" * 32
    with engine.begin() as conn:
        _run(conn, rid, cost=0.0, labels=None, now=now)
        _run(conn, other, cost=0.0, labels=None, now=now)
        assert run_rows.stop_alert(conn, rid) is None and stop_intervention(conn, rid) is None
        iid = conn.execute(insert(interventions).values(at=now, run_id=rid, action="stop_requested", reason="manual")
                           .returning(interventions.c.id)).scalar_one()
        conn.execute(insert(interventions).values(at=now, run_id=other, action="pause_requested"))
        conn.execute(insert(alerts).values(dedupe_key=f"stop:{rid}", created_at=now, run_id=rid, title="t",
                                           body="b", mac="m" * 64))
    with engine.connect() as conn:
        assert stop_intervention(conn, rid) == iid
        assert stop_intervention(conn, other) is None
        a = run_rows.stop_alert(conn, rid)
        assert a is not None and (a.dedupe_key, a.title, a.body, a.mac) == (f"stop:{rid}", "t", "b", "m" * 64)
        assert a.created_at is not None and abs((a.created_at - now).total_seconds()) < 1
        assert run_rows.stop_alert(conn, other) is None
