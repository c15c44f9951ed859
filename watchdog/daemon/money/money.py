"""The tick's money work: price what the SDK could not, book ended runs, judge period budgets,
report unpriced models, publish what the SDK checks at run start, and the drift alarms.

Money holds what it remembers between ticks; each tick drives it through a MoneyTick
(`Money.begin`, watchdog.daemon.money.moneytick), which enforces the order of its steps:

1. `read`, inside the tick's read snapshot: the unpriced steps written since the last tick,
   the ended runs not booked yet, the ledger's spend for the current day and month, and the
   labels of the runs first seen; the pre-filter's one pass over the active runs sums their
   live cost (LiveSpend);
2. `judge`, after it: `price` prices the unpriced steps (their cost lands on the runs, and in
   this tick's sums), then every period budget's spend = ledger + unbooked + live — one
   snapshot, so each run counts once and concurrent first runs are summed, never each
   compared with an empty ledger; then `publish_closed` (a new `wd.run()` is refused from
   then on), and the ticker stops the running runs of closed scopes (`closing`) like any verdict;
3. `finish`, after the stops: `book` the ended runs (a compare-and-set each: exactly once over
   all daemons), then `after`: warn / closed alerts (once per period), unpriced-model alerts
   (once per model and day), the published state (spend, burn rates), drift.

The step methods below are MoneyTick's; nothing else calls them.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import TYPE_CHECKING

from watchdog.core import messages
from watchdog.core.outcomes import Outcome, Say, word
from watchdog.core.lifecycle import ACTIVE_STATUSES as ACTIVE
from watchdog.core.periods import (CLOSED_KEY, DAY, MONTH, PERIODS, STATE_KEY, PeriodState, build_states,
                                   closed_entry, period_bounds, period_key, scope_agent, sum_spend, zone)
from watchdog.core.pricing import NO_MODEL
from watchdog.core.rowviews import RunView
from watchdog.daemon.money.moneytick import Backfill, BackfillReport, LiveSpend, MoneyTick
from watchdog.store.event_rows import UnpricedStep
from watchdog.daemon.money.driftwatch import DriftWatch
from watchdog.daemon.money.prices import PriceBook
from watchdog.daemon.trust.lightrow import Light
from watchdog.store import ledger
from watchdog.store.alerts import Audit, announce
from watchdog.store.engine import Connection, Engine
from watchdog.store.run_rows import RunLabels, labels_of
from watchdog.store.settings import put as publish_setting

if TYPE_CHECKING:
    from watchdog.core.budgets import Budgets
    from watchdog.core.config import Config
    from watchdog.core.seal import Sealer
    from watchdog.daemon.trust.trust import Trust

log = logging.getLogger("watchdog.money")

STATE_REFRESH_S = 30.0  # the published rates are refreshed this often (closed scopes at once)
PRUNE_EVERY_S = 3600.0
BOOK_EVERY_S = 30.0  # ended runs are booked into the ledger and rollups this often...
BOOK_BACKLOG = 500  # ...or as soon as this many wait
MAX_REMEMBERED = 10_000


class Money:
    def __init__(self, config: Config, by: str, sealer: Sealer | None = None):
        self.config = config
        self.by = by
        self.sealer = sealer  # the daemon's key: seals the alerts queued here
        self.tz = zone(config.pricing.budget_tz)
        self.prices = PriceBook(config.prices, config.pricing.eur_per_usd)
        self.backfill = Backfill(self.prices)
        self.drift = DriftWatch(config.drift, by, sealer=sealer)
        self.label_budgets = tuple(config.budgets)
        # issue 32: whose each run is (watchdog.daemon.trust.trust.Trust, set by the Ticker): a run counts
        # toward its agent's period budgets only if its owner may use that agent.
        self.whose: Trust | None = None
        self.rates = messages.RateTracker()
        self.run_scopes: dict[str, tuple[str, ...]] = {}  # active run id -> the label budgets covering it
        self.states: list[PeriodState] = []
        self.closed: dict[str, PeriodState] = {}  # scope key -> the closed period (day first)
        # (agent, labels, cost ended today, this month) of the unbooked runs
        self._unbooked: list[ledger.UnbookedSpend] = []
        self._n_unbooked = 0
        self._spend: ledger.Spend = {}
        self._keys: dict[str, str] = {}
        self._alerted: set[str] = set()
        self._published: tuple[tuple[str, str, str, str], ...] | None = None
        self._published_at: dt.datetime | None = None
        self._closed_at: dt.datetime | None = None
        self._pruned_at: dt.datetime | None = None
        self._booked_at: dt.datetime | None = None
        self._warned_bad: set[str] = set()
        self.last_backfill = BackfillReport()
        self._found: list[UnpricedStep] = []
        self._booked_since_read = True  # the books moved since the ledger was last read
        # run id -> labels (None: not a JSON table, or no such run), read with the ledger this tick
        self._labels_read: dict[str, dict[str, object] | None] = {}

    def begin(self, now: dt.datetime) -> MoneyTick:
        """This tick's money work, its steps in their order (watchdog.daemon.money.moneytick)."""
        return MoneyTick(self, now)

    # -- 1. inside the tick's read snapshot ---------------------------------------------------

    def read(self, conn: Connection, now: dt.datetime, high_water: int | None = None, *,
             quiet: bool = False, none_ended: bool = False, unpriced: Sequence[int] | None = None,
             ranged: bool = False, new: Sequence[tuple[str, float]] = ()) -> None:
        """The unpriced steps written since the last tick; the ledger's side of the spend: what
        it holds for the current periods, and the ended runs it does not hold yet (summed in
        the database: a few rows whatever their number). The change feed (issue 25) spares
        reads whose answer cannot have changed: `quiet`, no run was written since the last read,
        so no step either (a step renumbers its run); `none_ended`, no run ended (nor was
        deleted), so the ledger's side holds unless the period changed or this daemon booked;
        `unpriced`: the ids of the steps without a cost (and of the events it could not read) that
        the tick's fold read, which read every event written since the last tick (and, on
        PostgreSQL, those committed late): exactly those are read, not a range (None, or
        `ranged` as at a full tick: the range above the last read too). `new`: the runs first seen
        (LiveSpend.new), whose labels the ledger's read reads along (learn_labels reads the rest)."""
        keys = {p: period_key(p, now, self.tz) for p in PERIODS}
        self._labels_read = {}
        # Steps the last tick found but failed to price (`price` raised; MoneyTick.judge logged it)
        # are read again by id, whatever else this read skips.
        wanted = [r.id for r in self._found] + list(unpriced or ())
        backfill = self.backfill
        found: list[UnpricedStep] = []
        if backfill.backlog or backfill.low is None or ((unpriced is None or ranged) and not quiet):
            found = backfill.read(conn, high_water)
        elif not quiet:
            backfill.skip(conn, high_water)
        self._found = found  # kept (priced, or read again next tick) should the reads by id fail now
        if wanted:
            self._found = backfill.steps(conn, wanted, found)
        if none_ended and keys == self._keys and not self._booked_since_read:
            return
        self._booked_since_read = False
        self._keys = keys
        starts = {p: period_bounds(p, now, self.tz)[0] for p in PERIODS}
        ids = [rid for rid, _cost in new][: ledger.LABELS_ALONG] if self.label_budgets else []
        whose = self.whose
        bound = sorted(whose.bound) if whose is not None else ()
        self._spend, self._unbooked, self._n_unbooked, self._labels_read = ledger.read_period_spend(
            conn, self._keys, starts[DAY], starts[MONTH], ids, bound,
            None if whose is None else (lambda rid, agent, owner, source: whose.spend_as_row(conn, rid, agent, owner,
                                                                                           source)))

    # -- 3. every period budget's state (pure: from the snapshot), then the booking --------------

    def live_spend(self) -> LiveSpend:
        """What the tick's one pass over the active runs fills (PreFilter.due), for `judge`."""
        return LiveSpend(self.run_scopes if self.label_budgets else None)

    def learn_labels(self, conn: Connection, spend: LiveSpend) -> None:
        """In the snapshot: the label budgets of the runs first seen this tick, and their live cost."""
        if spend.new:
            for scope, cost in self._learn_labels(conn, spend.new):
                spend.labelled[scope] += cost
        if len(self.run_scopes) > 2 * len(spend.light) + 1000:  # forget the runs that ended
            active = {Light(r).id for r in spend.light}  # the rare path: by name
            self.run_scopes = {k: v for k, v in self.run_scopes.items() if k in active}

    # -- 2. after it: price, then judge ------------------------------------------------------

    def price(self, engine: Engine, now: dt.datetime) -> BackfillReport:
        """Price the unpriced steps `read` found (a write only when some were priced)."""
        self.last_backfill = self.backfill.apply(engine, self._found, now) if self._found else BackfillReport()
        self._found = []
        return self.last_backfill

    def judge(self, spend: LiveSpend, now: dt.datetime) -> list[PeriodState]:
        """Spend = ledger + unbooked + the active runs' live cost, all from the tick's snapshot,
        plus what `price` just added to runs of it; `spend`: the live cost the tick summed per
        agent and label budget."""
        live, labelled = spend.per_agent, spend.labelled
        for sums in (live, labelled):
            for k, v in sums.items():
                if not 0 <= v < ledger.MAX_COST_EUR:  # a bad row (NaN, negative) poisoned the sum: redo it
                    sums[k] = self._resum(spend, k)
        for r, cost in self.last_backfill.deltas:  # priced after the snapshot: added where the run counts
            agent = self._spend_as(r.run_id, r.agent)
            if agent is None:
                continue  # its owner not checked yet: its whole cost counts once it is
            if r.status in ACTIVE:
                live[agent] += cost
                for scope in self.run_scopes.get(r.run_id, ()) if agent == r.agent else ():
                    labelled[scope] += cost
            else:
                end = r.ended_at or r.last_seen_at
                today, month = (period_key(p, end, self.tz) == self._keys[p] for p in (DAY, MONTH))
                self._unbooked.append((agent, r.labels if agent == r.agent else None, cost if today else 0.0,
                                       cost if month else 0.0))
                self._booked_since_read = True  # this tick's own addition: the next read replaces it
        by_scope = {scope_agent(a): c for a, c in live.items()}
        by_scope.update(labelled)
        spent, agents = sum_spend(self._spend, self._unbooked, by_scope, self.label_budgets)

        def rate_of(scope: str, period: str, key: str, s: float, start: dt.datetime) -> float | None:
            return self.rates.rate(scope, period, key, s, now, start)

        states = build_states(spent, agents, self.config.profile, self.label_budgets, now, self.tz, rate_of)
        self.rates.forget({(s.scope.key, s.period) for s in states})
        self.states = states
        self.closed = {}
        for s in states:
            if s.closed and s.scope.key not in self.closed:  # the day first: it ends sooner
                self.closed[s.scope.key] = s
        return states

    def book(self, engine: Engine, now: dt.datetime) -> int:
        """Book the ended runs the snapshot found unbooked (a compare-and-set each: exactly once).

        Every BOOK_EVERY_S (or at once for a backlog), not every tick: until booked, a run is
        counted from the unbooked read each tick, so spend is the same either way, and one
        write transaction per half-minute costs less than one per tick."""
        if not self._n_unbooked:
            return 0
        due = (self._booked_at is None or self._n_unbooked >= BOOK_BACKLOG
               or not 0 <= (now - self._booked_at).total_seconds() < BOOK_EVERY_S)
        if not due:
            return 0
        self._booked_since_read = True  # whatever came of it: the next read is not skipped
        whose = self.whose
        with engine.begin() as conn:
            spend_as = None if whose is None or not whose.bound else (
                lambda r: whose.spend_as_row(conn, r.id, r.agent, r.owner, r.source))
            booking = ledger.book(conn, ledger.read_unbooked(conn), now, self.tz, self.label_budgets, spend_as)
        self._booked_at = now
        self.drift.dirty(booking.oldest_bucket, now)
        return len(booking.booked)

    def _spend_as(self, rid: str, agent: str) -> str | None:
        """The name the run's spend counts under (Trust.spend_as), its agent's without owners."""
        whose = self.whose
        return agent if whose is None or not whose.bound else whose.spend_as(rid, agent)

    def _resum(self, spend: LiveSpend, key: str) -> float:
        """One scope's live cost again, each bad cost as 0 (the rare path: a hand-written bad row)."""
        total = 0.0
        for r in map(Light, spend.light):
            agent = self._spend_as(r.id, r.agent)
            if agent == key or (agent == r.agent and key in self.run_scopes.get(r.id, ())):
                total += ledger.sane_cost(r.cost_eur)
        if key not in self._warned_bad:
            self._warned_bad.add(key)
            log.warning("a run of %s has a bad cost_eur (negative, infinite or NaN): counted as 0", key)
        return total

    def _learn_labels(self, conn: Connection, new: list[tuple[str, float]]) -> Iterator[tuple[str, float]]:
        """Read the labels of runs seen for the first time; yield (label scope, cost) of each match."""
        cost_of = dict(new)
        along, self._labels_read = self._labels_read, {}
        found = [RunLabels(rid, along[rid]) for rid in cost_of if rid in along]  # read with the ledger's
        for rid, labels in chain(found, labels_of(conn, [rid for rid in cost_of if rid not in along])):
            scopes = tuple(b.scope for b in self.label_budgets if b.matches(labels))
            self.run_scopes[rid] = scopes
            for scope in scopes:
                yield scope, cost_of[rid]

    # -- 4. which running runs a closed budget stops -------------------------------------------

    def closing(self, run_id: str, agent: str) -> PeriodState | None:
        """The closed period budget covering this run, or None (cheap: called for every active run)."""
        if not self.closed:
            return None
        key = self._spend_as(run_id, agent)
        if key is None:
            return None
        s = self.closed.get(scope_agent(key))
        if s is not None or key != agent:  # booked under its own owner: no label budget covers it
            return s
        for scope in self.run_scopes.get(run_id, ()):
            s = self.closed.get(scope)
            if s is not None:
                return s
        return None

    def states_of(self, agent: str, labels: object = None) -> list[PeriodState]:
        """The period states that cover a run of `agent` (for the forecast lines of its alerts)."""
        keys = {scope_agent(agent)} | {b.scope for b in self.label_budgets if b.matches(labels)}
        return [s for s in self.states if s.scope.key in keys and s.budget_eur > 0]

    def forecast_lines(self, row: RunView, budgets: Budgets, now: dt.datetime) -> tuple[str, ...]:
        """The burn-rate lines of a run's alerts: the run against its max_cost_eur, then every
        period budget covering it ("support-bot's daily budget runs out at 16:40 UTC")."""
        lines: list[str] = []
        run = messages.run_line(row.cost_eur or 0.0, budgets.max_cost_eur,
                                max(0.0, (now - row.started_at).total_seconds()))
        if run:
            lines.append(run)
        labels = row.labels if self.label_budgets else None  # (the whole row: its labels are at hand)
        lines += [messages.period_line(s, now, self.tz, mark=True) for s in self.states_of(row.agent, labels)]
        return tuple(lines)

    # -- 5. alerts and what the SDK reads -------------------------------------------------------

    def after(self, engine: Engine, now: dt.datetime, stopped: dict[str, list[str]] | None = None) -> None:
        """`stopped`: scope key -> the run ids the tick stopped for that scope's budget."""
        stopped = stopped or {}
        for s in self.states:
            if s.closed:
                self._period_alert(engine, s, now, "closed", stopped.get(s.scope.key, []))
            elif s.warned:
                self._period_alert(engine, s, now, "warning", [])
        self._unpriced_alerts(engine, now)
        self._publish(engine, now)
        self.drift.check(engine, now)
        self._prune(engine, now)

    def _period_alert(self, engine: Engine, s: PeriodState, now: dt.datetime, kind: str, stopped: list[str]) -> None:
        key = f"budget-{kind}:{s.scope.key}:{s.period}:{s.key}"
        if key in self._alerted:
            return
        said = Outcome.of(Say.PERIOD, key, s=s, kind=kind, now=now, tz=self.tz, stopped=stopped)
        title, body = word(said)
        with engine.begin() as conn:
            if announce(conn, said, now=now, sealer=self.sealer, once=True, audit=Audit(
                    f"budget_{kind}", self.by, reason=s.reason if kind == "closed" else None,
                    detail=body.splitlines()[0],
                    outcome=f"{len(stopped)} running run(s) stopped" if kind == "closed" else "alert only")).queued:
                log.warning("%s", title)
        self._remember(key)

    def _unpriced_alerts(self, engine: Engine, now: dt.datetime) -> None:
        day = period_key(DAY, now, self.tz)
        for model, u in sorted(self.last_backfill.unpriced.items()):
            if self.prices.known(model):
                continue  # priced meanwhile (an override in a reloaded config)
            key = f"unpriced:{model}:{day}"
            if key in self._alerted:
                continue
            said = Outcome.of(Say.UNPRICED, key, model=model, agents=sorted(u.agents), tokens=u.tokens, steps=u.steps,
                              no_model=model == NO_MODEL)
            with engine.begin() as conn:
                if announce(conn, said, now=now, sealer=self.sealer, once=True).queued:
                    log.warning("%s", word(said)[0])
            self._remember(key)

    def published_state(self) -> dict[str, object]:
        return {"tz": self.config.pricing.budget_tz, "periods": [s.to_json() for s in self.states]}

    def publish_closed(self, engine: Engine, now: dt.datetime) -> bool:
        """The spent budgets, for the SDK's check at run start: written when they change, and
        before the tick stops the runs they cover — an agent that sees its run stopped for
        daily_budget and asks for a new one is refused, never let through by a race."""
        closed = [closed_entry(s) for s in self.closed.values()]
        ident = tuple(sorted((e["scope"], e["name"], e["reason"], e["until"]) for e in closed))
        # Rewritten every STATE_REFRESH_S too: a row written by hand is not trusted for long.
        fresh = (self._closed_at is not None and 0 <= (now - self._closed_at).total_seconds() < STATE_REFRESH_S)
        if ident == self._published and fresh:
            return False
        with engine.begin() as conn:
            publish_setting(conn, CLOSED_KEY, closed, now)
        self._published, self._closed_at = ident, now
        return True

    def _publish(self, engine: Engine, now: dt.datetime) -> None:
        """Every period budget's state, with burn rates for `budgets` and `top`, every STATE_REFRESH_S."""
        changed = self.publish_closed(engine, now)
        fresh = self._published_at is not None and 0 <= (now - self._published_at).total_seconds() < STATE_REFRESH_S
        if fresh and not changed:
            return
        state = self.published_state()
        state["at"] = now.isoformat()
        with engine.begin() as conn:
            publish_setting(conn, STATE_KEY, state, now)
        self._published_at = now

    def _prune(self, engine: Engine, now: dt.datetime) -> None:
        if self._pruned_at is not None and 0 <= (now - self._pruned_at).total_seconds() < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        keep_s = self.config.drift.baseline_days * 86400 + self.config.drift.window_s + 86400
        with engine.begin() as conn:
            ledger.prune(conn, now - dt.timedelta(seconds=keep_s), ledger.month_key_ago(now, self.tz))

    def _remember(self, key: str) -> None:
        if len(self._alerted) >= MAX_REMEMBERED:
            self._alerted.clear()
        self._alerted.add(key)

