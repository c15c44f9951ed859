"""Stops the daemon did not decide and never saw as `stopping`: heard once, after the fact.

An in-process guard (or a gateway, or `agent-watchdog kill`) writes `stopping` and the run
ends as `killed` milliseconds later, inside one tick. Each tick this looks at the runs that
ended since its last look and, for each stop with no alert row yet, records the stop
(unless someone did) and queues its alert, worded from numbers and identifiers only, in
one transaction: the unique alert key makes it once, across restarts and daemons too.

Past `PER_MIN` alerts a minute the rest of a tick's stops are summarised in one alert
(counts per reason and agent); each of them still gets its own audit row and alert row.
On a cold start it looks back `LOOKBACK_S`: a stop made while the daemon was down is heard.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
from collections import Counter, deque
from typing import TYPE_CHECKING

from watchdog.core.rowviews import Row
from watchdog.core.outcomes import AlertKind, Outcome, Say, word
from watchdog.core.interventions import Action
from watchdog.core import lifecycle as lc
from watchdog.core.budgets import effective_budgets
from watchdog.core.text import one_line
from watchdog.daemon.stops.stopping import facts
from watchdog.store import run_rows
from watchdog.store.alerts import stop_key, summarised, unheard, Audit, announce, record, stop_intervention
from watchdog.store.engine import Connection, Engine, bound_lock_waits, statement_reads

if TYPE_CHECKING:
    from watchdog.core.config import Config
    from watchdog.core.seal import Sealer

log = logging.getLogger("watchdog.tick")

LOOKBACK_S = 86_400.0  # a cold start hears the stops of the last day
OVERLAP_S = 60.0  # re-read this far below the newest end seen: a transaction commits after its now()
PER_MIN = 30  # individual alerts a minute for stops heard after the run ended; the rest are summarised
SUMMARY_SHOWN = 10  # reasons / agents named in a summary


class EndedStops:
    def __init__(self) -> None:
        self.since: dt.datetime | None = None
        self._sent: deque[dt.datetime] = deque()  # when this daemon queued each individual alert (the rate)
        self.backlog = False  # the last look found a whole batch: more ended runs wait
        self.heard: list[tuple[str, str]] = []  # (run id, reason) heard by the last look (for /metrics)

    def run(self, engine: Engine, now: dt.datetime, *, hosts: frozenset[str] | None, config: Config,
            sealer: Sealer | None, by: str) -> list[str]:
        """Acknowledge the unheard stops among the runs ended since the last look; their ids."""
        since = self.since if self.since is not None else now - dt.timedelta(seconds=LOOKBACK_S)
        self.heard = []
        with statement_reads(engine) as conn:  # every tick a run ended: no BEGIN/ROLLBACK round trips
            ended = run_rows.ended_since(conn, since, hosts)
            todo = unheard(conn, [r.id for r in ended])
        self.backlog = False
        if ended:
            newest = max(r.ended_at for r in ended)
            full = self.backlog = len(ended) >= run_rows.BATCH
            self.since = newest if full else max(since, newest - dt.timedelta(seconds=OVERLAP_S))
        elif self.since is None:
            self.since = since
        rows = [r for r in ended if r.id in todo]
        if not rows or sealer is None:
            return []
        while self._sent and (now - self._sent[0]).total_seconds() >= 60.0:
            self._sent.popleft()
        room = max(0, PER_MIN - len(self._sent))
        alone, grouped = rows[:room], rows[room:]
        done: list[str] = []
        for row in alone:
            try:
                with engine.begin() as conn:
                    bound_lock_waits(conn)  # its audit row's key waits on the run's row, which its writer may hold
                    if self._one(conn, row, now, config, sealer, by):
                        self._sent.append(now)
                        done.append(row.id)
            except Exception as exc:  # noqa: BLE001 — one unreadable row never hides the others
                if _store_down(exc):
                    raise
                log.warning("run %s: could not acknowledge its stop (%s)", one_line(str(row.id), 40),
                            type(exc).__name__)
        if grouped:
            done += self._summary(engine, grouped, now, config, sealer, by)
        return done

    def _compose(self, conn: Connection, row: Row, now: dt.datetime, config: Config) -> tuple[str, Outcome]:
        budgets = effective_budgets(config.profile(row.agent), row)
        f = facts(row, run_rows.top_tool(conn, row.id), None, now)
        # Writer text (progress, partial answer) is not quoted in an alert the daemon did not decide.
        f = dataclasses.replace(f, progress=None, partial=None, last_error=None)
        reason = row.stop_reason if _identifier(row.stop_reason) else "unknown"
        status = row.status if row.status in tuple(lc.Status) else "ended"
        plan = f"none needed: the run had already ended ({status}) when the daemon saw its stop"
        return reason, Outcome.of(Say.REQUESTED_STOP, stop_key(row.id), row.id, f=f, b=budgets, reason=reason, plan=plan)

    def _one(self, conn: Connection, row: Row, now: dt.datetime, config: Config, sealer: Sealer, by: str) -> bool:
        reason, said = self._compose(conn, row, now, config)
        iid = stop_intervention(conn, row.id)
        audit = iid if iid is not None else Audit(
            Action.STOP_REQUESTED, by, reason=reason, at=_asked_at(row, now),
            outcome="stop requested in the store, not by this daemon; acknowledged after the run ended")
        queued = announce(conn, said, now=now, sealer=sealer, audit=audit).queued
        if queued:
            self.heard.append((row.id, reason))
            log.warning("stop heard after the run ended: %s run %s — %s", one_line(row.agent, 64),
                        one_line(row.id, 40)[:8], reason)
        return queued

    def _summary(self, engine: Engine, rows: list[Row], now: dt.datetime, config: Config, sealer: Sealer,
                 by: str) -> list[str]:
        """One alert for many stops; each still recorded, each with its own (summarised) alert row."""
        summary_key = AlertKind.STOPS.key(now.isoformat(), one_line(rows[0].id, 40))
        reasons: Counter[str] = Counter()
        agents: Counter[str] = Counter()
        done: list[str] = []
        with engine.begin() as conn:
            bound_lock_waits(conn)  # as above: a held run row fails this summary (retried), never the tick
            for row in rows:
                if unheard(conn, [row.id]) != {row.id}:
                    continue  # heard meanwhile (another daemon of the store)
                reason, said = self._compose(conn, row, now, config)
                title, body = word(said)
                iid = stop_intervention(conn, row.id)
                if iid is None:
                    iid = record(conn, at=_asked_at(row, now), action=Action.STOP_REQUESTED, by=by, run_id=row.id,
                                 reason=reason,
                                 outcome="stop requested in the store, not by this daemon; acknowledged in a summary")
                summarised(conn, row.id, title, body, now=now, intervention_id=iid, sealer=sealer,
                           summary_key=summary_key)
                reasons[reason] += 1
                agents[one_line(row.agent, 64)] += 1
                self.heard.append((row.id, reason))
                done.append(row.id)
            if done:
                announce(conn, Outcome.of(Say.STOPS_SUMMARY, summary_key, n=len(done), reasons=reasons, agents=agents,
                                          per_min=PER_MIN, shown=SUMMARY_SHOWN), now=now, sealer=sealer)
        if done:
            log.warning("%d stops heard after their runs ended, summarised in one alert", len(done))
        return done


def _asked_at(row: Row, now: dt.datetime) -> dt.datetime:  # row: an ended run (store.ended_stops)
    """When the stop was asked for (the store's clock), for its audit row; else now."""
    at = row.stop_requested_at or row.ended_at
    return at if isinstance(at, dt.datetime) and at <= now else now


def _identifier(value: object) -> bool:
    """A stop reason as the SDK and gateways spell them (lowercase words): safe to name."""
    return isinstance(value, str) and (value in lc.STOP_REASONS or re.fullmatch(r"[a-z][a-z_]{0,31}", value) is not None)


def _store_down(exc: BaseException) -> bool:
    from watchdog.store.engine import store_unavailable

    return store_unavailable(exc)
