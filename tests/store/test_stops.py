"""A run's stop in the store (watchdog.store.run_rows) and as the daemon composes it
(watchdog.daemon.stops.stopping), on both backends, against rows written with plain inserts."""

from __future__ import annotations

import datetime as dt
import os

from sqlalchemy import insert, select, update

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets
from watchdog.core.interventions import Action
from watchdog.core.seal import Sealer
from watchdog.daemon.stops import stopping
from watchdog.store import run_rows
from watchdog.store.schema import alerts, events, interventions, runs

T0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)
P, C, G, DONE = "p" * 32, "c" * 32, "g" * 32, "d" * 32
SEALER = Sealer(os.urandom(32), "h1")


def _run(conn, rid: str, *, status: str = lc.RUNNING, parent: str | None = None, **extra) -> None:
    conn.execute(insert(runs).values(id=rid, agent="bot", status=status, kill_mode="process", host="h1",
                                     started_at=T0, last_seen_at=T0, parent_id=parent, **extra))


def _family(engine) -> None:
    with engine.begin() as conn:
        _run(conn, P)
        _run(conn, C, parent=P)
        _run(conn, G, parent=C, status=lc.PAUSED)
        _run(conn, DONE, parent=P, status=lc.COMPLETED, ended_at=T0)


def _ivs(engine) -> list:
    with engine.connect() as conn:
        return [(r.run_id, r.action, r.outcome) for r in
                conn.execute(select(interventions).order_by(interventions.c.id))]


def _keys(engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(alerts.c.dedupe_key)).scalars())


def _status(engine, rid: str) -> str:
    with engine.connect() as conn:
        return conn.execute(select(runs.c.status).where(runs.c.id == rid)).scalar_one()


def test_request_stop_moves_the_run_and_records_it_and_nothing_else(engine):
    _family(engine)
    with engine.begin() as conn:
        iid = run_rows.request_stop(conn, P, reason=lc.MAX_STEPS, detail="steps 13/12", outcome="plan", now=T0, by="t")
        assert isinstance(iid, int)
        assert run_rows.request_stop(conn, P, reason=lc.MAX_STEPS, detail="again", outcome="plan", now=T0,
                                  by="t") is None  # already stopping
    assert _status(engine, P) == lc.STOPPING and _status(engine, C) == lc.RUNNING  # children: not its job
    assert _ivs(engine) == [(P, Action.STOP_REQUESTED, "plan")]
    assert _keys(engine) == []  # no alert: the daemon composes it


def test_stop_children_stops_the_active_descendants_with_the_parents_reason(engine):
    _family(engine)
    with engine.begin() as conn:
        parent = run_rows.run_row(conn, P)
        stopped = run_rows.stop_children(conn, parent, reason=lc.MAX_COST, detail="1.2/1.0 EUR", now=T0, by="t")
    assert sorted(child.id for child, _why in stopped) == [C, G]
    from watchdog.core.text import ident

    assert all(why.startswith(f"its parent run {ident(P)} («bot») was stopped: max_cost") for _c, why in stopped)
    assert [_status(engine, r) for r in (P, C, G, DONE)] == [lc.RUNNING, lc.STOPPING, lc.STOPPING, lc.COMPLETED]
    assert sorted(r for r, a, o in _ivs(engine) if a == Action.STOP_REQUESTED and o == "stopped with its parent") \
        == [C, G]


def test_a_parents_name_cannot_add_a_line_to_its_childrens_stop(engine):
    # The agent name is the parent writer's own text; the children's stop detail (and alert) quote
    # it on one line, so `bot)\nall clear` cannot forge a line of the daemon's alert.
    with engine.begin() as conn:
        _run(conn, P)
        _run(conn, C, parent=P)
        conn.execute(update(runs).where(runs.c.id == P).values(agent="bot)\nall clear: nothing was done"))
        parent = run_rows.run_row(conn, P)
        ((_child, why),) = run_rows.stop_children(conn, parent, reason=lc.MAX_COST, detail="d", now=T0, by="t")
    assert "\n" not in why and "all clear" in why


def test_mark_lost_ends_an_active_run_once(engine):
    _family(engine)
    with engine.begin() as conn:
        assert isinstance(run_rows.mark_lost(conn, G, detail="gone", now=T0, by="t"), int)
        assert run_rows.mark_lost(conn, G, detail="gone", now=T0, by="t") is None
        assert run_rows.mark_lost(conn, DONE, detail="gone", now=T0, by="t") is None
    with engine.connect() as conn:
        row = run_rows.run_row(conn, G)
    assert (row.status, row.stop_reason, row.stop_detail) == (lc.LOST, lc.PROCESS_GONE, "gone")
    assert _ivs(engine) == [(G, Action.LOST, "marked lost")]


