"""A witnessed step written with a cost (a coding CLI's claim the daemon took: a model no price
table knows) adds to its run's cost, and its tokens are not unpriced; a cost that is not a finite
amount >= 0 leaves the step unpriced (the backfill's), never lowering the run's cost."""

from __future__ import annotations

import math

from sqlalchemy import select

from watchdog.core import lifecycle as lc
from watchdog.store import witness
from watchdog.store.schema import events, runs


def step(cost: object) -> witness.WitnessedCall:
    return witness.WitnessedCall(kind=lc.EV_STEP, model="m-unknown", tokens_in=100, tokens_out=20,
                                 cost_eur=cost)  # type: ignore[arg-type]


def test_a_step_written_with_a_cost_adds_to_its_run_and_hostile_costs_are_unpriced(engine):
    with engine.begin() as conn:
        now = witness.store_now(conn)
        witness.create_run(conn, run_id="w" * 32, agent="bot", source=lc.Source.OTLP, host="h",
                           kill_mode=lc.KillMode.COOPERATIVE, labels=None, now=now)
        assert witness.append(conn, "w" * 32, [step(0.002), step(0.001)], source=lc.Source.OTLP, now=now)
        assert witness.append(conn, "w" * 32, [step(-1.0), step(math.nan), step(math.inf), step("0.5"),
                                              step(True), step(None)], source=lc.Source.OTLP, now=now)
        assert witness.append(conn, "w" * 32, [step(1e308)], source=lc.Source.OTLP, now=now)
    with engine.connect() as conn:
        run = conn.execute(select(runs.c.cost_eur, runs.c.cost_unpriced_tokens, runs.c.steps)
                           .where(runs.c.id == "w" * 32)).one()
        costs = conn.execute(select(events.c.cost_eur).where(events.c.run_id == "w" * 32)
                             .order_by(events.c.seq)).scalars().all()
    assert costs == [0.002, 0.001, None, None, None, None, None, None, witness.MAX_STEP_COST_EUR]
    assert run.steps == 9 and run.cost_unpriced_tokens == 6 * 120
    assert math.isclose(run.cost_eur, 0.003 + witness.MAX_STEP_COST_EUR)
