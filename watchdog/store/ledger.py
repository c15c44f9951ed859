"""The money ledger: ended runs booked once into period spend and per-agent rollups.

A run is booked when it has ended: one compare-and-set on `runs.booked_at` (so two
daemons sharing a PostgreSQL store, or a daemon restarted mid-tick, book it exactly
once), and in the same transaction its cost is added to

- `spend_ledger`: per scope (its agent, and every `[[budgets]]` label set it matches)
  and calendar period (day and month in `[pricing] budget_tz`) of its end;
- `agent_rollups` / `agent_rollup_tools`: per agent and 5-minute bucket of its end,
  the run's totals and its tools' calls (what the drift alarms compare).

Period spend = what the ledger holds + the ended runs not booked yet + the active
runs' live cost, all read in one snapshot by the tick (watchdog.daemon.money.money), so a
run is counted exactly once whichever daemon books it. Every read here is bounded
by the current periods or the rollup window: never a scan of history.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Unpack

from sqlalchemy import (Table, Text, and_, bindparam, case, cast, delete, desc, func, literal, or_, select, union_all,
                        update)
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from watchdog.core import lifecycle as lc
from watchdog.core.drift import Totals
from watchdog.core.periods import MONTH, PERIODS, LabelBudget, end_of, period_key, scope_agent, scopes_of
from watchdog.store import dialects
from watchdog.store.event_rows import EventTotals, event_totals
from watchdog.store.schema import agent_rollup_tools, agent_rollups, events, runs, spend_ledger

if TYPE_CHECKING:
    from watchdog.core.config import Config
    from watchdog.core.periods import PeriodState

BUCKET_S = 300  # rollup granularity: an hour's window is exact to within 5 minutes
BOOK_LIMIT = 5000  # ended runs booked per tick at most (a backlog drains over ticks)
MAX_COST_EUR = 1e12  # a run's cost above this (or negative, or NaN) is a bad row: counted as 0
CHUNK = 500
STOPPED = (lc.KILLED, lc.LOST)

UNBOOKED_COLS = ("id", "agent", "labels", "status", "steps", "tool_calls", "tool_errors", "tokens_in", "tokens_out",
                 "cost_eur", "cost_unpriced_tokens", "ended_at", "last_seen_at", "owner", "source")

# The ledger's cost per (scope, period) of the current period keys.
Spend = dict[tuple[str, str], float]
# The ended runs not booked yet, summed per (agent, labels): (agent, labels, cost ended today,
# cost ended this month). A plain tuple: the tick appends its own live rows to the same list.
UnbookedSpend = tuple[str, dict[str, Any] | None, float, float]


def bucket_of(at: dt.datetime) -> dt.datetime:
    s = int(at.timestamp() // BUCKET_S) * BUCKET_S
    return dt.datetime.fromtimestamp(s, dt.timezone.utc)


def first_bucket_after(at: dt.datetime) -> dt.datetime:
    """The first bucket that starts at or after `at` (whole buckets only in a window)."""
    b = bucket_of(at)
    return b if b == at else b + dt.timedelta(seconds=BUCKET_S)


def sane_cost(value: object) -> float:
    """A run's cost as the sums take it: a bad value written by hand counts as 0."""
    return float(value) if isinstance(value, (int, float)) and 0 <= value < MAX_COST_EUR else 0.0


def read_unbooked(conn: Connection, limit: int = BOOK_LIMIT) -> Sequence[Row[Any]]:
    """Ended runs the ledger does not hold yet, the latest first (they matter to today's budgets)."""
    q = (select(*(runs.c[c] for c in UNBOOKED_COLS))
         .where(and_(runs.c.status.in_(lc.END_STATUSES), runs.c.booked_at.is_(None)))
         .order_by(desc(func.coalesce(runs.c.ended_at, runs.c.last_seen_at))).limit(limit))
    return conn.execute(q).all()


# Runs whose labels read_period_spend reads along, at most (more: the caller reads the rest).
LABELS_ALONG = 500


