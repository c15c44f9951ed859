"""Alert delivery from the outbox table, and what the daemon itself delivered, checked before each send.

What the daemon itself delivered, checked before each send (issue 20).

`alerts.delivered_at` / `delivered_targets` are store columns any SQLite writer can reset:
reset, a genuine sealed alert would go out again on each reset. The daemon records each
(alert, target) it delivered in its state file (watchdog.store.memory) and never sends one
twice; the alert's key is its dedupe key and its sealed creation time.

Alert delivery from the outbox table.

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

Nothing jams it. A pass claims its rows first (watchdog.store.outbox: two
deliverers send each alert once); each row is read and handled under its own
guard, and one that cannot be (a bad value in any column) is dead-lettered with
what was wrong, logged once, while the others go out; a pass has a time budget,
and each target is sent to in its own lane (watchdog.daemon.alerts.lanes), so a target
that hangs delays no other. An alert not delivered within `alert_expire_s` is
dead-lettered: kept (`agent-watchdog alerts --dead`), counted, never retried.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Hashable, Sequence, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from watchdog.core.outcomes import AlertKind, notify_kind, alert_body, alert_title, Outcome, Say
from watchdog.core.rowviews import AlertKeyView
from watchdog.daemon.alerts import lanes
from watchdog.daemon.alerts.notify import Notifier, TargetResult
from watchdog.store import outbox as rows
from watchdog.store.alerts import announce
from watchdog.store.engine import Engine, store_unavailable

if TYPE_CHECKING:
    from watchdog.core.seal import Sealer
    from watchdog.daemon.alerts.notify import Target
    from watchdog.store.memory import Memory


_delivered_log = logging.getLogger("watchdog.outbox")


def _key(dedupe_key: str, created_at: object) -> str:
    stamp = created_at.isoformat() if hasattr(created_at, "isoformat") else str(created_at)
    return f"{dedupe_key}@{stamp}"


def already(memory: Memory | None, row: AlertKeyView, targets: Iterable[Target]) -> set[str]:
    """The ids of the targets this daemon delivered this alert to (none without a memory)."""
    if memory is None:
        return set()
    key = _key(row.dedupe_key, row.created_at)
    try:
        return {t.id for t in targets if memory.delivered(key, t.id)}
    except Exception:  # noqa: BLE001 — the store's own record still holds
        _delivered_log.warning("could not read the daemon's delivery record", exc_info=True)
        return set()


def sent(memory: Memory | None, dedupe_key: str, created_at: object, target_id: str) -> None:
    if memory is None:
        return
    try:
        memory.deliver(_key(dedupe_key, created_at), target_id)
    except Exception:  # noqa: BLE001 — at least once: the store's record still says delivered
        _delivered_log.warning("could not write the daemon's delivery record", exc_info=True)


# -- Alert delivery from the outbox table --------------------------------------------------------------------------

Jobs = dict["Target", list[lanes.Job]]  # per target, the (alert id, title, body, kind) it is sent
Results = dict[tuple[Hashable, str], TargetResult]  # (alert id, target id) -> what its send did
OnResult = Callable[[TargetResult], object]
OnDead = Callable[[str], object]  # why a row was dead-lettered: EXPIRED, UNUSABLE, HUNG_KIND

log = logging.getLogger("watchdog.alerts")

BACKOFF_MAX_S = 900.0
NO_TARGETS = "no [alerts] urls configured: logged only"
REFUSED = "refused: not sealed by this host's daemon (a row written by someone else); never delivered"
REFUSED_REPORT_S = 3600  # at most one "forged alerts refused" alert per hour
BATCH = 50
CLAIM_MARGIN_S = 30.0  # a claim outlives its pass's budget by this: recording the results takes time too
EXPIRED, UNUSABLE = "expired", "unusable"  # why a row was dead-lettered (the metrics' label)
HUNG_KIND = "hung"  # a send past the lanes' hard limit (watchdog.daemon.alerts.lanes)


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0  # deliveries (alert × target) that failed this time
    refused: int = 0  # rows whose seal did not verify
    dead: int = 0  # rows dead-lettered this pass (expired, or unusable)


@dataclass
class _Due:
    id: int
    key: str
    attempts: int
    done: set[str]
    created_at: object = None  # with the key: the alert in the daemon's delivery record


def backoff_s(attempts: int, first_s: float) -> float:
    return min(BACKOFF_MAX_S, first_s * (2.0 ** max(0, attempts - 1)))


def deliver_due(engine: Engine, notifier: Notifier, now: dt.datetime, *, sealer: Sealer, retry_s: float = 30.0,
                expire_s: float = 86400.0, budget_s: float = 5.0, on_result: OnResult | None = None,
                on_dead: OnDead | None = None, batch: int = BATCH, _rounds: int = 100,
                memory: Memory | None = None) -> DeliveryReport:
    """Deliver every alert this daemon sealed that is due, within `budget_s` seconds; never
    raises for a target that is down or a row that is bad (a store that is down raises)."""
    deadline = time.monotonic() + budget_s
    report = DeliveryReport()
    token = rows.claimer(sealer.host)
    ids = rows.claim(engine, token, host=sealer.host, now=now, ttl_s=budget_s + CLAIM_MARGIN_S,
                     expire_before=now - dt.timedelta(seconds=expire_s), limit=batch)
    if not ids:
        return report
    refused: list[int] = []
    try:
        due: list[_Due] = []
        work: Jobs = {t: [] for t in notifier.targets}
        for alert_id, row, unreadable in rows.read(engine, ids):
            try:
                outcome = unreadable if row is None else rows.problem(row)
                if row is None or outcome is not None:
                    outcome = outcome or "unusable row: it cannot be read"
                    _dead(engine, token, alert_id, now, outcome, UNUSABLE, report, on_dead)
                elif not sealer.alert_ok(row.mac, row.dedupe_key, row.title, row.body, row.created_at):
                    refused.append(alert_id)
                elif row.created_at < now - dt.timedelta(seconds=expire_s):
                    why = (f"dead letter: not delivered to every target within alert_expire_s ({expire_s:g} s)"
                           + (f"; last error: {row.last_error}" if isinstance(row.last_error, str) else ""))
                    _dead(engine, token, alert_id, now, why, EXPIRED, report, on_dead)
                else:
                    # The text is bounded again here: rows sealed before the bound, or by another version.
                    title, body = alert_title(row.title), alert_body(row.body)
                    if row.attempts == 0:  # the log is the alert channel of last resort (and the demo's)
                        log.info("ALERT %s\n%s", title, body)
                    done = set(row.delivered_targets or []) | already(memory, row, notifier.targets)
                    due.append(_Due(alert_id, row.dedupe_key, row.attempts, done, row.created_at))
                    kind = notify_kind(row.dedupe_key)  # apprise's type: failure / warning / info
                    for target in notifier.targets:
                        if target.id not in done and f"dead:{target.id}" not in done:
                            work[target].append((alert_id, title, body, kind))
            except Exception as exc:  # noqa: BLE001 — this row only; the pass goes on
                _unusable(engine, token, alert_id, now, exc, report, on_dead)
        if refused:
            _refuse(engine, token, refused, now, sealer)
            report.refused = len(refused)
        held_results, held_until = _in_order(engine, notifier, sealer.host, ids, work)
        results = notifier.deliver(work, deadline) if any(work.values()) else {}
        results.update(held_results)
        for a in due:
            try:
                _record(engine, token, notifier, a, results, now, retry_s, report, on_result, on_dead, held_until,
                        sealer.host, memory)
            except Exception as exc:  # noqa: BLE001
                _unusable(engine, token, a.id, now, exc, report, on_dead)
    finally:
        try:
            rows.release(engine, token)
        except Exception as exc:  # noqa: BLE001 — the claims expire on their own
            log.warning("could not release this pass's alert claims (they expire by themselves): %s",
                        type(exc).__name__)
    # Another round while time is left: the daemon's own word on the refused rows goes out now,
    # not a tick later, and a full batch means more are due (a million forged rows ahead of a real
    # alert must not hold it back for hours at one batch a tick: refusing is cheap).
    left_s = deadline - time.monotonic()
    if _rounds > 1 and (refused or len(ids) >= batch) and (left_s > 0 or (refused and _rounds == 100)):
        more = deliver_due(engine, notifier, now, sealer=sealer, retry_s=retry_s, expire_s=expire_s,
                           budget_s=max(1.0, left_s), on_result=on_result, on_dead=on_dead,
                           batch=batch, _rounds=_rounds - 1, memory=memory)
        report.delivered += more.delivered
        report.failed += more.failed
        report.refused += more.refused
        report.dead += more.dead
    return report


def _in_order(engine: Engine, notifier: Notifier, host: str, ids: Sequence[int], work: Jobs
              ) -> tuple[Results, dict[str, dt.datetime]]:
    """Per target, alerts leave in the order they were queued: a claimed alert newer than one
    the target has not got yet (in its backoff) is HELD, not sent (taken out of `work`).
    Returns those results and, per target id, when the older alert is due again."""
    if not ids or not notifier.targets:
        return {}, {}
    try:
        with engine.connect() as conn:
            older = rows.waiting_before(conn, host=host, below_id=max(ids), exclude=list(ids))
    except Exception as exc:  # noqa: BLE001 — order is best effort this pass; delivery is not
        if store_unavailable(exc):
            raise
        return {}, {}
    results: Results = {}
    until: dict[str, dt.datetime] = {}
    for target in notifier.targets:
        blocker = next((o for o in older if isinstance(o.delivered_targets, (list, type(None)))
                        and target.id not in (o.delivered_targets or [])
                        and f"dead:{target.id}" not in (o.delivered_targets or [])), None)
        if blocker is None:
            continue
        work[target] = _hold_newer(target, work.get(target, []), blocker.id, results)
        if isinstance(blocker.next_attempt_at, dt.datetime):
            until[target.id] = blocker.next_attempt_at
    return results, until


def _hold_newer(target: Target, jobs: list[lanes.Job], blocker_id: int, results: Results) -> list[lanes.Job]:
    """The target's jobs up to its blocker's id; each newer one HELD (its result in `results`)."""
    keep: list[lanes.Job] = []
    for job in jobs:
        alert_id = job[0]  # the outbox's jobs are keyed by their alert's id
        if isinstance(alert_id, int) and alert_id > blocker_id:
            results[(alert_id, target.id)] = TargetResult(target, False, lanes.HELD)
        else:
            keep.append(job)
    return keep


def _record(engine: Engine, token: str, notifier: Notifier, a: _Due, results: Results, now: dt.datetime,
            retry_s: float, report: DeliveryReport, on_result: OnResult | None, on_dead: OnDead | None = None,
            held_until: dict[str, dt.datetime] | None = None, host: str = "", memory: Memory | None = None) -> None:
    errors: list[str] = []
    tried = pending = hung = False
    waits: list[dt.datetime] = []  # when the alerts these ones are held behind are due again
    for target in notifier.targets:
        r = results.get((a.id, target.id))
        if r is None:
            continue
        if lanes.pending(r):  # still being sent in its lane: not a failure, never sent again
            pending = tried = True
            continue
        if lanes.held(r):
            waits.append((held_until or {}).get(target.id) or now + dt.timedelta(seconds=retry_s))
            continue
        tried = True
        if lanes.hung(r):
            hung = True
            a.done.add(f"dead:{target.id}")
            errors.append(f"{target.privacy_url}: {r.error}")
            log.warning("alert %s to %s dead-lettered for that target: %s", a.key, target.privacy_url, r.error)
        elif r.ok:
            a.done.add(target.id)
            sent(memory, a.key, a.created_at, target.id)  # the daemon's own record (issue 20)
            a.done.add(f"at:{target.id}:{now.isoformat(timespec='seconds')}")  # for `alerts --all`
        else:
            errors.append(f"{target.privacy_url}: {r.error}")
            log.warning("alert %s to %s failed: %s", a.key, target.privacy_url, r.error)
        if on_result:
            on_result(r)
    all_done = all(t.id in a.done or f"dead:{t.id}" in a.done for t in notifier.targets)
    attempts = a.attempts + 1 if tried or not notifier.targets else a.attempts
    values: dict[str, object] = {"attempts": attempts, "delivered_targets": sorted(a.done),
              "last_error": "; ".join(errors)[:2000] if errors else None}
    if not notifier.targets:
        values["last_error"] = NO_TARGETS
    if all_done and any(d.startswith("dead:") for d in a.done):
        values["dead_at"] = now  # every target is done with it, one (or more) by giving up on a hung send
        report.dead += 1
        if on_dead:
            on_dead(HUNG_KIND)
    elif all_done:
        values["delivered_at"] = now
        report.delivered += 1
    elif pending:
        values["next_attempt_at"] = now  # the next pass collects what its lane finished
        until = now + dt.timedelta(seconds=notifier.hard_limit_s + CLAIM_MARGIN_S)
        with engine.begin() as conn:
            rows.hold(conn, token, a.id, values, host=host, until=until)
        return
    elif errors:
        values["next_attempt_at"] = now + dt.timedelta(seconds=backoff_s(attempts, retry_s))
        report.failed += len(errors)
    else:  # only held behind older alerts: due again with the oldest of them
        values["next_attempt_at"] = min(waits) if waits else now + dt.timedelta(seconds=retry_s)
    with engine.begin() as conn:
        if not rows.record(conn, token, a.id, values):
            log.warning("alert %s: this pass's claim expired before its result was recorded; "
                        "another pass may send it again", a.key)


def _dead(engine: Engine, token: str, alert_id: int, now: dt.datetime, reason: str, kind: str,
          report: DeliveryReport, on_dead: OnDead | None) -> None:
    if rows.dead_letter(engine, token, alert_id, now, reason):
        log.warning("alert %d dead-lettered (never retried; `agent-watchdog alerts --dead`): %s", alert_id, reason)
        report.dead += 1
        if on_dead:
            on_dead(kind)


def _unusable(engine: Engine, token: str, alert_id: int, now: dt.datetime, exc: Exception,
              report: DeliveryReport, on_dead: OnDead | None) -> None:
    try:
        _dead(engine, token, alert_id, now, f"unusable row: handling it raised {type(exc).__name__}", UNUSABLE,
              report, on_dead)
    except Exception as again:  # noqa: BLE001 — the store itself fails: the claim expires, the next pass retries
        log.error("alert %d could not be handled (%s) nor marked (%s)", alert_id, type(exc).__name__,
                  type(again).__name__)


def _refuse(engine: Engine, token: str, ids: list[int], now: dt.datetime, sealer: Sealer) -> None:
    log.warning("refused %d alert row(s) not sealed by this daemon (ids %s): not delivered", len(ids),
                ", ".join(map(str, ids[:20])))
    with engine.begin() as conn:
        rows.refuse(conn, ids, now=now, reason=REFUSED)
        window = int(now.timestamp() // REFUSED_REPORT_S)
        # Their text is never repeated: it is exactly what someone wanted a human to read.
        announce(conn, Outcome.of(Say.FORGED_ALERTS, AlertKind.FORGED_ALERTS.key(sealer.host, window),
                                  host=sealer.host, ids=list(ids)), now=now, sealer=sealer)
