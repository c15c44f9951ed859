"""A run another writer owns, as the commands around it read it: a gateway's reads and appends (the MCP proxy,
the LiteLLM callback), and `exec`'s reads of its own run.

What a gateway (the MCP proxy, the LiteLLM callback) reads and appends for a run another
writer owns (exec's, the SDK's): it reads the run's row and appends events marked with its
`source`; it never updates the run's row (on PostgreSQL rows belong to their writer; the daemon
folds the witness's events into its own counters, one call counted once).

Witness events take sequence numbers from WITNESS_SEQ_BASE up (per run): the run's own writer
numbers its records 1, 2, ... in its process and would lose a record whose number a witness had
taken first; a billion records apart, the two ranges never meet.

The SQL `agent-watchdog exec` reads of its own run: what the daemon decided about it, and
whether the command reported anything itself (its own records, a child run's roll-up, spans).

Rendered once per dialect (the SDK's write path, watchdog.store.agent_writes, runs it).
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import TextClause, bindparam, func, select, text
from sqlalchemy.engine import Engine, Connection
from sqlalchemy.exc import IntegrityError

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.store.dialects import Dialect
from watchdog.store.lineage import Writer
from watchdog.store.schema import events, runs


# Two witnesses appending to one run at the same moment on PostgreSQL may pick the same number.
_SEQ_ATTEMPTS = 5
WITNESS_SEQ_BASE = 1 << 30  # events.seq is a 32-bit integer >= 0


@dataclass(frozen=True)
class RunState:
    """One run as a gateway sees it before admitting a call."""

    id: str
    agent: str
    status: str
    stop_reason: str | None
    stop_detail: str | None
    source: str
    started_at: dt.datetime | None
    last_seen_at: dt.datetime | None
    steps: int
    tool_calls: int
    tokens: int
    cost_eur: float
    resumes: int
    labels: Any
    asked: dict[str, float]  # the run's own budget columns (non-NULL ones)

    def row(self) -> dict[str, Any]:
        """The run as a mapping for watchdog.core.budgets.for_run."""
        return {**self.asked, "resumes": self.resumes}


_COLUMNS = (runs.c.id, runs.c.agent, runs.c.status, runs.c.stop_reason, runs.c.stop_detail, runs.c.source,
            runs.c.started_at, runs.c.last_seen_at, runs.c.steps, runs.c.tool_calls, runs.c.tokens_in,
            runs.c.tokens_out, runs.c.cost_eur, runs.c.resumes, runs.c.labels,
            *(runs.c[k] for k in RUN_BUDGET_KEYS))


def run_state(engine: Engine, run_id: str) -> RunState | None:
    """The run `run_id` (status, counters, own budgets), or None when the store has no such run."""
    with engine.connect() as conn:
        r = conn.execute(select(*_COLUMNS).where(runs.c.id == run_id)).first()
    if r is None:
        return None
    m = r._mapping
    return RunState(
        id=m["id"], agent=m["agent"], status=m["status"], stop_reason=m["stop_reason"],
        stop_detail=m["stop_detail"], source=m["source"] or "sql", started_at=m["started_at"],
        last_seen_at=m["last_seen_at"], steps=int(m["steps"] or 0), tool_calls=int(m["tool_calls"] or 0),
        tokens=int(m["tokens_in"] or 0) + int(m["tokens_out"] or 0), cost_eur=float(m["cost_eur"] or 0.0),
        resumes=int(m["resumes"] or 0), labels=m["labels"],
        asked={k: m[k] for k in RUN_BUDGET_KEYS if m[k] is not None},
    )


class OwnStatus(NamedTuple):
    """A run's status and why it stopped (a tuple: `status, reason, detail = ...` still reads it)."""

    status: str
    stop_reason: str | None
    stop_detail: str | None


def own_status(writer: Any, run_id: str) -> OwnStatus | None:
    """`run_status` on the SDK writer's pooled connection (the hot path: one read per call)."""
    rows = writer.query(writer.sql.select_status, (run_id,))
    if not rows:
        return None
    status, reason, detail = rows[0][:3]
    return OwnStatus(status, reason, detail)


def run_status(engine: Engine, run_id: str) -> OwnStatus | None:
    """(status, stop_reason, stop_detail) of a run, or None when there is no such run."""
    with engine.connect() as conn:
        r = conn.execute(select(runs.c.status, runs.c.stop_reason, runs.c.stop_detail)
                         .where(runs.c.id == run_id)).first()
    return None if r is None else OwnStatus(r.status, r.stop_reason, r.stop_detail)