def read_period_spend(conn: Connection, keys: Mapping[str, str], day_start: dt.datetime, month_start: dt.datetime,
                      labels_of: Sequence[str] = (), bound: Sequence[str] = (),
                      spend_as: Callable[[str, str, Any, Any], str] | None = None
                      ) -> tuple[Spend, list[UnbookedSpend], int, dict[str, Any]]:
    """read_spend and read_unbooked_spend in one statement (one round trip per tick), and the
    labels of up to LABELS_ALONG runs (`labels_of`: the runs first seen, whose label budgets the
    tick must know): (ledger spend, unbooked sums, unbooked runs, {run id: labels or None}: every
    run asked for, None also for one that is not there). issue 32: the unbooked runs of the
    `bound` agents (whose profile names its owners) are read one by one and summed under
    `spend_as(run id, agent, owner column, source)`; one booked elsewhere counts for no label budget."""
    params = _spend_params(keys, day_start, month_start)
    if labels_of:
        params["b_ids"] = list(labels_of[:LABELS_ALONG])
    if bound and spend_as is not None:
        params["b_bound"] = list(bound)
        stmt = _PERIOD_SPEND_BOUND_LABELS if labels_of else _PERIOD_SPEND_BOUND
    else:
        stmt = _PERIOD_SPEND_LABELS if labels_of else _PERIOD_SPEND
    rows = conn.execute(stmt, params).all()
    spend: Spend = {}
    unbooked: list[UnbookedSpend] = []
    labels: dict[str, Any] = dict.fromkeys(labels_of[:LABELS_ALONG])
    n = 0
    for kind, a, b, c, d, count, *whose in rows:
        if kind == "L":
            spend[(a, b)] = float(c or 0.0)
        elif kind == "U":
            if whose and whose[0] is not None and spend_as is not None:  # one run of a bound agent
                key = spend_as(whose[0], a, whose[1], whose[2])
                unbooked.append((key, parse_labels(b) if key == a else None, float(c or 0.0), float(d or 0.0)))
            else:
                unbooked.append((a, parse_labels(b), float(c or 0.0), float(d or 0.0)))
            n += int(count)
        else:
            labels[a] = parse_labels(b)
    return spend, unbooked, n, labels


def read_unbooked_spend(conn: Connection, day_start: dt.datetime, month_start: dt.datetime
                        ) -> tuple[list[UnbookedSpend], int]:
    """The ended runs not booked yet, summed in the database per (agent, labels): a few rows
    whatever their number. ([(agent, labels, cost ended today, cost ended this month)], runs)."""
    out: list[UnbookedSpend] = []
    n = 0
    for agent, text, day_cost, month_cost, count in conn.execute(_UNBOOKED_SPEND,
                                                                 _spend_params({}, day_start, month_start)):
        out.append((agent, parse_labels(text), float(day_cost or 0.0), float(month_cost or 0.0)))
        n += int(count)
    return out, n


# The statements above, built once with bound parameters: the tick runs them whenever a run ended,
# and building them anew cost more than the database's work (SQLAlchemy caches the compiled SQL
# per statement object; a new object is walked again for its cache key).
_DAY_START = bindparam("day_start", type_=runs.c.ended_at.type)
_MONTH_START = bindparam("month_start", type_=runs.c.ended_at.type)


def _spend_params(keys: Mapping[str, str], day_start: dt.datetime, month_start: dt.datetime) -> dict[str, Any]:
    params: dict[str, Any] = {f"{p}_key": keys.get(p) for p in PERIODS}
    params.update(day_start=day_start, month_start=month_start)
    return params


def _current() -> ColumnElement[bool]:
    """The ledger's rows of the current period keys (bound as `day_key`, `month_key`)."""
    return or_(*(and_(spend_ledger.c.period == p, spend_ledger.c.period_key == bindparam(f"{p}_key", type_=spend_ledger.c.period_key.type))
                 for p in PERIODS))


