"""Child runs: budgets capped by what the parent has left, spend rolled up into the parent,
a child's breach stopping only the child, a parent's stop reaching its children.
Real agent processes and the real tick, on both backends."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from daemon_support import actions, alerts_of, interventions_of, run_row, ticker
from watchdog import RunKilled, Watchdog
from watchdog.cli import main
from watchdog.core import lifecycle as lc
from watchdog.store.schema import utcnow




def test_a_looping_child_is_stopped_alone_and_the_parent_pays_for_both_children(engine, db_url, procs):
    agent = procs.start("family", db_url, mode="loop", child_cost=0.2, parent_cost=0.1)
    ids = agent.info["run_ids"]
    tk = ticker(engine)
    rep = tk.tick(utcnow())
    assert rep.stops == [(ids["looper"], lc.LOOP_DETECTED)]
    assert agent.wait() == 0
    out = agent.result()
    assert out["looper"] == {"status": lc.KILLED, "reason": lc.LOOP_DETECTED}
    assert out["sibling"] == {"status": lc.COMPLETED, "reason": None}
    assert out["parent"]["status"] == lc.COMPLETED
    ids = json.loads((agent.ready_path.parent / (agent.ready_path.name + ".ids")).read_text())
    parent, looper, sibling = (run_row(engine, ids[k]) for k in ("parent", "looper", "sibling"))
    assert (looper.status, looper.stop_reason, looper.parent_id) == (lc.KILLED, lc.LOOP_DETECTED, parent.id)
    assert (sibling.status, sibling.parent_id) == (lc.COMPLETED, parent.id)
    assert (parent.status, parent.stop_reason, parent.parent_id) == (lc.COMPLETED, None, None)
    # The parent's row holds its own spend and both children's.
    assert parent.cost_eur == pytest.approx(0.1 + 0.2 + 2 * 0.2 + 0.1)
    assert parent.cost_eur == pytest.approx(0.2 + looper.cost_eur + sibling.cost_eur)
    assert parent.steps == 2 + looper.steps + sibling.steps
    assert parent.tool_calls == looper.tool_calls >= 4
    assert out["parent"]["cost_eur"] == pytest.approx(parent.cost_eur)  # the SDK's view agrees
    assert actions(engine, parent.id) == [] and actions(engine, sibling.id) == []
    # show PARENT lists the children with their outcome; --json has parent_id
    shown = CliRunner().invoke(main, ["--db", db_url, "show", parent.id[:8]])
    assert shown.exit_code == 0, shown.output
    assert f"{looper.id[:8]} researcher       killed (loop_detected)" in shown.output
    assert f"{sibling.id[:8]} writer           completed" in shown.output
    record = json.loads(CliRunner().invoke(main, ["--db", db_url, "show", looper.id, "--json"]).output)
    assert record["parent_id"] == parent.id
    listed = json.loads(CliRunner().invoke(main, ["--db", db_url, "runs", "--all", "--json"]).stdout)
    assert {r["id"]: r["parent_id"] for r in listed} == {parent.id: None, looper.id: parent.id,
                                                          sibling.id: parent.id}


def test_a_parent_over_budget_through_its_childrens_spend_stops_with_its_children(engine, db_url, procs):
    agent = procs.start("family", db_url, mode="overspend", budgets={"max_cost_eur": 1.0},
                        child_budgets={"max_cost_eur": 0.8}, child_cost=0.6, parent_cost=0.0)
    ids = agent.info["run_ids"]
    assert run_row(engine, ids["a"]).max_cost_eur == pytest.approx(0.8)  # its own, within the parent's 1.0 left
    rep = ticker(engine).tick(utcnow())
    assert rep.stops == [(ids["parent"], lc.MAX_COST)]  # each child is within its own 0.8
    assert agent.wait() == 0
    out = agent.result()
    assert out["parent"]["reason"] == lc.MAX_COST
    for kid in ("a", "b"):
        assert out[kid]["reason"] == lc.MAX_COST
        assert f"its parent run {ids['parent'][:8]}" in out[kid]["detail"]
        row = run_row(engine, ids[kid])
        assert (row.status, row.stop_reason) == (lc.KILLED, lc.MAX_COST)
        assert interventions_of(engine, ids[kid])[0].outcome == "stopped with its parent"
    parent = run_row(engine, ids["parent"])
    assert (parent.status, parent.cost_eur) == (lc.KILLED, pytest.approx(1.2))
    (alert,) = alerts_of(engine, ids["parent"])
    assert "child that spent most: " in alert.body and "0.6000 EUR, 1 steps" in alert.body


def test_a_child_never_gets_more_than_its_parent_has_left(engine, wd):
    with wd.run("planner", max_steps=6, max_cost_eur=1.0, max_tool_calls=10) as parent:
        for _ in range(4):
            parent.step(cost_eur=0.2)
        with parent.child("researcher", max_steps=5) as child:
            assert (child.budgets.max_steps, child.budgets.max_cost_eur) == (2, pytest.approx(0.2))
            assert child.budgets.max_tool_calls == 10
            row = run_row(engine, child.id)
            assert (row.max_steps, row.parent_id) == (2, parent.id)
            child.step(cost_eur=0.05)
            child.record_tool("search", {"q": 1})
            with child.child("reader") as grandchild:  # two levels: both ancestors pay
                assert grandchild.budgets.max_steps == 1
                grandchild.step(cost_eur=0.01)
        assert (parent.steps, parent.tool_calls) == (6, 1)
        assert run_row(engine, parent.id).steps == 6
        assert run_row(engine, child.id).steps == 2
        # Nothing left: opening a child is the parent's own breach (the in-process guard stops it).
        with pytest.raises(RunKilled) as stopped:
            parent.child("late")
        assert stopped.value.reason == lc.MAX_STEPS and "no steps left for a child run" in stopped.value.detail
    assert run_row(engine, parent.id).status == lc.KILLED
    with pytest.raises(ValueError, match="cooperatively"):
        with wd.run("planner") as p2:
            p2.child("x", kill_mode="process")


def test_a_stopped_parent_stops_its_children_in_the_same_process_at_their_next_record(engine, db_url, wd):
    with pytest.raises(RunKilled):
        with wd.run("planner") as parent:
            with pytest.raises(RunKilled) as seen:
                with parent.child("researcher") as child:
                    child.step()
                    res = CliRunner().invoke(main, ["--db", db_url, "kill", parent.id])
                    assert res.exit_code == 0, res.output
                    assert run_row(engine, child.id).status == lc.STOPPING  # marked with its parent
                    child.step()
            assert seen.value.reason == lc.MANUAL and f"parent run {parent.id[:8]}" in seen.value.detail
            assert child.cancelled.is_set()
            parent.heartbeat()
    assert run_row(engine, child.id).status == lc.KILLED
    assert run_row(engine, parent.id).status == lc.KILLED


def test_a_child_in_another_process_joins_by_parent_id(engine, db_url, wd):
    with wd.run("planner", max_steps=5) as parent:
        parent.step()
        other = Watchdog(db_url)  # another process's SDK: reads the lineage from the store
        try:
            with other.run("researcher", parent_id=parent.id, max_steps=10) as child:
                assert child.budgets.max_steps == 4 and child.parent_id == parent.id
                child.step(cost_eur=0.3)
            assert run_row(engine, parent.id).steps == 2
            assert run_row(engine, parent.id).cost_eur == pytest.approx(0.3)
            with pytest.raises(ValueError, match="no run"):
                other.run("researcher", parent_id="nosuchrun0000")
        finally:
            other.close()
    with pytest.raises(ValueError, match="already ended"):
        wd.run("researcher", parent_id=parent.id)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_stopping_a_parent_takes_the_locks_in_the_agents_order_no_deadlock(db_url, engine, wd):
    """An agent's record locks its own (child) run, then its parent (the roll-up). The daemon's
    stop of the parent takes the child first too, so it never holds the parent the agent needs
    (PostgreSQL would kill one of the two as a deadlock); and it waits for the agent's lock on
    the child only its bounded time (lock_timeout: an agent holding its row must not stall the
    tick), then gives up without having written anything. The next try, after the agent's
    commit, stops both."""
    import threading

    from sqlalchemy import select, text

    from watchdog.core.budgets import effective_budgets
    from watchdog.daemon.stops.stopping import facts, stop_run as request_stop
    from watchdog.store.engine import row_locked
    from watchdog.store.schema import runs

    def daemon_stops_the_parent(errors: list, done: threading.Event) -> None:
        try:
            with engine.begin() as conn:
                row = conn.execute(select(runs).where(runs.c.id == parent.id)).one()
                request_stop(conn, row, reason=lc.MAX_STEPS, detail="steps 13/12", now=utcnow(), by="test",
                             budgets=effective_budgets(wd.config().profile("planner"), row),
                             run_facts=facts(row, now=utcnow()))
        except Exception as exc:  # noqa: BLE001 — the assertion names it
            errors.append(exc)
        finally:
            done.set()

    with wd.run("planner", guards=False) as parent:
        with parent.child("researcher", guards=False) as child:
            agent = engine.connect()
            try:
                tx = agent.begin()
                agent.execute(text("UPDATE runs SET steps = steps + 1 WHERE id = :c"), {"c": child.id})  # its record
                done, errors = threading.Event(), []
                stopper = threading.Thread(target=daemon_stops_the_parent, args=(errors, done))
                stopper.start()
                assert done.wait(30)  # it gave up waiting for the agent's lock on the child (bounded)...
                stopper.join()
                assert len(errors) == 1 and row_locked(errors[0]), errors
                agent.execute(text("SET LOCAL lock_timeout = '20s'"))
                agent.execute(text("UPDATE runs SET steps = steps + 1 WHERE id = :p"), {"p": parent.id})  # roll-up
                tx.commit()  # ...and the agent's roll-up to the parent was never blocked by it
            finally:
                agent.close()
            assert {run_row(engine, r).status for r in (parent.id, child.id)} == {lc.RUNNING}  # nothing written
            done, errors = threading.Event(), []
            daemon_stops_the_parent(errors, done)  # the next tick's try
            assert errors == []
            assert {run_row(engine, r).status for r in (parent.id, child.id)} == {lc.STOPPING}
            with pytest.raises(RunKilled):
                child.step(cost_eur=0.0)
