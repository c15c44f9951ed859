"""`agent_watchdog_interventions_total` counts every stop once (issue 36): the daemon's own, an
in-process guard's (heard after the run ended) and the operator's `kill` (heard while stopping),
not only the stops the daemon decided. A real daemon object, the real SDK and CLI, SQLite."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from daemon_support import config
from watchdog import RunKilled, Watchdog
from watchdog.cli import main
from watchdog.core.periods import utcnow
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.process.service import Daemon
from watchdog.store.engine import make_engine


def test_guard_operator_and_daemon_stops_are_each_counted_once(sqlite_url, tmp_path):
    from watchdog.daemon.process.metrics import Metrics

    engine = make_engine(sqlite_url)
    metrics = Metrics()
    daemon = Daemon(engine, config(), notifier=Notifier([]), metrics=metrics)
    wd = Watchdog(sqlite_url)
    try:
        with pytest.raises(RunKilled):  # the in-process guard stops it: the run ends within the tick
            with wd.run("bot", max_steps=1) as run:
                run.step(model="gpt-x", tokens_in=1, tokens_out=1)
                run.step(model="gpt-x", tokens_in=1, tokens_out=1)
        with wd.run("bot", guards=False) as run:  # the operator's kill: heard while stopping
            done = CliRunner().invoke(main, ["--db", sqlite_url, "kill", run.id])
            assert done.exit_code == 0, done.output
            daemon.tick_job(utcnow())
            daemon.tick_job(utcnow())  # heard once, however many ticks see it
        count = metrics.registry.get_sample_value
        assert count("agent_watchdog_interventions_total", {"reason": "max_steps"}) == 1
        assert count("agent_watchdog_interventions_total", {"reason": "manual"}) == 1
    finally:
        wd.close()
        engine.dispose()