def _unbooked_query(*tag: ColumnElement[str], bound: bool = False) -> Select[Unpack[tuple[Any, ...]]]:
    end = func.coalesce(runs.c.ended_at, runs.c.last_seen_at)
    labels = cast(runs.c.labels, Text)  # PostgreSQL cannot group by json; the text groups alike
    # A cost written by hand that is negative, infinite or NaN (PostgreSQL orders NaN above all)
    # counts as 0: it must neither poison nor lower the sums.
    cost = case((and_(runs.c.cost_eur >= 0, runs.c.cost_eur < MAX_COST_EUR), runs.c.cost_eur), else_=0.0)
    cols: list[Any] = [*tag, runs.c.agent, labels, func.sum(case((end >= _DAY_START, cost), else_=0.0)),
                       func.sum(case((end >= _MONTH_START, cost), else_=0.0)), func.count()]
    group: list[Any] = [runs.c.agent, labels]
    if bound:  # issue 32: a bound agent's runs one by one (whose each is decides where it counts)
        is_bound = runs.c.agent.in_(bindparam("b_bound", expanding=True))
        one = (case((is_bound, runs.c.id), else_=None), case((is_bound, runs.c.owner), else_=None),
               case((is_bound, runs.c.source), else_=None))
        cols += one
        group += one
    return (select(*cols).where(and_(runs.c.status.in_(lc.END_STATUSES), runs.c.booked_at.is_(None)))
            .group_by(*group))


_SPEND = select(spend_ledger.c.scope, spend_ledger.c.period, spend_ledger.c.cost_eur).where(_current())
_UNBOOKED_SPEND = _unbooked_query()
_LEDGER_ROWS = select(literal("L"), spend_ledger.c.scope, spend_ledger.c.period, spend_ledger.c.cost_eur,
                      literal(0.0), literal(0)).where(_current())
_PERIOD_SPEND = union_all(_LEDGER_ROWS, _unbooked_query(literal("U")))
# ...and the labels of the runs bound as `b_ids` (read as text: the JSON type would fail the whole
# read on one hand-written value; parse_labels makes that one None).
_LABEL_ROWS = select(literal("N"), runs.c.id, cast(runs.c.labels, Text), literal(0.0), literal(0.0),
                     literal(0)).where(runs.c.id.in_(bindparam("b_ids", expanding=True)))
_PERIOD_SPEND_LABELS = union_all(_LEDGER_ROWS, _unbooked_query(literal("U")), _LABEL_ROWS)
# ...with the runs of the agents bound as `b_bound` one by one: their id, owner and source (three more columns).
_NO_RUN = (literal(None, Text), literal(None, Text), literal(None, Text))
_PERIOD_SPEND_BOUND = union_all(_LEDGER_ROWS.add_columns(*_NO_RUN), _unbooked_query(literal("U"), bound=True))
_PERIOD_SPEND_BOUND_LABELS = union_all(_LEDGER_ROWS.add_columns(*_NO_RUN), _unbooked_query(literal("U"), bound=True),
                                       _LABEL_ROWS.add_columns(*_NO_RUN))


def parse_labels(text: object) -> dict[str, Any] | None:
    """A run's labels from their stored text; None if they are not a JSON table."""
    if text is None:
        return None
    if isinstance(text, dict):
        return text
    if not isinstance(text, (str, bytes, bytearray)):  # what json.loads refuses anyway
        return None
    try:
        value = json.loads(text)
    except Exception:  # noqa: BLE001 — a row written by hand (not JSON, or nested past the recursion limit)
        return None
    return value if isinstance(value, dict) else None


def read_spend(conn: Connection, keys: Mapping[str, str]) -> Spend:
    """The ledger's cost per (scope, period) for the current period keys ({"day": "2025-01-31", ...})."""
    return {(scope, period): float(cost or 0.0)
            for scope, period, cost in conn.execute(_SPEND, {f"{p}_key": keys.get(p) for p in PERIODS})}


@dataclass
class Booking:
    booked: list[Row[Any]] = field(default_factory=list)  # the rows this daemon booked
    oldest_bucket: dt.datetime | None = None


