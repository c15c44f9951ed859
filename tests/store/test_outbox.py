"""The alert outbox cannot be jammed: bad rows, a hanging target, expired alerts, long texts,
two deliverers at once, a crashed claimer. Real stores (SQLite file, PostgreSQL), real
apprise to local HTTP servers (tests/alertsinks.py), the real CLI; the clock is passed in."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select, text

from alertsinks import HangSink
from watchdog.cli import main
from watchdog.core.outcomes import BODY_MARKER, MAX_BODY_CHARS, MAX_TITLE_CHARS, TITLE_MARKER, alert_body, alert_title
from watchdog.daemon.alerts import lanes
from watchdog.daemon.process.metrics import Metrics
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.alerts.outbox import CLAIM_MARGIN_S, deliver_due
from watchdog.store import outbox as outbox_store
from watchdog.store.alerts import enqueue_alert
from watchdog.store.schema import alerts

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def queue(engine, sealer, n: int, prefix: str = "a", now: dt.datetime = T0) -> list[str]:
    titles = [f"{prefix}-{i}" for i in range(n)]
    with engine.begin() as conn:
        for t in titles:
            assert enqueue_alert(conn, f"k:{t}", t, f"body of {t}", now=now, sealer=sealer)
    return titles


def row(engine, key: str):
    with engine.connect() as conn:
        return conn.execute(select(alerts.c.id, alerts.c.delivered_at, alerts.c.dead_at, alerts.c.last_error,
                                   alerts.c.claimed_by).where(alerts.c.dedupe_key == key)).one()


def titles_received(sink) -> list[str]:
    return sorted(p["title"] for p in sink.received)


def cli(url: str, *args: str):
    result = CliRunner().invoke(main, ["--db", url, "alerts", *args])
    assert result.exit_code == 0, result.output
    return result.output


# --- bad rows ---------------------------------------------------------------------------

# (what a store writer did, SQL per dialect, the column the mark must name)
POISONS = {
    "targets-number": ({"sqlite": "delivered_targets = '5'", "postgresql": "delivered_targets = '5'::json"},
                       "delivered_targets"),
    "targets-string": ({"sqlite": "delivered_targets = '\"abc\"'", "postgresql": "delivered_targets = '\"abc\"'::json"},
                       "delivered_targets"),
    "attempts-negative": ({"sqlite": "attempts = -3", "postgresql": "attempts = -3"}, "attempts"),
    "attempts-text": ({"sqlite": "attempts = 'many'"}, "attempts"),
    "targets-not-json": ({"sqlite": "delivered_targets = 'not json'"}, "delivered_targets"),
    "created-garbage": ({"sqlite": "created_at = 'the day before yesterday'"}, "created_at"),
    "title-bytes": ({"sqlite": "title = X'00FF'"}, "title"),
}


def test_a_poisoned_row_is_dead_lettered_once_and_every_good_alert_still_goes_out(db_url, engine, sealer, http,
                                                                                 caplog):
    dialect = engine.dialect.name
    poisons = {name: (sql[dialect], column) for name, (sql, column) in POISONS.items() if dialect in sql}
    good = queue(engine, sealer, 3, "good-before")
    with engine.begin() as conn:
        for name in poisons:
            assert enqueue_alert(conn, f"k:{name}", name, "sealed, then changed by hand", now=T0, sealer=sealer)
        for name, (sql, _) in poisons.items():
            conn.execute(text(f"UPDATE alerts SET {sql} WHERE dedupe_key = :k"), {"k": f"k:{name}"})
    good += queue(engine, sealer, 3, "good-after")
    ids = {name: row(engine, f"k:{name}").id for name in poisons}
    metrics = Metrics()
    caplog.set_level(logging.WARNING, logger="watchdog.alerts")

    report = deliver_due(engine, Notifier([http.url()]), at(1), sealer=sealer, on_dead=metrics.alert_dead)

    assert titles_received(http) == sorted(good)  # every good alert, each once
    assert report.delivered == len(good) and report.dead == len(poisons)
    assert metrics.registry.get_sample_value("agent_watchdog_alerts_dead_lettered_total",
                                             {"reason": "unusable"}) == len(poisons)
    for name, (_, column) in poisons.items():
        with engine.connect() as conn:
            dead_at, last_error, claimed = conn.execute(
                select(alerts.c.dead_at, alerts.c.last_error, alerts.c.claimed_by).where(alerts.c.id == ids[name])).one()
        assert dead_at == at(1), name
        assert last_error.startswith(("unusable row", "unreadable row")) and column in last_error, (name, last_error)
        assert claimed is None
    # Never retried: later passes send nothing and mark nothing again; each was logged once.
    for hours in (1, 5, 48):
        again = deliver_due(engine, Notifier([http.url()]), at(3600 * hours), sealer=sealer)
        assert (again.delivered, again.failed, again.dead) == (0, 0, 0)
    assert titles_received(http) == sorted(good)
    for name, alert_id in ids.items():
        logged = [r for r in caplog.records if f"alert {alert_id} dead-lettered" in r.getMessage()]
        assert len(logged) == 1, name
    # The CLI lists them (it reads the same bad rows without failing).
    listed = json.loads(cli(db_url, "--dead", "--json"))
    assert sorted(r["id"] for r in listed) == sorted(ids.values())
    assert all(r["state"] == "dead" for r in listed)


def test_a_body_changed_to_invalid_utf8_is_refused_never_delivered(sqlite_url, sealer, http):
    """SQLite decodes invalid UTF-8 with replacement characters (one bad value must not fail a
    whole query): the text is then not what the daemon sealed, so it is refused as forged."""
    from watchdog.store.engine import make_engine

    engine = make_engine(sqlite_url)
    try:
        good = queue(engine, sealer, 2, "good")
        with engine.begin() as conn:
            assert enqueue_alert(conn, "k:utf8", "utf8", "sealed, then changed by hand", now=T0, sealer=sealer)
            conn.execute(text("UPDATE alerts SET body = CAST(X'FFFE41' AS TEXT) WHERE dedupe_key = 'k:utf8'"))
        report = deliver_due(engine, Notifier([http.url()]), at(1), sealer=sealer)
        assert report.refused == 1
        received = titles_received(http)
        assert "utf8" not in received and set(good) <= set(received)
    finally:
        engine.dispose()


# --- a hanging target -------------------------------------------------------------------


def _full(engine, key: str):
    with engine.connect() as conn:
        return conn.execute(select(alerts).where(alerts.c.dedupe_key == key)).one()


def test_a_hanging_target_delays_no_healthy_one_and_holds_one_thread(engine, sealer, http):
    titles = queue(engine, sealer, 8)
    with HangSink() as hang:
        # Its socket would wait two minutes: the lanes' hard limit (2 s here) gives up on it.
        notifier = Notifier([hang.url(read_timeout_s=120), http.url()], timeout_s=120, hard_limit_s=2)
        hung, healthy = notifier.targets

        report = deliver_due(engine, notifier, at(1), sealer=sealer, budget_s=1)

        assert titles_received(http) == sorted(titles)  # within the one pass
        assert report.failed == 0 and report.delivered == 0  # the hanging send is pending, not failed
        for t in titles:
            r = _full(engine, f"k:{t}")
            assert [t for t in r.delivered_targets if ":" not in t] == [healthy.id] and r.delivered_at is None
        assert notifier.busy() == [hung.id] and hang.connections == 1
        # The next pass does not pile a second send onto the one still hanging, nor resend.
        deliver_due(engine, notifier, at(2), sealer=sealer, budget_s=0.5)
        assert hang.connections == 1 and len(http.received) == len(titles)
        # Past the hard limit the hanging send is dead-lettered for that target; the next goes.
        deadline = time.monotonic() + 60
        while hang.connections < 2 and time.monotonic() < deadline:
            deliver_due(engine, notifier, at(3), sealer=sealer, budget_s=0.5)
        assert hang.connections == 2  # the target's later alerts still go (and hang too, one at a time)
        first = _full(engine, f"k:{titles[0]}")
        assert first.dead_at is not None and lanes.HUNG in first.last_error
        assert f"dead:{hung.id}" in first.delivered_targets
        assert len(http.received) == len(titles)  # the healthy target never gets one twice


# --- dead letters -----------------------------------------------------------------------


def test_an_alert_not_delivered_within_alert_expire_s_is_dead_lettered_listed_and_never_sent(db_url, engine, sealer,
                                                                                            http):
    (title,) = queue(engine, sealer, 1, "late")
    fresh = queue(engine, sealer, 1, "fresh", now=at(3000))
    notifier = Notifier([http.url()])
    http.fail_next(1, status=503)
    first = deliver_due(engine, notifier, at(1), sealer=sealer, expire_s=3600, retry_s=60)
    assert first.failed == 1 and http.received == []
    metrics = Metrics()

    report = deliver_due(engine, notifier, at(3601), sealer=sealer, expire_s=3600, on_dead=metrics.alert_dead)

    assert report.dead == 1
    assert titles_received(http) == fresh  # the expired one is not sent; the fresh one is
    assert metrics.registry.get_sample_value("agent_watchdog_alerts_dead_lettered_total", {"reason": "expired"}) == 1
    dead = row(engine, f"k:{title}")
    assert dead.dead_at == at(3601) and dead.delivered_at is None
    assert "alert_expire_s (3600 s)" in dead.last_error and "503" in dead.last_error
    for later in (3700, 90000):
        assert deliver_due(engine, notifier, at(later), sealer=sealer, expire_s=3600).delivered == 0
    assert titles_received(http) == fresh

    listed = json.loads(cli(db_url, "--dead", "--json"))
    assert [(r["dedupe_key"], r["state"], r["attempts"]) for r in listed] == [(f"k:{title}", "dead", 1)]
    shown = cli(db_url)
    assert "dead" in shown and title in shown and "alert_expire_s" in shown
    assert cli(db_url, "--json").count('"id"') == 1  # the fresh one was delivered: only the dead letter is left


# --- bounded text -----------------------------------------------------------------------


def test_titles_and_bodies_are_bounded_with_a_visible_marker_when_stored_and_when_sent(engine, sealer, http):
    long_title = "agent \x1b[31mevil\x1b[0m\nSubject: forged " + "t" * 1000
    long_body = "line one\nline two\x07\n" + "b" * 10000
    with engine.begin() as conn:
        enqueue_alert(conn, "k:long", long_title, long_body, now=T0, sealer=sealer)
        # A row sealed as is (before the bound, or by another version): bounded again when sent.
        raw_title, raw_body = "raw\ntitle " + "r" * 400, "x" * 9000  # title: 500 at most in the table
        conn.execute(insert(alerts).values(dedupe_key="k:raw", title=raw_title, body=raw_body, created_at=T0,
                                           attempts=0, next_attempt_at=T0, delivered_targets=[],
                                           sealed_by=sealer.host, mac=sealer.alert("k:raw", raw_title, raw_body)))
    with engine.connect() as conn:
        stored = conn.execute(select(alerts.c.title, alerts.c.body).where(alerts.c.dedupe_key == "k:long")).one()
    assert stored.title == alert_title(long_title) and stored.body == alert_body(long_body)

    assert deliver_due(engine, Notifier([http.url()]), at(1), sealer=sealer).delivered == 2

    for post in http.received:
        assert len(post["title"]) <= MAX_TITLE_CHARS and post["title"].endswith(TITLE_MARKER)
        assert "\n" not in post["title"] and "\x1b" not in post["title"]
        assert len(post["message"]) <= MAX_BODY_CHARS and post["message"].endswith(BODY_MARKER)
        assert "\x07" not in post["message"]
    sent = {p["title"].split()[0]: p for p in http.received}
    assert sent["agent"]["title"].startswith("agent [31mevil [0m Subject: forged ttt")
    assert sent["agent"]["message"].startswith("line one\nline two \n")


def test_the_bounds_are_idempotent_and_leave_short_text_alone():
    assert alert_title("run r-1 stopped: loop on verify_iban") == "run r-1 stopped: loop on verify_iban"
    assert alert_body("a\nb\tc") == "a\nb\tc"
    for text_ in ("x " * 400, "\u202e" + "y" * 500, "a\r\nb" * 3000):
        assert alert_title(alert_title(text_)) == alert_title(text_)
        assert alert_body(alert_body(text_)) == alert_body(text_)
    assert "\u202e" not in alert_title("\u202eevil")  # a bidi override cannot reverse what a pager shows


# --- claims -----------------------------------------------------------------------------


def test_two_deliverers_at_once_send_each_alert_exactly_once(db_url, sealer, http):
    from watchdog.store.engine import make_engine

    engines = [make_engine(db_url) for _ in range(2)]
    # Queued now: the deliverers below read the real clock (an alert queued at the fixed T0 would
    # be dead-lettered as older than alert_expire_s once T0 is a day behind the real date).
    titles = queue(engines[0], sealer, 30, now=dt.datetime.now(dt.timezone.utc))
    start = threading.Barrier(2)
    errors, delivered = [], []

    def deliverer(engine):
        notifier = Notifier([http.url()])  # each its own, as two processes would have
        try:
            start.wait(30)
            for _ in range(200):
                # One host, one clock: both deliverers read the same time.
                rep = deliver_due(engine, notifier, dt.datetime.now(dt.timezone.utc), sealer=sealer, batch=3)
                delivered.append(rep.delivered)
                with engine.connect() as conn:
                    if conn.execute(select(alerts.c.id).where(alerts.c.delivered_at.is_(None))).first() is None:
                        return
        except Exception as exc:  # noqa: BLE001 — reported below
            errors.append(exc)

    threads = [threading.Thread(target=deliverer, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for e in engines:
        e.dispose()
    assert errors == []
    assert titles_received(http) == sorted(titles)  # each exactly once: no duplicate, none missing
    assert sum(delivered) == len(titles)  # and recorded once: no pass counted another's


def test_a_crashed_claimers_claims_expire_and_are_retaken(engine, sealer, http):
    titles = queue(engine, sealer, 2)
    budget_s = 5.0
    ttl_s = budget_s + CLAIM_MARGIN_S
    # A pass that claimed the rows and died before sending (kill -9): its claims stay behind.
    ids = outbox_store.claim(engine, "crashed:1:dead", host=sealer.host, now=at(0), ttl_s=ttl_s,
                            expire_before=at(-86400), limit=50)
    assert len(ids) == 2
    notifier = Notifier([http.url()])

    held = deliver_due(engine, notifier, at(1), sealer=sealer, budget_s=budget_s)
    assert (held.delivered, http.received) == (0, [])  # claimed by someone: not ours to send yet

    retaken = deliver_due(engine, notifier, at(ttl_s + 1), sealer=sealer, budget_s=budget_s)
    assert retaken.delivered == 2 and titles_received(http) == sorted(titles)
    assert all(row(engine, f"k:{t}").claimed_by is None for t in titles)


def test_a_claim_from_a_clock_that_went_back_does_not_hold_the_alerts(engine, sealer, http):
    (title,) = queue(engine, sealer, 1, now=at(-7200))
    outbox_store.claim(engine, "crashed:2:dead", host=sealer.host, now=at(0), ttl_s=35.0,
                      expire_before=at(-86400), limit=50)
    # The clock is set back an hour: that claim would otherwise hold the alert for an hour.
    report = deliver_due(engine, Notifier([http.url()]), at(-3600), sealer=sealer, budget_s=5.0)
    assert report.delivered == 1 and titles_received(http) == [title]


def test_forged_rows_queued_ahead_of_a_real_alert_do_not_hold_it_back(engine, sealer, http):
    """Refusing is cheap: a pass goes on claiming while its budget lasts, so 300 forged rows
    (six batches) ahead of a real alert cost it nothing."""
    with engine.begin() as conn:
        conn.execute(insert(alerts), [dict(dedupe_key=f"forged:{i}", created_at=T0, title="pay now", body="forged",
                                           attempts=0, next_attempt_at=T0, delivered_targets=[],
                                           sealed_by=sealer.host, mac="0" * 64) for i in range(300)])
    real = queue(engine, sealer, 1, "real")
    report = deliver_due(engine, Notifier([http.url()]), at(1), sealer=sealer, batch=50)
    assert report.refused == 300
    assert set(real) <= set(titles_received(http)) and "pay now" not in titles_received(http)


def test_a_slow_target_that_answers_after_the_pass_gave_up_is_not_sent_the_alert_again(engine, sealer, http):
    titles = queue(engine, sealer, 1, "slow")
    http.delay_s = 1.5
    notifier = Notifier([http.url()], timeout_s=30)
    first = deliver_due(engine, notifier, at(1), sealer=sealer, budget_s=0.3)
    assert first.delivered == 0  # the pass stopped waiting...
    assert http.wait_for(1, 30)  # ...the target got it anyway, late
    deadline = time.monotonic() + 30
    while notifier.busy() and time.monotonic() < deadline:
        time.sleep(0.05)
    http.delay_s = 0.0
    second = deliver_due(engine, notifier, at(3600), sealer=sealer, budget_s=5)
    assert second.delivered == 1
    assert titles_received(http) == titles  # once


def test_a_delivered_alert_made_new_again_by_hand_is_refused(engine, sealer, http):
    titles = queue(engine, sealer, 1, "once")
    assert deliver_due(engine, Notifier([http.url()]), at(1), sealer=sealer).delivered == 1
    with engine.begin() as conn:  # a store writer replays it: undelivered, and new
        conn.execute(text("UPDATE alerts SET delivered_at = NULL, delivered_targets = NULL, attempts = 0, "
                          "next_attempt_at = NULL, created_at = :t"), {"t": at(7200).replace(tzinfo=None)
                                                                      if engine.dialect.name == "sqlite" else at(7200)})
    again = deliver_due(engine, Notifier([http.url()]), at(7201), sealer=sealer)
    assert again.refused == 1  # (what is delivered is the daemon's own word on the refusal)
    assert [t for t in titles_received(http) if t in titles] == titles  # once


def test_a_late_success_waits_for_its_own_alert_while_another_goes_out(engine, sealer, http):
    first = queue(engine, sealer, 1, "slowA")
    http.delay_s = 1.5
    notifier = Notifier([http.url()], timeout_s=30)
    deliver_due(engine, notifier, at(1), sealer=sealer, budget_s=0.3)  # gives up; the send succeeds later
    assert http.wait_for(1, 30)
    deadline = time.monotonic() + 30
    while notifier.busy() and time.monotonic() < deadline:
        time.sleep(0.05)
    http.delay_s = 0.0
    second = queue(engine, sealer, 1, "nextB")
    deliver_due(engine, notifier, at(2), sealer=sealer, budget_s=5)  # slowA is in its backoff: only nextB
    deliver_due(engine, notifier, at(7200), sealer=sealer, budget_s=5)  # slowA due: its late success counts
    assert sorted(titles_received(http)) == sorted(first + second)  # each once
