"""Alert delivery from the outbox table.

Alerts are queued in the transaction of the intervention they report; this
module delivers them later, per target, retrying failures with backoff on later
ticks. A target that already got an alert never gets it again (its id is
recorded in `delivered_targets`), so a target that fails then recovers gets it
once, and a restarted daemon does not resend.

Only alerts a daemon composed go out: each row is sealed by the daemon that
queued it (`sealed_by`, `mac`), and a daemon delivers the ones it sealed. A row
whose seal does not verify (inserted by whoever can write the store) is never
delivered: it is closed as refused, and one alert of the daemon's own says how
many were refused, never what they said.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from sqlalchemy import and_, or_, select, update

from watchdog.daemon.notify import Notifier
from watchdog.store.actions import enqueue_alert
from watchdog.store.schema import alerts

log = logging.getLogger("watchdog.alerts")

BACKOFF_MAX_S = 900.0
NO_TARGETS = "no [alerts] urls configured: logged only"
REFUSED = "refused: not sealed by this host's daemon (a row written by someone else); never delivered"
REFUSED_REPORT_S = 3600  # at most one "forged alerts refused" alert per hour
BATCH = 50


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0  # deliveries (alert × target) that failed this time
    refused: int = 0  # rows whose seal did not verify


def backoff_s(attempts: int, first_s: float) -> float:
    return min(BACKOFF_MAX_S, first_s * (2 ** max(0, attempts - 1)))


def deliver_due(engine, notifier: Notifier, now: dt.datetime, *, sealer, retry_s: float = 30.0,
                on_result=None, _again: bool = True) -> DeliveryReport:
    """Deliver every alert this daemon sealed that is due; never raises for a target that is down."""
    report = DeliveryReport()
    with engine.connect() as conn:
        due = conn.execute(
            select(alerts)
            .where(and_(alerts.c.delivered_at.is_(None),
                        or_(alerts.c.sealed_by == sealer.host, alerts.c.sealed_by.is_(None)),
                        or_(alerts.c.next_attempt_at.is_(None), alerts.c.next_attempt_at <= now)))
            .order_by(alerts.c.id).limit(BATCH)
        ).all()
    refused = [a for a in due if not sealer.alert_ok(a.mac, a.dedupe_key, a.title, a.body)]
    if refused:
        _refuse(engine, refused, now, sealer)
        report.refused = len(refused)
    refused_ids = {a.id for a in refused}
    for a in due:
        if a.id in refused_ids:
            continue
        if a.attempts == 0:  # the log is the alert channel of last resort (and the demo's)
            log.info("ALERT %s\n%s", a.title, a.body)
        done = set(a.delivered_targets or [])
        results = notifier.send(a.title, a.body, skip=done) if notifier.targets else []
        errors = []
        for r in results:
            if r.ok:
                done.add(r.target.id)
            else:
                errors.append(f"{r.target.privacy_url}: {r.error}")
                log.warning("alert %s to %s failed: %s", a.dedupe_key, r.target.privacy_url, r.error)
            if on_result:
                on_result(r)
        all_done = all(t.id in done for t in notifier.targets)
        attempts = a.attempts + 1
        values = {"attempts": attempts, "delivered_targets": sorted(done),
                  "last_error": "; ".join(errors)[:2000] if errors else None}
        if not notifier.targets:
            values["last_error"] = NO_TARGETS
        if all_done:
            values["delivered_at"] = now
            report.delivered += 1
        else:
            values["next_attempt_at"] = now + dt.timedelta(seconds=backoff_s(attempts, retry_s))
            report.failed += len(errors)
        with engine.begin() as conn:
            conn.execute(update(alerts).where(alerts.c.id == a.id).values(**values))
    if refused and _again:  # the daemon's own word on the refused rows goes out now, not a tick later
        more = deliver_due(engine, notifier, now, sealer=sealer, retry_s=retry_s, on_result=on_result, _again=False)
        report.delivered += more.delivered
        report.failed += more.failed
        report.refused += more.refused
    return report


def _refuse(engine, rows, now: dt.datetime, sealer) -> None:
    ids = [a.id for a in rows]
    log.warning("refused %d alert row(s) not sealed by this daemon (ids %s): not delivered", len(ids),
                ", ".join(map(str, ids[:20])))
    with engine.begin() as conn:
        conn.execute(update(alerts).where(alerts.c.id.in_(ids))
                     .values(delivered_at=now, last_error=REFUSED, attempts=alerts.c.attempts + 1))
        window = int(now.timestamp() // REFUSED_REPORT_S)
        shown = ", ".join(map(str, ids[:20])) + (" …" if len(ids) > 20 else "")
        # Their text is never repeated: it is exactly what someone wanted a human to read.
        enqueue_alert(conn, f"forged-alerts:{sealer.host}:{window}",
                      f"agent-watchdog: refused {len(ids)} alert row(s) this daemon did not compose",
                      f"host {sealer.host}\n{len(ids)} row(s) of the alerts table carry no valid seal of this "
                      f"daemon: someone who can write the store inserted or changed them. Not delivered.\n"
                      f"alert ids: {shown}\n(further refusals this hour are logged, not alerted)",
                      now=now, sealer=sealer)
