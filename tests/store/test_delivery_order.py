"""A slow alert target never gets an alert twice nor out of order (issue 19, item 3).

Real apprise to real local HTTP servers, one of them answering each POST 3 s late; the
delivery passes have a 1 s budget (tick_s = 1.25), as the daemon gives them."""

from __future__ import annotations

import datetime as dt
import time

from alertsinks import HttpSink
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.alerts.outbox import deliver_due
from watchdog.store.alerts import enqueue_alert
from watchdog.store.schema import alerts

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _queue(engine, sealer, names, at=T0):
    with engine.begin() as conn:
        for name in names:  # in the order their interventions happened
            assert enqueue_alert(conn, f"k:{name}", name, f"body of {name}", now=at, sealer=sealer)


def _passes(engine, notifier, sealer, done, timeout_s=90.0, retry_s=1.0):
    """Delivery passes one after another, as the daemon's deliver job runs them, until `done()`."""
    deadline = time.monotonic() + timeout_s
    n = 0
    while not done() and time.monotonic() < deadline:
        n += 1
        deliver_due(engine, notifier, T0 + dt.timedelta(seconds=n), sealer=sealer, budget_s=1.0, retry_s=retry_s)
    return done()


def _open(engine) -> int:
    from sqlalchemy import func, select

    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(alerts).where(
            alerts.c.delivered_at.is_(None), alerts.c.dead_at.is_(None))).scalar_one()


def test_a_3s_slow_target_beside_a_fast_one_gets_each_alert_once_in_order(engine, sealer, http):
    names = ["stopped-a", "signalled-a", "stopped-b", "stopped-c", "killed-a"]
    with HttpSink() as slow:
        slow.delay_s = 3.0
        notifier = Notifier([slow.url(), http.url()], timeout_s=10)
        _queue(engine, sealer, names[:3])
        deliver_due(engine, notifier, T0, sealer=sealer, budget_s=1.0)
        assert [p["title"] for p in http.received] == names[:3]  # the fast one is not held back
        _queue(engine, sealer, names[3:], at=T0 + dt.timedelta(seconds=1))  # more stops meanwhile
        assert _passes(engine, notifier, sealer, lambda: _open(engine) == 0)
        assert [p["title"] for p in http.received] == names
        assert [p["title"] for p in slow.received] == names  # each once, in the order they happened


def test_a_failed_send_holds_the_targets_later_alerts_until_it_goes(engine, sealer, http):
    names = ["first", "second", "third"]
    with HttpSink() as other:
        notifier = Notifier([http.url(), other.url()])
        http.fail_next(1, status=503)
        _queue(engine, sealer, names[:2])
        deliver_due(engine, notifier, T0, sealer=sealer, budget_s=5.0, retry_s=1.0)
        assert [p["title"] for p in other.received] == names[:2]
        assert http.received == []  # "second" waits behind "first" on the target that failed
        _queue(engine, sealer, names[2:], at=T0 + dt.timedelta(seconds=0.5))
        deliver_due(engine, notifier, T0 + dt.timedelta(seconds=0.6), sealer=sealer, budget_s=5.0, retry_s=1.0)
        assert http.received == []  # "first" is in its backoff: "third" does not overtake it
        assert _passes(engine, notifier, sealer, lambda: _open(engine) == 0)
        assert [p["title"] for p in http.received] == names
        assert [p["title"] for p in other.received] == names


def test_apprise_notify_types_say_how_urgent_each_alert_is(engine, sealer, http):
    """Issue 19: failure for kills, warning for stops and circuits, info for recoveries."""
    with engine.begin() as conn:
        for key in ("stop:r1", "escalate:r1", "lost:r2", "circuit_open:search:t", "circuit_closed:search:t",
                    "resume:r3:1"):
            assert enqueue_alert(conn, key, key, "body", now=T0, sealer=sealer)
    deliver_due(engine, Notifier([http.url()]), T0, sealer=sealer, budget_s=10)
    types = {p["title"]: p["type"] for p in http.received}
    assert types == {"stop:r1": "warning", "escalate:r1": "failure", "lost:r2": "failure",
                     "circuit_open:search:t": "warning", "circuit_closed:search:t": "info", "resume:r3:1": "info"}