def _claim(conn: Connection, ids: list[str], now: dt.datetime) -> set[str]:
    """Set booked_at on those of `ids` nobody booked yet; the ids this transaction claimed. On
    PostgreSQL a run row another session holds locked is passed over, never waited on (an agent
    that locks its own ended run and idles must not stall the leader's booking): booked a later tick."""
    if conn.dialect.name == "postgresql":
        free = (select(runs.c.id).where(and_(runs.c.id.in_(ids), runs.c.booked_at.is_(None)))
                .with_for_update(skip_locked=True))
        ids = list(conn.execute(free).scalars())
        if not ids:
            return set()
    if conn.dialect.update_returning:
        q = (update(runs).where(and_(runs.c.id.in_(ids), runs.c.booked_at.is_(None)))
             .values(booked_at=now).returning(runs.c.id))
        return set(conn.execute(q).scalars())
    claimed: set[str] = set()
    for rid in ids:  # an old SQLite without RETURNING: one compare-and-set per run
        res = conn.execute(update(runs).where(and_(runs.c.id == rid, runs.c.booked_at.is_(None))).values(booked_at=now))
        if res.rowcount == 1:
            claimed.add(rid)
    return claimed


def _tool_counts(conn: Connection, ids: list[str]) -> dict[str, list[tuple[str, int, int]]]:
    bad = func.sum(case((events.c.ok.is_(False), 1), else_=0))
    out: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    q = (select(events.c.run_id, events.c.tool, func.count(), bad)
         .where(and_(events.c.run_id.in_(ids), events.c.kind == lc.EV_TOOL))
         .group_by(events.c.run_id, events.c.tool))
    for rid, tool, calls, errors in conn.execute(q):
        out[rid].append((tool, int(calls), int(errors or 0)))
    return out


def _counters(r: Row[Any], ev: EventTotals | None) -> tuple[Any, Any, Any]:
    """The row's (steps, tool_calls, tool_errors), each raised to what its events show."""
    own = (r.steps, r.tool_calls, r.tool_errors)
    if ev is None:
        return own
    s, t, e = (max(v or 0, shown) if isinstance(v, (int, float)) else shown for v, shown in zip(own, ev[:3]))
    return s, t, e


def book(conn: Connection, rows: Sequence[Row[Any]], now: dt.datetime, tz: dt.tzinfo,
         label_budgets: tuple[LabelBudget, ...] = (), spend_as: Callable[[Row[Any]], str] | None = None) -> Booking:
    """Book ended runs (read by read_unbooked) into the ledger and the rollups, in `conn`'s transaction.
    `spend_as(row)`: the name a run is booked under (issue 32: its own owner's when its profile
    refused it; then no label budget either); None: its agent's."""
    out = Booking()
    # (scope, period, period key) -> [cost_eur, runs, tokens, unpriced_tokens]
    ledger: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0, 0, 0])
    # (agent, bucket) -> [runs, stopped, steps, tool_calls, tool_errors, cost_eur, tokens, unpriced_tokens]
    rollups: dict[tuple[str, dt.datetime], list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0.0, 0, 0])
    # (agent, bucket, tool) -> [calls, errors]
    tools: dict[tuple[str, dt.datetime, str], list[int]] = defaultdict(lambda: [0, 0])
    for i in range(0, len(rows), CHUNK):
        chunk = rows[i : i + CHUNK]
        claimed = _claim(conn, [r.id for r in chunk], now)
        mine = [r for r in chunk if r.id in claimed]
        if not mine:
            continue
        counts = _tool_counts(conn, [r.id for r in mine])
        shown = event_totals(conn, [r.id for r in mine])  # issue 20: what its events show it spent
        for r in mine:
            end = end_of(r)
            tokens = max(0, (r.tokens_in or 0) + (r.tokens_out or 0))
            cost = sane_cost(r.cost_eur)
            ev = shown.get(r.id)
            steps, tool_calls, tool_errors = _counters(r, ev)
            if ev is not None:  # a run that zeroed its own counters is booked by its events
                tokens, cost = max(tokens, ev.tokens), max(cost, sane_cost(ev.cost_eur))
            agent = r.agent if spend_as is None else spend_as(r)
            for scope in scopes_of(agent, r.labels, label_budgets if agent == r.agent else ()):
                for period in PERIODS:
                    acc = ledger[(scope, period, period_key(period, end, tz))]
                    acc[0] += cost
                    acc[1] += 1
                    acc[2] += tokens
                    acc[3] += r.cost_unpriced_tokens or 0
            b = bucket_of(end)
            out.oldest_bucket = b if out.oldest_bucket is None else min(out.oldest_bucket, b)
            acc = rollups[(agent, b)]
            for j, v in enumerate((1, int(r.status in STOPPED), steps, tool_calls, tool_errors, cost,
                                   tokens, r.cost_unpriced_tokens)):
                acc[j] += max(0, v or 0)
            for tool, calls, errors in counts.get(r.id, ()):
                t = tools[(agent, b, tool)]
                t[0] += calls
                t[1] += errors
        out.booked.extend(mine)
    if ledger:
        _upsert(conn, spend_ledger, ("scope", "period", "period_key"),
                [dict(scope=s, period=p, period_key=k, cost_eur=v[0], runs=v[1], tokens=v[2], unpriced_tokens=v[3],
                      updated_at=now) for (s, p, k), v in ledger.items()],
                add=("cost_eur", "runs", "tokens", "unpriced_tokens"), replace=("updated_at",))
    if rollups:
        names = ("runs", "stopped", "steps", "tool_calls", "tool_errors", "cost_eur", "tokens", "unpriced_tokens")
        _upsert(conn, agent_rollups, ("agent", "bucket_at"),
                [dict(agent=a, bucket_at=b, **dict(zip(names, v))) for (a, b), v in rollups.items()], add=names)
    if tools:
        _upsert(conn, agent_rollup_tools, ("agent", "bucket_at", "tool"),
                [dict(agent=a, bucket_at=b, tool=t, calls=v[0], errors=v[1]) for (a, b, t), v in tools.items()],
                add=("calls", "errors"))
    return out


