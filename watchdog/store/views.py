"""Read models over the store: run records (the JSON of `runs`/`show`), top tools, budgets.

Shared by the CLI, the daemon's alerts, `top` and `postmortem`, so every
surface shows the same numbers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, desc, or_, select
from sqlalchemy.engine import Connection

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import RUN_BUDGETS, effective_budgets
from watchdog.core.config import Config
from watchdog.errors import StoreError
from watchdog.store.settings import CONFIG_KEY, get as published_value
from watchdog.store.rows import RunRow
from watchdog.store.run_rows import tool_calls_sum, tool_errors_sum, tool_events
from watchdog.store.schema import daemons, events, interventions, runs, WHOLE_RUN


@dataclass(frozen=True)
class ToolStat:
    name: str
    calls: int
    errors: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "calls": self.calls, "errors": self.errors}


def published_profiles(conn: Connection, config: Config) -> Config:
    """`config` judged by the profiles the daemon published in the store.

    Without a config file the CLI would otherwise judge runs by the built-in
    defaults while the daemon applies its own profiles: with this, the CLI shows
    the budgets the daemon actually enforces."""
    value = published_value(conn, CONFIG_KEY)
    return config.with_published(value)


def resolve_run_id(conn: Connection, run_id: str, *, owner: str | None = None) -> str:
    """A full id or a unique prefix (8 characters are usually enough); with `owner`, only that
    owner's runs (another owner's run is "no such run", as if it did not exist)."""
    run_id = (run_id or "").strip().lower()
    if len(run_id) < 4:
        raise StoreError(f"run id {run_id!r}: give at least 4 characters of the run id")
    # A whole id names its run even when a longer id begins with it: on SQLite a writer may store
    # an id longer than 32 characters that starts with a victim's, to make the victim's whole id
    # (the one every alert's command names) "ambiguous".
    exact = select(runs.c.id).where(runs.c.id == run_id)
    hit = conn.execute(exact if owner is None else exact.where(runs.c.owner == owner)).scalar()
    if hit is not None:
        return str(hit)
    # A literal prefix: "_" and "%" in what the user typed are not LIKE wildcards.
    q = select(runs.c.id).where(runs.c.id.startswith(run_id, autoescape=True)).limit(2)
    rows = conn.execute(q if owner is None else q.where(runs.c.owner == owner)).all()
    if not rows:
        raise StoreError(f"run id {run_id!r}: no such run")
    if len(rows) > 1:
        raise StoreError(f"run id {run_id!r}: ambiguous prefix, give more characters")
    return str(rows[0].id)


def tool_stats(conn: Connection, run_ids: Iterable[str]) -> dict[str, list[ToolStat]]:
    """Per run, its tools by calls (then errors) descending."""
    run_ids = list(run_ids)
    out: dict[str, list[ToolStat]] = {rid: [] for rid in run_ids}
    for i in range(0, len(run_ids), 500):
        chunk = run_ids[i : i + 500]
        q = (
            select(events.c.run_id, events.c.tool, tool_calls_sum().label("calls"),
                   tool_errors_sum().label("errors"))
            .where(and_(events.c.run_id.in_(chunk), tool_events()))
            .group_by(events.c.run_id, events.c.tool)
        )
        for rid, tool, calls, errors in conn.execute(q):
            if calls:  # a failed result whose call is not in the run (a writer's own rows) is no tool of it
                out[rid].append(ToolStat(tool, int(calls), int(errors or 0)))
    for rid in out:
        out[rid].sort(key=lambda t: (-t.calls, -t.errors, t.name))
    return out


def _iso(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.timezone.utc).isoformat() if value else None


def run_record(row: Any, tools: list[ToolStat], config: Config, now: dt.datetime,
               budgets: Any = None) -> dict[str, Any]:
    """The public JSON record of a run (`runs --json`, `show --json`). `row`: a RunRow, or a row
    of `runs` as the listing reads it (not turned into a RunRow: a page may hold 100,000)."""
    budgets = budgets or effective_budgets(config.profile(row.agent), row)
    end = row.ended_at or now
    top = tools[0] if tools else None
    return {
        "id": row.id,
        "agent": row.agent,
        "status": row.status,
        "stop_reason": row.stop_reason,
        "stop_detail": row.stop_detail,
        "steps": row.steps,
        "tool_calls": row.tool_calls,
        "tool_errors": row.tool_errors,
        "tokens_in": row.tokens_in,
        "tokens_out": row.tokens_out,
        "cost_eur": round(row.cost_eur, 6),
        # Tokens of steps no price table priced (yet): their cost is not in cost_eur. 0 = all priced.
        "cost_unpriced_tokens": row.cost_unpriced_tokens,
        "cached_tokens_in": row.cached_tokens_in,
        "reasoning_tokens": row.reasoning_tokens,
        "host": row.host,
        "pid": row.pid,
        "kill_mode": row.kill_mode,
        "parent_id": getattr(row, "parent_id", None),
        "source": getattr(row, "source", None) or "sql",
        "labels": row.labels,
        "started_at": _iso(row.started_at),
        "last_seen_at": _iso(row.last_seen_at),
        "stop_requested_at": _iso(row.stop_requested_at),
        "ended_at": _iso(row.ended_at),
        "duration_s": round((end - row.started_at).total_seconds(), 3),
        "progress": row.progress,
        "paused_at": _iso(getattr(row, "paused_at", None)),
        "resumes": getattr(row, "resumes", 0) or 0,
        "partial": getattr(row, "partial", None),
        "top_tool": top.to_json() if top else None,
        "budgets": {b.key: getattr(budgets, b.key) for b in RUN_BUDGETS},
    }


# What a row written by another program can make our column types or records raise
# (a timestamp in another format, text where a number belongs).
UNREADABLE = (ValueError, TypeError, ArithmeticError)


def list_runs(conn: Connection, config: Config, now: dt.datetime, *, all_runs: bool = False, limit: int = 200,
              before: str | None = None, on_bad_row: Callable[[str, Exception], None] | None = None,
              statuses: Iterable[str] | None = None, agent: str | None = None, status: str | None = None,
              host: str | None = None, labels: dict[str, str] | None = None,
              owner: str | None = None) -> list[dict[str, Any]]:
    """Run records, newest first: one page read from the (started_at, id) index; `before`: the
    last run id of the previous page. Ended runs carry their sealed top tool: only the others'
    events (active runs, runs ended since the leader's last tick) are aggregated. A row that
    cannot be read is passed to `on_bad_row(run_id, error)` and left out: one bad row never
    hides the others. Filters (the web view's): `statuses` (overrides all_runs), `agent`,
    `host`, `labels` (each key = value), `owner` (the login that wrote the run)."""
    q = select(*WHOLE_RUN).order_by(desc(runs.c.started_at), desc(runs.c.id)).limit(limit)
    if statuses is not None:
        q = q.where(runs.c.status.in_(list(statuses)))
    elif status is not None:  # one status, active or ended (`runs --status killed`)
        q = q.where(runs.c.status == status)
    elif not all_runs:
        q = q.where(runs.c.status.in_(lc.ACTIVE_STATUSES))
    if agent is not None:
        q = q.where(runs.c.agent == agent)
    if host is not None:
        q = q.where(runs.c.host == host)
    if owner is not None:
        q = q.where(runs.c.owner == owner)
    for key, value in (labels or {}).items():
        q = q.where(runs.c.labels[key].as_string() == value)
    if before is not None:
        at = conn.execute(select(runs.c.started_at).where(runs.c.id == before)).scalar()
        if at is None:
            raise StoreError(f"run id {before!r}: no such run")
        q = q.where(or_(runs.c.started_at < at, and_(runs.c.started_at == at, runs.c.id < before)))
    rows: list[Any]
    try:
        rows = list(conn.execute(q).all())
    except UNREADABLE:  # read again one row at a time, to name the bad ones and keep the rest
        rows = []
        for (run_id,) in conn.execute(q.with_only_columns(runs.c.id)).all():
            try:
                rows.append(conn.execute(select(*WHOLE_RUN).where(runs.c.id == run_id)).one())
            except UNREADABLE as exc:
                if on_bad_row is not None:
                    on_bad_row(run_id, exc)
    stats = tool_stats(conn, [r.id for r in rows if r.top_tool_calls is None])
    memo: dict[tuple[Any, ...], Any] = {}  # few distinct (agent, own budgets) among many runs

    def budgets_of(r: Any) -> Any:
        key = (r.agent, *(r._mapping[b.key] for b in RUN_BUDGETS))
        b = memo.get(key)
        if b is None:
            b = memo[key] = effective_budgets(config.profile(r.agent), r)
        return b

    out = []
    for r in rows:
        try:
            tools = stats[r.id] if r.top_tool_calls is None else sealed_tools(r)
            out.append(run_record(r, tools, config, now, budgets_of(r)))
        except UNREADABLE as exc:
            if on_bad_row is not None:
                on_bad_row(r.id, exc)
    return out


def sealed_tools(row: Any) -> list[ToolStat]:
    """The top tool sealed on an ended run's row (watchdog.store.retention)."""
    if not row.top_tool:
        return []
    return [ToolStat(row.top_tool, int(row.top_tool_calls), int(row.top_tool_errors or 0))]


def load_run(conn: Connection, run_id: str) -> RunRow:
    """The run `run_id` (a full id: see resolve_run_id); StoreError when it is missing or unreadable."""
    try:
        row = conn.execute(select(*WHOLE_RUN).where(runs.c.id == run_id)).first()
    except UNREADABLE as exc:
        raise StoreError(f"run {run_id[:8]}: unreadable row ({' '.join(str(exc).split())[:200]})") from exc
    if row is None:
        raise StoreError(f"run id {run_id!r}: no such run")
    return RunRow.from_mapping(row._mapping)


def run_detail(conn: Connection, run_id: str, config: Config, now: dt.datetime, *,
               last_events: int = 15, owner: str | None = None) -> dict[str, Any]:
    """`show --json`: the run with its tools, last events, children (with `owner`: only that
    owner's) and interventions."""
    row = load_run(conn, run_id)
    stats = tool_stats(conn, [row.id])[row.id]
    try:
        record = run_record(row, stats, config, now)
    except UNREADABLE as exc:
        raise StoreError(f"run {run_id[:8]}: unreadable row ({' '.join(str(exc).split())[:200]})") from exc
    record["tools"] = [t.to_json() for t in stats]
    evs = conn.execute(
        select(events).where(events.c.run_id == row.id).order_by(desc(events.c.seq)).limit(last_events)
    ).all()
    record["last_events"] = [event_json(e) for e in reversed(evs)]
    ivs = conn.execute(
        select(interventions).where(interventions.c.run_id == row.id).order_by(interventions.c.id)
    ).all()
    from watchdog.store.run_rows import children_of

    record["children"] = [
        {"id": c.id, "agent": c.agent, "status": c.status, "stop_reason": c.stop_reason, "steps": c.steps,
         "tool_calls": c.tool_calls, "cost_eur": round(c.cost_eur, 6), "partial": c.partial}
        for c in children_of(conn, row.id) if owner is None or c.owner == owner
    ]
    record["interventions"] = [
        {"at": _iso(i.at), "action": i.action, "reason": i.reason, "detail": i.detail, "outcome": i.outcome,
         "actor": i.actor}
        for i in ivs
    ]
    return record


def event_json(e: Any) -> dict[str, Any]:
    return {
        "seq": e.seq, "at": _iso(e.at), "kind": e.kind, "tool": e.tool, "args_hash": e.args_hash,
        "ok": e.ok, "error_class": e.error_class, "error_msg": e.error_msg, "duration_s": e.duration_s,
        "model": e.model, "tokens_in": e.tokens_in, "tokens_out": e.tokens_out, "cost_eur": e.cost_eur,
        "cached_tokens_in": e.cached_tokens_in, "reasoning_tokens": e.reasoning_tokens,
        "progress": e.progress,
    }  # fmt: skip


@dataclass(frozen=True)
class DaemonLiveness:
    """Whether a daemon watches the store: the hosts whose lease is live, else when one last ticked."""

    live_hosts: tuple[str, ...]
    last_tick_at: dt.datetime | None  # the newest tick of any daemon (None: none ever ticked, or unreadable)

    @property
    def alive(self) -> bool:
        return bool(self.live_hosts)


def daemon_liveness(conn: Connection) -> DaemonLiveness:
    """The hosts whose daemon holds a live lease and when one was last seen (the one reading of
    watchdog.store.settings, which `status`, `runs` and `top` share). A table that does not
    read counts as no live daemon: a banner too many, never one missing."""
    from watchdog.store.settings import watchers

    try:
        w = watchers(conn)
    except UNREADABLE:
        return DaemonLiveness((), None)
    return DaemonLiveness(tuple(d.host for d in w.live), w.last_seen())
