"""A tool that does not return is named in the run's progress, without looking alive."""

from __future__ import annotations

import datetime as dt
import threading
import time

from sqlalchemy import select

from watchdog import Watchdog
from daemon_support import SEALER
from watchdog.core.config import parse
from watchdog.daemon.stops.killer import Killer
from watchdog.store.schema import alerts, runs
from watchdog.daemon.tick.ticker import Ticker


def _row(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def _wait_for(predicate, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_hanging_tool_is_named_and_the_run_still_looks_hung(engine, db_url):
    wd = Watchdog(db_url)
    wd.inflight.announce_after_s = 0.2
    release = threading.Event()
    run = wd.run(agent="a", kill_mode="cooperative", heartbeat_timeout_s=1).start()
    run.tool_call("list_files", {}, lambda: ["a.txt"])
    seen_before = _row(engine, run.id).last_seen_at
    outcome = []

    def hang():
        try:
            run.tool_call("scan_archive", {}, lambda: release.wait(30))
        except BaseException as exc:  # the stop arrives on the write after the tool returns
            outcome.append(exc)

    worker = threading.Thread(target=hang)
    worker.start()
    try:
        assert _wait_for(lambda: (_row(engine, run.id).progress or "").startswith("in scan_archive since "))
        row = _row(engine, run.id)
        assert row.last_seen_at == seen_before  # a note for humans, not a sign of life
        assert row.progress.endswith(", no answer yet")

        # The daemon stops it for silence, and its alert says where it hangs.
        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5)
        rep = Ticker(engine, parse({}), Killer(), sealer=SEALER).tick(later)
        assert rep.stops == [(run.id, "heartbeat_timeout")]
        with engine.connect() as conn:
            body = conn.execute(select(alerts.c.body).where(alerts.c.run_id == run.id)).scalar()
        assert "last progress: «in scan_archive since " in body
        assert "top tool: «list_files» ×1" in body
    finally:
        release.set()
        worker.join(timeout=30)
    assert _wait_for(lambda: (_row(engine, run.id).progress or "").startswith("scan_archive answered after "))
    assert [type(e).__name__ for e in outcome] == ["RunKilled"]
    wd.close()


def test_a_quick_tool_writes_no_progress(engine, db_url):
    """Tools that answer in time leave `progress` alone while the announcer is watching; the same
    announcer, in the same run, names the call that does not answer (so it was not just asleep)."""
    wd = Watchdog(db_url)
    wd.inflight.announce_after_s = 3.0  # 15x the quick calls below: a loaded box does not blur it
    with wd.run(agent="a", kill_mode="cooperative") as run:
        quick_started = time.monotonic()
        for i in range(7):  # 1.4 s of 0.2 s calls: the announcer (every 1 s) sees calls in flight
            run.tool_call("search", {"q": i}, lambda q: time.sleep(0.2) or q)
        assert time.monotonic() - quick_started >= 1.4
        assert _row(engine, run.id).progress is None  # the run is still going: nothing was announced

        release = threading.Event()
        worker = threading.Thread(target=lambda: run.tool_call("slow_report", {}, lambda: release.wait(60)))
        worker.start()
        try:
            assert _wait_for(lambda: _row(engine, run.id).progress is not None, timeout_s=30)
            assert _row(engine, run.id).progress.startswith("in slow_report since ")  # not search
        finally:
            release.set()
            worker.join(timeout=60)
    wd.close()