@functools.cache
def _insert_sql(columns: tuple[str, ...]) -> TextClause:
    """INSERT without RETURNING: SQLAlchemy's insert() returns the new id on PostgreSQL, which
    the gateway's role may not read (sql/postgres-roles.sql: of another writer's run it reads only
    run_id and seq). The column names are this module's own (append_witness_event's allowed)."""
    sql = text(f"INSERT INTO events ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})")
    return sql.bindparams(*(bindparam(c, type_=events.c[c].type) for c in columns))  # the columns' own types


def append_witness_event(engine: Engine, run_id: str, *, source: str, kind: str, at: dt.datetime,
                         call_id: str | None = None, **fields: Any) -> int:
    """Append one event a witness saw to `run_id` (never touching the run's row); its seq."""
    allowed = {"tool", "args_hash", "ok", "error_class", "error_msg", "duration_s", "model", "tokens_in",
               "tokens_out", "cost_eur", "cached_tokens_in", "reasoning_tokens", "attempt", "progress"}
    bad = set(fields) - allowed
    if bad:
        raise ValueError(f"append_witness_event: unknown fields {sorted(bad)}")
    for attempt in range(_SEQ_ATTEMPTS):
        try:
            with engine.begin() as conn:
                top = conn.execute(select(func.max(events.c.seq)).where(
                    events.c.run_id == run_id, events.c.seq >= WITNESS_SEQ_BASE)).scalar()
                seq = int(top) + 1 if top is not None else WITNESS_SEQ_BASE
                values = dict(run_id=run_id, seq=seq, at=at, kind=kind, source=source, call_id=call_id, **fields)
                conn.execute(_insert_sql(tuple(values)), values)
            return seq
        except IntegrityError:
            if attempt == _SEQ_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


# -- The SQL `agent-watchdog exec` reads of its own run: what the daemon decided about it, and -----------

STATE_COLUMNS = ("status", "stop_reason", "stop_detail", "steps", "tool_calls", "last_seen_at")


@dataclass(frozen=True)
class ExecRunState:
    status: str
    stop_reason: str | None
    stop_detail: str | None
    steps: int
    tool_calls: int
    last_seen_at: object  # compared for change only: text on SQLite, a datetime on PostgreSQL


@functools.cache
def state_sql(dialect: Dialect) -> str:
    ph = dialect.ph
    return f"SELECT {', '.join(STATE_COLUMNS)} FROM runs WHERE id = {ph}"


def read_state(writer: Writer, run_id: str) -> ExecRunState | None:
    """The run's row as exec needs it, or None when it is not there (deleted under us)."""
    rows = writer.query(state_sql(writer.dialect), (run_id,))
    if not rows:
        return None
    status, reason, detail, steps, calls, seen = rows[0][:6]
    return ExecRunState(str(status), reason, detail, int(steps or 0), int(calls or 0), seen)


def active_exec_roots(conn: Connection, host: str, kill_mode: str) -> list[tuple[str, int, float]]:
    """(run id, pid, create time) of this host's active exec'd runs of `kill_mode` (the daemon
    remembers their trees: watchdog.daemon.stops.runtree.TreeMemory). Candidates only: what the
    daemon acts on is checked against the sealed attestation."""
    from sqlalchemy import and_, select

    from watchdog.store.schema import runs

    q = select(runs.c.id, runs.c.pid, runs.c.pid_create_time).where(and_(
        runs.c.status.in_(list(lc.ACTIVE_STATUSES)), runs.c.host == host, runs.c.source == lc.Source.EXEC.value,
        runs.c.kill_mode == kill_mode))
    return [(r.id, r.pid, r.pid_create_time) for r in conn.execute(q)]


@functools.cache
def _killed_child_sql(dialect: Dialect) -> str:
    return (f"SELECT stop_reason, stop_detail FROM runs WHERE parent_id = {dialect.ph} AND status = '{lc.KILLED}' "
            f"AND stop_reason IS NOT NULL ORDER BY ended_at DESC LIMIT 1")


def killed_child(writer: Writer, run_id: str) -> tuple[str, str | None] | None:
    """(stop reason, detail) of a child run of `run_id` that was stopped (an in-process guard of
    the SDK inside exec's command, holding it to exec's run's budgets), or None."""
    rows: list[Any] = writer.query(_killed_child_sql(writer.dialect), (run_id,))
    if not rows:
        return None
    reason, detail = rows[0][:2]
    return str(reason), detail
