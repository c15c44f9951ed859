"""Inside `agent-watchdog exec`, `wd.run()` joins exec's run ($AGENT_WATCHDOG_RUN) as its child;
when that run is in another store than this Watchdog's, the run is a run of its own (warned),
not a crash. (mypy found it: the parent's budgets left were read although none were.)"""

import logging

from watchdog.sdk.client import ENV_EXEC_RUN


def test_a_run_named_by_exec_in_another_store_is_a_run_of_its_own(wd, monkeypatch, caplog):
    monkeypatch.setenv(ENV_EXEC_RUN, "0" * 32)
    with caplog.at_level(logging.WARNING, logger="watchdog.client"):
        with wd.run("support-bot", max_steps=3) as run:
            run.step()
    assert run.parent_id is None and run.status == "completed"
    assert "not in this store" in caplog.text
