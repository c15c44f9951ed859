"""After a clock jump the daemon rebases the store's times and judges on the new clock, on both
backends (the jump detector itself: tests/unit/test_clock.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from watchdog.daemon.tick.clock import JumpDetector


def jump_of(skew_s: float, before: dt.datetime, gap_s: float = 1.0):
    d = JumpDetector(tolerance_s=1)
    d.observe(0.0, before)
    return d.observe(gap_s, before + dt.timedelta(seconds=gap_s + skew_s))


@pytest.fixture
def daemon(engine):
    from daemon_support import config
    from watchdog.daemon.alerts.notify import Notifier
    from watchdog.daemon.process.service import Daemon

    d = Daemon(engine, config(defaults={"max_wall_s": 300, "heartbeat_timeout_s": 120}), notifier=Notifier([]))
    yield d


@pytest.mark.parametrize("skew_s", [3600, -3600])
def test_after_a_jump_a_healthy_run_is_judged_on_the_new_clock(engine, daemon, db_url, skew_s):
    from daemon_support import alerts_of, run_row
    from watchdog import Watchdog
    from watchdog.store.schema import utcnow

    wd = Watchdog(db_url, attest_socket="")
    try:
        run = wd.run(agent="healthy", guards=False).start()
        run.step(cost_eur=0.0)
        row = run_row(engine, run.id)
        before = utcnow()
        jump = jump_of(skew_s, before, gap_s=2.0)
        new_now = jump.at
        from watchdog.store.alerts import enqueue_alert

        with engine.begin() as conn:  # an alert queued before the jump, not delivered yet
            assert enqueue_alert(conn, "pending", "t", "b", now=before, sealer=daemon.sealer)
        # Unrebased, the run would look an hour old (+) or an hour in the future (-).
        daemon._clock_jumped(jump)
        moved = run_row(engine, run.id)
        assert moved.started_at == row.started_at + dt.timedelta(seconds=skew_s)
        assert moved.last_seen_at == row.last_seen_at + dt.timedelta(seconds=skew_s)
        (pending,) = [a for a in alerts_of(engine) if a.dedupe_key == "pending"]
        assert pending.next_attempt_at == before + dt.timedelta(seconds=skew_s)  # -1 h: not an hour late
        (alert,) = [a for a in alerts_of(engine) if a.dedupe_key.startswith("clock:")]
        assert f"{skew_s:+d} s" in alert.title and "1 active run(s)" in alert.body
        rep = daemon.ticker.tick(new_now, skip_clock=True)
        assert rep.stops == []
        rep = daemon.ticker.tick(new_now + dt.timedelta(seconds=5))  # the next tick judges durations again
        assert rep.stops == [] and run_row(engine, run.id).status == "running"
        # ...and still stops a silent run on the new clock.
        rep = daemon.ticker.tick(new_now + dt.timedelta(seconds=200))
        assert [(rid, reason) for rid, reason in rep.stops] == [(run.id, "heartbeat_timeout")]
    finally:
        wd.close()


def test_a_tick_with_skip_clock_does_not_judge_durations(engine, daemon, db_url):
    from watchdog import Watchdog
    from watchdog.store.schema import utcnow

    wd = Watchdog(db_url, attest_socket="")
    try:
        run = wd.run(agent="old", guards=False).start()
        later_now = utcnow() + dt.timedelta(hours=2)  # over max_wall_s and heartbeat_timeout_s
        assert daemon.ticker.tick(later_now, skip_clock=True).stops == []
        assert [r for _rid, r in daemon.ticker.tick(later_now).stops] == ["wall_clock"]
        assert run.id
    finally:
        wd._expect_loss = True
        wd.close()
