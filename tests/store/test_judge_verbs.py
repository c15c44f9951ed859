"""The store verbs of the daemon's circuits, stop ladder, scan, backfill and quarantine
(watchdog.store.circuits, ladder, scan, backfill, quarantine, alerts, attestations), on
both backends, for real: each verb against rows written here with plain inserts, as any writer
of the table contract could."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import insert, select

from watchdog.core import lifecycle as lc
from watchdog.core.lifecycle import Circuit, IllegalCircuitMove, IllegalStageMove
from watchdog.daemon.trust.scan import read_isolated
from watchdog.store import (alerts as sealed_alerts, attestations, event_rows, circuits, ladder, alerts as quarantine,
                            scan)
from watchdog.store.schema import alerts, circuit_probes, events, interventions, runs, tool_circuits

T0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)


def _run(conn, rid: str, *, status: str = lc.RUNNING, host: str = "h1", **extra) -> None:
    conn.execute(insert(runs).values(id=rid, agent="bot", status=status, kill_mode="process", host=host,
                                     started_at=T0, last_seen_at=T0, **extra))


def _event(conn, rid: str, seq: int, *, at: dt.datetime = T0, kind: str = lc.EV_TOOL, **extra) -> int:
    return conn.execute(insert(events).values(run_id=rid, seq=seq, at=at, kind=kind, **extra)
                        .returning(events.c.id)).scalar_one()


def _failures(conn, tool: str, n: int, *, rid: str = "r" * 32) -> None:
    for i in range(n):
        _event(conn, rid, 100 + i, at=T0 + dt.timedelta(seconds=i), tool=tool, ok=False,
               error_class="TimeoutError", error_msg="timed out")


# --- circuits -------------------------------------------------------------------


def test_error_window_counts_the_tools_errors_after_since_and_names_the_most_common(engine):
    with engine.begin() as conn:
        _run(conn, "r" * 32)
        _run(conn, "s" * 32)
        _failures(conn, "search", 3)
        _event(conn, "s" * 32, 1, at=T0 + dt.timedelta(seconds=5), tool="search", ok=False, error_class="KeyError",
               error_msg="k")
        _event(conn, "s" * 32, 2, at=T0 + dt.timedelta(seconds=6), tool="search", ok=False,
               error_class=circuits.REFUSAL_CLASS, error_msg="refused")  # a fail-fast refusal: not the tool's
        _event(conn, "s" * 32, 3, at=T0 + dt.timedelta(seconds=7), tool="search", ok=True)
        _event(conn, "s" * 32, 4, at=T0 + dt.timedelta(seconds=8), tool="fetch", ok=False, error_class="E")
    with engine.connect() as conn:
        w = circuits.error_window(conn, "search", T0 - dt.timedelta(seconds=1))
        assert (w.errors, w.runs) == (4, 2)
        assert w.common == circuits.CommonError("TimeoutError", "timed out")
        later = circuits.error_window(conn, "search", T0 + dt.timedelta(seconds=2))
        assert (later.errors, later.runs) == (1, 1)
        assert circuits.error_window(conn, "nothing", T0) == circuits.ErrorWindow(0, 0, None)


def test_a_circuit_goes_open_half_open_closed_through_its_verbs(engine):
    until = T0 + dt.timedelta(seconds=120)
    with engine.begin() as conn:
        assert circuits.open_circuit(conn, "search", None, now=T0, until=until, errors=5, window_s=60.0,
                                     last_error="timed out", last_error_class="TimeoutError")
    with engine.begin() as conn:
        row = circuits.circuit(conn, "search")
        assert row is not None and (row.state, row.open_until, row.errors_in_window) == (Circuit.OPEN, until, 5)
        assert [c.tool for c in circuits.all_circuits(conn)] == ["search"]
        # Opening it again from closed fails: it is not closed (the compare-and-set).
        assert not circuits.open_circuit(conn, "search", Circuit.CLOSED, now=T0, until=until, errors=5,
                                         window_s=60.0, last_error=None, last_error_class=None)
        assert circuits.half_open(conn, "search", until)
        assert not circuits.half_open(conn, "search", until)  # once
        assert circuits.circuit(conn, "search").state == Circuit.HALF_OPEN
        circuits.close(conn, "search", Circuit.HALF_OPEN, until)
        row = circuits.circuit(conn, "search")
        assert (row.state, row.open_until, row.errors_in_window) == (Circuit.CLOSED, None, 0)
        assert circuits.circuit(conn, "other") is None


def test_a_probe_claim_is_mirrored_judged_and_freed(engine):
    until = T0 + dt.timedelta(seconds=120)
    rid = "p" * 32
    with engine.begin() as conn:
        _run(conn, rid)
        circuits.open_circuit(conn, "search", None, now=T0, until=until, errors=5, window_s=60.0, last_error=None,
                              last_error_class=None)
        assert circuits.probe_claim(conn, "search", T0) is None
        conn.execute(insert(circuit_probes).values(tool="search", opened_at=T0, run_id=rid, claimed_at=until))
        claim = circuits.probe_claim(conn, "search", T0)
        assert claim == circuits.ProbeClaim(rid, until)
        assert circuits.probe_claim(conn, "search", until) is None  # another open period's claim: none
        circuits.mirror_claim(conn, "search", Circuit.OPEN, claim, until)
        row = circuits.circuit(conn, "search")
        assert (row.state, row.probe_run_id, row.probe_at) == (Circuit.HALF_OPEN, rid, until)
        assert circuits.probe_result(conn, "search", claim) is None
        _event(conn, rid, 1, at=until - dt.timedelta(seconds=1), tool="search", ok=True)  # before the claim
        _event(conn, rid, 2, at=until, tool="search", ok=False, error_class=circuits.REFUSAL_CLASS)
        assert circuits.probe_result(conn, "search", claim) is None
        _event(conn, rid, 3, at=until, tool="search", ok=False, error_class="KeyError", error_msg="k")
        _event(conn, rid, 4, at=until, tool="search", ok=True)
        assert circuits.probe_result(conn, "search", claim) == circuits.ProbeResult(False, "KeyError", "k")
        circuits.free_probe(conn, "search", until)
        row = circuits.circuit(conn, "search")
        assert (row.state, row.probe_run_id) == (Circuit.HALF_OPEN, None)
        assert conn.execute(select(circuit_probes)).first() is None
        conn.execute(insert(circuit_probes).values(tool="search", opened_at=T0, run_id=rid, claimed_at=until))
        later = until + dt.timedelta(seconds=1)
        circuits.reopen(conn, "search", Circuit.HALF_OPEN, now=later, until=later + dt.timedelta(seconds=120),
                        last_error="k", last_error_class="KeyError")
        row = circuits.circuit(conn, "search")
        assert (row.state, row.opened_at, row.last_error_class) == (Circuit.OPEN, later, "KeyError")
        assert conn.execute(select(circuit_probes)).first() is None  # the old period's claims are gone


def test_a_circuit_move_the_table_does_not_list_is_refused_before_anything_is_written(engine):
    with engine.begin() as conn:
        with pytest.raises(IllegalCircuitMove):
            circuits.close(conn, "search", Circuit.CLOSED, T0)
        with pytest.raises(IllegalCircuitMove):
            circuits.open_circuit(conn, "search", Circuit.OPEN, now=T0, until=T0, errors=1, window_s=1.0,
                                  last_error=None, last_error_class=None)
        with pytest.raises(IllegalCircuitMove):
            circuits.reopen(conn, "search", Circuit.OPEN, now=T0, until=T0, last_error=None,
                            last_error_class=None)
        with pytest.raises(IllegalCircuitMove):
            circuits.mirror_claim(conn, "search", Circuit.CLOSED, circuits.ProbeClaim("x" * 32, T0), T0)
        assert conn.execute(select(tool_circuits)).first() is None


# --- the stop ladder --------------------------------------------------------------


def test_a_stage_is_a_compare_and_set_on_a_stopping_run(engine):
    rid = "l" * 32
    with engine.begin() as conn:
        _run(conn, rid, status=lc.STOPPING)
        _run(conn, "m" * 32)  # running: the ladder never moves it
        assert ladder.set_stage(conn, rid, None, lc.Stage.TERM, signalled_at=T0)
        assert not ladder.set_stage(conn, rid, None, lc.Stage.TERM, signalled_at=T0)  # not at None any more
        assert not ladder.set_stage(conn, "m" * 32, None, lc.Stage.TERM, signalled_at=T0)
        assert ladder.set_stage(conn, rid, lc.Stage.TERM, lc.Stage.KILL, signalled_at=T0 + dt.timedelta(seconds=5))
        assert ladder.finish(conn, rid, lc.Stage.KILL, T0 + dt.timedelta(seconds=6))
        row = conn.execute(select(runs).where(runs.c.id == rid)).one()
        assert (row.status, row.signal_stage, row.ended_at) == (lc.KILLED, lc.Stage.DONE,
                                                                T0 + dt.timedelta(seconds=6))
        with pytest.raises(IllegalStageMove):
            ladder.set_stage(conn, rid, lc.Stage.DONE, lc.Stage.TERM, signalled_at=T0)


def test_sigterm_details_are_the_runs_sigterm_rows_newest_first(engine):
    rid = "l" * 32
    with engine.begin() as conn:
        _run(conn, rid, status=lc.STOPPING)
        for detail, action in (("first", "sigterm"), ("other", "sigkill"), ("second", "sigterm")):
            conn.execute(insert(interventions).values(at=T0, action=action, actor="test", run_id=rid, detail=detail))
        assert ladder.sigterm_details(conn, rid) == ["second", "first"]
        assert ladder.sigterm_details(conn, "n" * 32) == []


# --- scan ------------------------------------------------------------------------


def test_the_light_read_returns_active_runs_by_position_with_integer_tokens_only(engine):
    with engine.begin() as conn:
        _run(conn, "a" * 32, tokens_in=3, tokens_out=4, steps=2)
        _run(conn, "b" * 32, host="h2")
        _run(conn, "c" * 32, status=lc.COMPLETED)
    with engine.connect() as conn:
        light = {r[scan.L["id"]]: r for r in scan.active_light(conn)}
        assert set(light) == {"a" * 32, "b" * 32}
        a = light["a" * 32]
        assert len(a) == len(scan.LIGHT)
        assert (a[scan.L["tokens"]], a[scan.L["steps"]], a[scan.L["host"]]) == (7, 2, "h1")
        assert a[scan.L["started_s"]] == pytest.approx(T0.timestamp())
        assert [r[0] for r in scan.active_light(conn, {"h2"})] == ["b" * 32]
        rows = scan.active_rows(conn, ["a" * 32, "c" * 32], isolated=read_isolated, defects=[], suspects={})
        assert [r.id for r in rows] == ["a" * 32]


def test_the_event_reads_select_the_folded_events_in_id_order(engine):
    with engine.begin() as conn:
        _run(conn, "a" * 32)
        _run(conn, "b" * 32, host="h2")
        ids = [_event(conn, "a" * 32, 1, tool="t", ok=True), _event(conn, "a" * 32, 2, kind=lc.EV_HEARTBEAT),
               _event(conn, "b" * 32, 1, kind=lc.EV_STEP, tokens_in=5), _event(conn, "a" * 32, 3, tool="t")]
    with engine.connect() as conn:
        assert scan.newest_event_id(conn) == ids[-1]
        assert scan.folded_ids_between(conn, 0, ids[2]) == [ids[0], ids[2]]
        assert scan.folded_ids_between(conn, 0, ids[3], {"h1"}) == [ids[0], ids[3]]
        assert scan.folded_sum_between(conn, 0, ids[2])[:2] == (2, ids[0] + ids[2])
        assert scan.folded_sum_between(conn, 0, ids[3], {"h2"})[:2] == (1, ids[2])
        window = scan.folded_sum_between(conn, ids[3], ids[3] + 10)
        assert window[:2] == (0, 0)
        if engine.dialect.name == "postgresql":  # the oldest in flight; above every id given so far
            assert window.xmin is not None and window.xid_bound is not None and 0 < window.xmin <= window.xid_bound
        else:
            assert (window.xmin, window.xid_bound) == (None, None)

        def read(sel):
            found, unreadable = scan.read_events(conn, sel, isolated=read_isolated, defects=[])
            assert unreadable == []
            return found

        assert [e.id for e in read(scan.EventSelection.of_runs(["a" * 32]))] == [ids[0], ids[3]]
        assert [e.id for e in read(scan.EventSelection.folded_above(ids[0]))] == [ids[2], ids[3]]
        assert [e.id for e in read(scan.EventSelection.folded_above(ids[0], {"h2"}))] == [ids[2]]
        (step,) = read(scan.EventSelection.by_ids([ids[2]]))
        assert (step.run_id, step.kind, step.tokens_in) == ("b" * 32, lc.EV_STEP, 5)


def test_an_empty_store_has_no_newest_event(engine):
    with engine.connect() as conn:
        assert scan.newest_event_id(conn) is None


# --- backfill ----------------------------------------------------------------------


def test_unpriced_steps_are_read_then_priced_once_and_moved_onto_the_run(engine):
    with engine.begin() as conn:
        _run(conn, "a" * 32, cost_unpriced_tokens=30, cost_eur=1.0)
        _run(conn, "b" * 32, cost_unpriced_tokens=0)
        e1 = _event(conn, "a" * 32, 1, kind=lc.EV_STEP, model="m", tokens_in=10, tokens_out=20)
        _event(conn, "a" * 32, 2, kind=lc.EV_STEP, model="m", tokens_in=1, cost_eur=0.5)  # priced already
        e3 = _event(conn, "b" * 32, 1, kind=lc.EV_STEP, model="m", tokens_in=1)
    with engine.connect() as conn:
        assert event_rows.unbooked_unpriced_runs(conn) == ["a" * 32]
        kw = dict(isolated=read_isolated, defects=[], suspects={})
        found = event_rows.unpriced_steps(conn, run_ids=["a" * 32], **kw)
        assert [(s.id, s.agent, s.model, s.tokens_in) for s in found] == [(e1, "bot", "m", 10)]
        assert [s.id for s in event_rows.unpriced_steps(conn, above=e1, **kw)] == [e3]
    with engine.begin() as conn:
        assert event_rows.price_step(conn, e1, 0.25)
        assert not event_rows.price_step(conn, e1, 0.25)  # priced once
        event_rows.add_run_cost(conn, "a" * 32, 0.25, 40)
        row = conn.execute(select(runs.c.cost_eur, runs.c.cost_unpriced_tokens).where(runs.c.id == "a" * 32)).one()
        assert tuple(row) == (1.25, 0)  # never below 0


# --- quarantine, alerts read by key, attestation's run -----------------------------


def test_quarantine_reads(engine):
    with engine.begin() as conn:
        _run(conn, "a" * 32)
        conn.execute(insert(interventions).values(at=T0, action="quarantined", actor="t", run_id="a" * 32,
                                                  reason="malformed_row"))
    with engine.connect() as conn:
        assert quarantine.run_exists(conn, "a" * 32) and not quarantine.run_exists(conn, "z" * 32)
        assert quarantine.recorded(conn, "a" * 32, action="quarantined", reason="malformed_row")
        assert not quarantine.recorded(conn, "a" * 32, action="quarantined", reason="malformed_event")


def test_an_alert_is_read_by_its_dedupe_key(engine):
    with engine.begin() as conn:
        conn.execute(insert(alerts).values(dedupe_key="k" * 255, title="t", body="b", created_at=T0, attempts=0,
                                           delivered_targets=[], mac="m"))
    with engine.connect() as conn:
        assert sealed_alerts.queued_at(conn, "k" * 300) == T0  # cut as the column stores it
        assert sealed_alerts.queued_at(conn, "other") is None
        assert sealed_alerts.by_key(conn, "k" * 255) == sealed_alerts.SealedAlert("k" * 255, "t", "b", "m", T0)
        assert sealed_alerts.by_key(conn, "other") is None


def test_the_registered_run_an_attestation_is_checked_against(engine):
    with engine.begin() as conn:
        _run(conn, "a" * 32, pid=42, pid_create_time=1.5, max_steps=7)
    with engine.connect() as conn:
        r = attestations.registered(conn, "a" * 32)
        assert r is not None and (r.host, r.pid, r.pid_create_time, r.kill_mode, r.status) == (
            "h1", 42, 1.5, "process", lc.RUNNING)
        assert r.budgets["max_steps"] == 7 and set(r.budgets) >= {"max_steps", "max_cost_eur"}
        assert attestations.registered(conn, "z" * 32) is None


def test_closing_by_hand_closes_a_circuit_whose_state_was_written_by_hand(engine):
    from watchdog.core.config import Config
    from watchdog.daemon.stops.circuits import CircuitBreakers

    with engine.begin() as conn:
        conn.execute(insert(tool_circuits).values(tool="search", state="bogus", errors_in_window=1, updated_at=T0))
    assert CircuitBreakers(Config(), by="test").close(engine, "search", T0, "test")
    with engine.connect() as conn:
        assert circuits.circuit(conn, "search").state == Circuit.CLOSED
