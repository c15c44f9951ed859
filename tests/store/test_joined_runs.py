"""watchdog.sdk.joined: a run another writer owns, as a gateway (the MCP proxy, the LiteLLM callback)
witnesses it — read, judged by the larger of the gateway's count and the run's, appended to, never
written — against real stores (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from watchdog import RunKilled, Watchdog
from watchdog.core import lifecycle as lc
from watchdog.sdk.joined import JoinedRuns
from watchdog.store.joined import WITNESS_SEQ_BASE
from watchdog.store.schema import events, runs


@pytest.fixture
def owner_and_witness(db_url):
    owner = Watchdog(db_url, attest_socket="")
    witness = Watchdog(db_url, attest_socket="")
    yield owner, witness
    witness.close()
    owner.close()


def test_the_guard_is_raised_to_the_runs_counters_never_summed_and_holds_its_budgets(owner_and_witness):
    owner, witness = owner_and_witness
    with owner.run("researcher", max_tool_calls=3, guards=False) as run:
        run.step(model=None, tokens_in=10, tokens_out=5, cost_eur=0.25)
        for i in range(2):
            run.record_tool("search", {"q": i})
        runs_seen = JoinedRuns(witness, lc.Source.MCP)
        assert runs_seen.known(run.id) is None and runs_seen.known(None) is None
        state = runs_seen.state(run.id)
        assert state is not None and (state.steps, state.tool_calls, state.tokens) == (1, 2, 15)
        guard = runs_seen.guard(state)
        assert guard.budgets["max_tool_calls"] == 3  # the run's own column lowers its profile's
        assert (guard.steps, guard.tool_calls, guard.cost_eur) == (1, 2, 0.25)
        assert runs_seen.known(run.id) is guard
        guard.count_tool_call()  # the witness's own call, which the run's row does not show yet
        again = runs_seen.guard(runs_seen.state(run.id))
        assert again is guard and guard.tool_calls == 3  # the larger of the two counts, not 2 + 3
        with pytest.raises(RunKilled) as stop:
            guard.before_tool("search", "a-hash", runs_seen.elapsed_s(state))
        assert stop.value.reason == lc.MAX_TOOL_CALLS
        assert runs_seen.elapsed_s(state) >= 0.0


def test_an_appended_call_is_a_witness_event_and_the_run_row_is_untouched(owner_and_witness, engine):
    owner, witness = owner_and_witness
    with owner.run("researcher", guards=False) as run:
        run.record_tool("search", {"q": 1})
        runs_seen = JoinedRuns(witness, lc.Source.LITELLM)
        first = runs_seen.append(run.id, kind=lc.EV_STEP, call_id="call-1", model="m", tokens_in=3, tokens_out=4)
        second = runs_seen.append(run.id, kind=lc.EV_STEP, call_id="call-2", model="m", tokens_in=1, tokens_out=1)
        assert (first, second) == (WITNESS_SEQ_BASE, WITNESS_SEQ_BASE + 1)
        with engine.connect() as conn:
            rows = conn.execute(select(events.c.seq, events.c.source, events.c.call_id, events.c.tokens_in)
                                .where(events.c.run_id == run.id, events.c.seq >= WITNESS_SEQ_BASE)
                                .order_by(events.c.seq)).all()
            row = conn.execute(select(runs.c.steps, runs.c.tool_calls, runs.c.tokens_in)
                               .where(runs.c.id == run.id)).one()
        assert [tuple(r) for r in rows] == [(first, "litellm", "call-1", 3), (second, "litellm", "call-2", 1)]
        assert tuple(row) == (0, 1, 0)  # the owner's counters only: the daemon folds the witness's events
    assert runs_seen.state("no-such-run") is None