def _upsert(conn: Connection, table: Table, keys: tuple[str, ...], rows: list[dict[str, Any]], *,
            add: Iterable[str] = (), replace: Iterable[str] = ()) -> None:
    """INSERT ... ON CONFLICT DO UPDATE SET col = col + excluded.col: concurrent bookers add, never overwrite."""
    stmt = dialects.of(conn).insert(table)
    sets = {c: table.c[c] + stmt.excluded[c] for c in add}
    sets.update({c: stmt.excluded[c] for c in replace})
    stmt = stmt.on_conflict_do_update(index_elements=[table.c[k] for k in keys], set_=sets)
    # Sorted: two PostgreSQL daemons upserting the same rows lock them in one order (no deadlock).
    rows = sorted(rows, key=lambda r: tuple(str(r[k]) for k in keys))
    for i in range(0, len(rows), CHUNK):
        conn.execute(stmt, rows[i : i + CHUNK])


# -- reads for drift, `budgets` and `top` ------------------------------------------------


def rollup_totals(conn: Connection, since: dt.datetime, until: dt.datetime | None = None, agent: str | None = None
                  ) -> dict[str, Totals]:
    c = agent_rollups.c
    cond = [c.bucket_at >= since]
    if until is not None:
        cond.append(c.bucket_at < until)
    if agent is not None:
        cond.append(c.agent == agent)
    q = (select(c.agent, func.sum(c.runs), func.sum(c.stopped), func.sum(c.steps), func.sum(c.tool_calls),
                func.sum(c.cost_eur)).where(and_(*cond)).group_by(c.agent))
    return {a: Totals(int(n or 0), int(s or 0), int(st or 0), int(tc or 0), float(cost or 0.0))
            for a, n, s, st, tc, cost in conn.execute(q)}


def top_tool(conn: Connection, agent: str, since: dt.datetime) -> tuple[str, int] | None:
    c = agent_rollup_tools.c
    q = (select(c.tool, func.sum(c.calls).label("n")).where(and_(c.agent == agent, c.bucket_at >= since))
         .group_by(c.tool).order_by(desc("n"), c.tool).limit(1))
    row = conn.execute(q).first()
    return (row.tool, int(row.n)) if row else None


