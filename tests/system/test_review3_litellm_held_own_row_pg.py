"""Hostile review 3: a runaway that holds its own run row locked is not let through LiteLLM.

An SDK (or exec) run passes its run id as LiteLLM's trace id, and the callback appends each model
call to it as a witness event. The event's foreign key waits on the run row, so an agent that
keeps `SELECT ... FOR UPDATE` of its own run open (its own login may: row-level security lets it
lock its rows) makes every append wait: since this session's gateways' lock_timeout, the append
gives up after 500 ms and the step was dropped, and not counted by the callback's own guard
either (it counted only after a successful append). The pre-call check reads without locks, so
every call went through, over max_steps, uncounted, until the daemon came to the run (its wall
clock) and ended the holder. Now the callback's own count takes the step it saw whatever the
store did with it, and refuses the call past the budget.
"""

from __future__ import annotations

import pytest

from pg_support import RolesStore, raw
from test_review_litellm_trace_claims import key, one_call
from watchdog import Watchdog
from watchdog.integrations.litellm import WatchdogProxyHandler


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_llhr").create() as s:
        yield s


def test_a_run_holding_its_own_row_is_refused_past_its_budget(store, tmp_path, monkeypatch):
    cfg = tmp_path / "watchdog.toml"
    cfg.write_text("[defaults]\nmax_steps = 40\n")
    monkeypatch.setenv("AGENT_WATCHDOG_CONFIG", str(cfg))
    wd = Watchdog(store.url("b"), attest_socket="")
    run = wd.run(agent="victim", max_steps=3)
    run.start()
    hold = raw(store.url("b"))  # the runaway's own session, its run's row locked and left open
    h = WatchdogProxyHandler(store.url("gw"))
    try:
        hold.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (run.id,))
        answers = [one_call(h, key("team"), run.id) for _ in range(5)]
        assert answers[:3] == [None, None, None], answers
        assert all(a is not None and "max_steps" in a for a in answers[3:]), answers
    finally:
        hold.rollback()
        hold.close()
        h.wd().close()
        run.end("completed", None, None)
        wd.close()