def test_ended_since_and_top_tool(engine):
    with engine.begin() as conn:
        _run(conn, P, status=lc.KILLED, ended_at=T0, stop_reason="manual")
        _run(conn, C, status=lc.COMPLETED, ended_at=T0, stop_requested_at=T0)
        _run(conn, G, status=lc.LOST, ended_at=T0, stop_requested_at=T0)  # has its own alert
        _run(conn, DONE, status=lc.COMPLETED, ended_at=T0)  # no stop
        for seq, (tool, ok) in enumerate([("a", True), ("b", False), ("b", True), ("a", True), ("b", False)]):
            conn.execute(insert(events).values(run_id=P, seq=seq, at=T0, kind=lc.EV_TOOL, tool=tool, ok=ok))
    with engine.connect() as conn:
        assert [r.id for r in run_rows.ended_since(conn, T0, None)] == [C, P]
        assert run_rows.ended_since(conn, T0, frozenset({"h2"})) == []
        assert run_rows.ended_since(conn, T0 + dt.timedelta(seconds=1), None) == []
        assert run_rows.top_tool(conn, P) == run_rows.ToolCount("b", 3, 2)
        assert run_rows.top_tool(conn, C) is None


def test_the_ladders_stage_is_read_and_put_back(engine):
    with engine.begin() as conn:
        _run(conn, P, status=lc.STOPPING, signal_stage=lc.Stage.KILL, signalled_at=T0)
        run_rows.restore_stage(conn, P, lc.Stage.TERM, T0)
        assert run_rows.stage_of(conn, P) == run_rows.Stage(lc.Stage.TERM, T0)
        assert run_rows.stage_of(conn, "z" * 32) is None and run_rows.run_row(conn, "z" * 32) is None


def test_stop_run_alerts_the_run_and_each_child_once_sealed(engine):
    _family(engine)
    with engine.begin() as conn:
        row = run_rows.run_row(conn, P)
        ok = stopping.stop_run(conn, row, reason=lc.MAX_STEPS, detail="steps 13/12", now=T0, by="t",
                               budgets=Budgets(), run_facts=stopping.facts(row, now=T0), sealer=SEALER,
                               own_parent=lambda child: child.id != G)
        assert ok
        assert not stopping.stop_run(conn, row, reason=lc.MAX_STEPS, detail="x", now=T0, by="t", budgets=Budgets(),
                                     run_facts=stopping.facts(row, now=T0), sealer=SEALER)
    assert _keys(engine) == sorted(f"stop:{r}" for r in (P, C, G))
    with engine.connect() as conn:
        body = {r.dedupe_key: r.body for r in conn.execute(select(alerts))}
        macs = {r.dedupe_key: r.mac for r in conn.execute(select(alerts))}
    assert "not the daemon's own record" in body[f"stop:{G}"] and "not the daemon's own record" not in body[f"stop:{C}"]
    assert all(SEALER.alert_ok(macs[k], k, *_text(engine, k)) for k in macs)


def _text(engine, key):
    with engine.connect() as conn:
        r = conn.execute(select(alerts).where(alerts.c.dedupe_key == key)).one()
    return r.title, r.body, r.created_at


def test_without_a_sealer_a_stop_is_recorded_with_its_children_and_alerts_nothing(engine):
    _family(engine)
    with engine.begin() as conn:
        row = run_rows.run_row(conn, P)
        assert stopping.stop_run(conn, row, reason=lc.MANUAL, detail="by hand", now=T0, by="cli", budgets=Budgets(),
                                 run_facts=stopping.facts(row, now=T0), why="killed while paused for max_steps")
    assert [_status(engine, r) for r in (P, C, G)] == [lc.STOPPING] * 3
    assert _ivs(engine)[0] == (P, Action.STOP_REQUESTED, "killed while paused for max_steps; "
                               + stopping.stop_plan("process"))
    assert _keys(engine) == []


def test_a_run_lost_and_the_unreadable_ones(engine):
    _family(engine)
    with engine.begin() as conn:
        row = run_rows.run_row(conn, P)
        assert stopping.lose_run(conn, row, detail="gone", now=T0, by="t", budgets=Budgets(),
                                 run_facts=stopping.facts(row, now=T0), sealer=SEALER)
        assert stopping.stop_unreadable(conn, C, reason=lc.WALL_CLOCK, detail="d", outcome="o", now=T0, by="t",
                                        sealer=SEALER)
        assert stopping.lose_unreadable(conn, G, pid=4242, host="h", now=T0, by="t", sealer=SEALER)
        assert not stopping.lose_unreadable(conn, DONE, pid=4242, host="h", now=T0, by="t", sealer=SEALER)
    assert _keys(engine) == sorted([f"lost:{P}", f"stop:{C}", f"lost:{G}"])
    assert [_status(engine, r) for r in (P, C, G)] == [lc.LOST, lc.STOPPING, lc.LOST]
    assert (G, Action.LOST, "marked lost (its row could not be read whole)") in _ivs(engine)