def ledger_rows(conn: Connection, keys: Mapping[str, str]) -> Sequence[Row[Any]]:
    cond = or_(*(and_(spend_ledger.c.period == p, spend_ledger.c.period_key == k) for p, k in keys.items()))
    return conn.execute(select(spend_ledger).where(cond).order_by(spend_ledger.c.scope, spend_ledger.c.period)).all()


def prune(conn: Connection, rollups_before: dt.datetime, ledger_before_month: str) -> None:
    """Rollups older than the drift baseline, ledger periods older than a year: they only grow otherwise."""
    conn.execute(delete(agent_rollups).where(agent_rollups.c.bucket_at < rollups_before))
    conn.execute(delete(agent_rollup_tools).where(agent_rollup_tools.c.bucket_at < rollups_before))
    conn.execute(delete(spend_ledger).where(spend_ledger.c.period_key < ledger_before_month))


def month_key_ago(now: dt.datetime, tz: dt.tzinfo, months: int = 13) -> str:
    local = now.astimezone(tz)
    y, m = divmod(local.year * 12 + local.month - 1 - months, 12)
    return period_key(MONTH, dt.datetime(y, m + 1, 1, tzinfo=dt.timezone.utc), dt.timezone.utc)


def period_report(conn: Connection, config: Config, now: dt.datetime, published: Mapping[str, Any] | None = None
                  ) -> list[PeriodState]:
    """Every period budget's state as the daemon computes it, from the store alone (for `budgets`).

    `published`: the daemon's last "budget_state" (its burn rates; omitted when stale)."""
    from watchdog.core.periods import DAY, build_states, live_by_scope, period_bounds, sum_spend, zone

    from watchdog.core.whose import owner_key

    tz = zone(config.pricing.budget_tz)
    keys = {p: period_key(p, now, tz) for p in PERIODS}
    # issue 32, as far as the store alone tells: a run of a profile with `owners` whose owner column
    # (PostgreSQL's login) the profile does not name counts under its owner (the daemon also proves
    # owners the store cannot show: the Unix user of an attested run, an OTLP sender).
    bound = {a: tuple(p.owners) for a, p in config.agents.items() if getattr(p, "owners", ())}

    def key_of(rid: str, agent: str, owner: Any, source: Any = None) -> str:
        if agent not in bound or owner is None:
            return agent
        return agent if owner in bound[agent] else owner_key(owner)

    spend, unbooked, _n, _l = read_period_spend(conn, keys, period_bounds(DAY, now, tz)[0],
                                                period_bounds(MONTH, now, tz)[0], (), sorted(bound), key_of)
    label_budgets = tuple(config.budgets)
    q = select(runs.c.id, runs.c.agent, runs.c.owner, runs.c.cost_eur, cast(runs.c.labels, Text).label("labels")
               ).where(runs.c.status.in_(lc.ACTIVE_STATUSES))
    active = [(r, key_of(r.id, r.agent, r.owner)) for r in conn.execute(q).all()]
    labels = {r.id: parse_labels(r.labels) if key == r.agent else None for r, key in active}
    live = live_by_scope([(r.id, key, r.cost_eur) for r, key in active], label_budgets, labels.get)
    spent, agents = sum_spend(spend, unbooked, live, label_budgets)
    rates: dict[tuple[object, ...], object] = {}
    for p in (published or {}).get("periods") or []:
        if isinstance(p, dict) and p.get("rate_eur_per_min") is not None:
            rates[(p.get("scope"), p.get("name"), p.get("period"), p.get("key"))] = p["rate_eur_per_min"]
    by_key = {scope_agent(a): ("agent", a) for a in agents}
    by_key.update({b.scope: ("labels", b.name) for b in label_budgets})

    def rate_of(scope: str, period: str, key: str, s: float, start: dt.datetime) -> float | None:
        kind, name = by_key.get(scope, (None, None))
        r = rates.get((kind, name, period, key))
        return float(r) if isinstance(r, (int, float)) and not isinstance(r, bool) else None

    return build_states(spent, agents, config.profile, label_budgets, now, tz, rate_of)
