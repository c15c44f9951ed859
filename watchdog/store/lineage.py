"""The SQL of one run and its ancestors, for the SDK: its records' roll-up into its parents,
the status it obeys (its own and its ancestors'), the keep-alive and budget read-back of a
paused run, the pause and the stop request a guard writes, a partial result, the in-flight
status poll, the parent of a child opening in another process.

Rendered once per run (the lineage is fixed when the run opens) or once per backend; statuses
come from the lifecycle, never spelled here. A statement is `(sql, params)` for the SDK's
Writer (watchdog.store.agent_writes): the SDK chooses how it goes (buffered through an outage
or not), the store spells it.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from watchdog.core import budgets as bud
from watchdog.core import lifecycle as lc
from watchdog.store.dialects import Dialect

Statement = tuple[str, Sequence[Any]]  # (SQL, its parameters): one step of a record's transaction


class Writer(Protocol):
    """What these verbs need of the SDK's Writer (watchdog.store.agent_writes.Writer)."""

    dialect: Dialect
    sql: Any  # the backend's AgentSQL

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

_STOPPED = ", ".join(f"'{s}'" for s in (lc.STOPPING, lc.KILLED, lc.LOST))
# The status a child's records see first: a stop anywhere in its lineage, then a pause, then its own.
_RANK = f"CASE WHEN status IN ({_STOPPED}) THEN 0 WHEN status = '{lc.PAUSED}' THEN 1 ELSE 2 END"
_HELD = f"'{lc.RUNNING}', '{lc.PAUSED}'"


def status_move_sql(to: lc.Status, was: lc.Status | Iterable[lc.Status], sets: str, ph: str) -> str:
    """`UPDATE runs SET status = 'to', <sets> WHERE id = <ph> AND status IN (<was>)`: a fixed status
    move the SDK renders once and then executes on its hot path without watchdog.store.run_rows.move
    (which would check it on every write). Each was -> to is checked against lifecycle.STATUS_MOVES
    here, when the SQL is rendered: a move the table does not list raises IllegalStatusMove at once,
    never a record later. The parameters: those of `sets`, then the run's id."""
    froms = (was,) if isinstance(was, str) else tuple(was)
    if not froms:
        raise ValueError("was: a status move needs at least one status it moves from")
    for current in froms:
        lc.check_status_move(current, to)
    listed = ", ".join(f"'{s}'" for s in froms)
    cond = f"status = {listed}" if len(froms) == 1 else f"status IN ({listed})"
    return f"UPDATE runs SET status = '{to}', {sets} WHERE id = {ph} AND {cond}"


class RunStatus(NamedTuple):
    """A run's status as the SDK obeys it (own or an ancestor's: `id` says whose)."""

    status: str
    stop_reason: str | None
    stop_detail: str | None
    id: str


class Lineage:
    """The SQL of one run and its ancestors (none for a top-level run), rendered once."""

    def __init__(self, dialect: Dialect, run_id: str, ancestors: tuple[str, ...] = ()):
        self.run_id = run_id
        self.ancestors = tuple(ancestors)
        self._dialect = dialect
        self._seen = dialect.seen  # a time as the store's clock placeholder takes it
        ph, greatest = dialect.ph, dialect.greatest
        ids = (run_id, *self.ancestors)
        self.ids = ids
        in_ids = ", ".join([ph] * len(ids))
        self.status_sql = (f"SELECT status, stop_reason, stop_detail, id FROM runs WHERE id IN ({in_ids}) "
                           f"ORDER BY {_RANK}, CASE WHEN id = {ph} THEN 0 ELSE 1 END LIMIT 1")
        self.status_params = (*ids, run_id)
        # Keep-alive while held: the run and its ancestors (a parent waits on its paused child).
        clock = dialect.clock_ph  # the store's clock (watchdog.store.dialects)
        self.beat_sql = (f"UPDATE runs SET last_seen_at = {greatest}(last_seen_at, {clock}) "
                         f"WHERE id IN ({in_ids}) AND status IN ({_HELD})")
        if self.ancestors:
            up = ", ".join([ph] * len(self.ancestors))
            self.rollup_sql = (
                f"UPDATE runs SET steps = steps + {ph}, tool_calls = tool_calls + {ph}, "
                f"tool_errors = tool_errors + {ph}, tokens_in = tokens_in + {ph}, tokens_out = tokens_out + {ph}, "
                f"cost_eur = cost_eur + {ph}, last_seen_at = {greatest}(last_seen_at, {clock}) WHERE id IN ({up})")
            self.parent_sql = f"UPDATE runs SET parent_id = {ph} WHERE id = {ph}"
        self.budgets_sql = (f"SELECT {', '.join(bud.RUN_BUDGET_KEYS)}, resumes FROM runs WHERE id = {ph}")
        # The guard's pause: running → paused (the daemon records and alerts it); a pause nobody
        # answered, with no daemon to stop it: paused → stopping; a partial result.
        self.pause_sql = _pause_sql(dialect)
        self.give_up_sql = _give_up_sql(dialect)
        self.partial_sql = f"UPDATE runs SET partial = {ph} WHERE id = {ph}"

    def record_statements(self, counts: tuple[Any, ...], at: Any) -> list[Statement]:
        """What a record adds to the ancestors' rows, then the status the run obeys (`at`:
        Dialect.seen, the store's clock)."""
        out: list[Statement] = []
        if self.ancestors:
            out.append((self.rollup_sql, (*counts, at, *self.ancestors)))
        out.append((self.status_sql, self.status_params))
        return out

    def status(self) -> Statement:
        """The status the run obeys: the first of a stop in its lineage, a pause, its own."""
        return self.status_sql, self.status_params

    def set_parent(self, parent_id: str) -> Statement:
        return self.parent_sql, (parent_id, self.run_id)

    def beat(self, now: dt.datetime) -> Statement:
        """Keep-alive of a held run and its ancestors."""
        return self.beat_sql, (self._seen(now), *self.ids)

    def pause(self, reason: str, detail: str, now: dt.datetime) -> list[Statement]:
        """running → paused, written by the run's own guard: the status only (the daemon records
        and alerts a pause it did not request), then the status the run must obey."""
        return [(self.pause_sql, (reason, detail, self._seen(now), self.run_id)), self.status()]

    def give_up(self, now: dt.datetime) -> Statement:
        """paused → stopping: nobody answered the pause and no daemon stopped it."""
        return self.give_up_sql, (self._seen(now), self.run_id)

    def stop_request(self, reason: str, detail: str, now: dt.datetime) -> list[Statement]:
        """What an in-process guard trip writes: running → stopping on the run's own row with the
        guard's reason, nothing else (the daemon sees a stop it did not request, records it and
        words the alert itself). Once per run at most: rendered on first use, once per backend."""
        return [(_stop_request_sql(self._dialect), (reason, detail, self._seen(now), self.run_id))]

    def partial(self, text: str) -> Statement:
        return self.partial_sql, (text, self.run_id)

    def read_budgets(self, writer: Writer) -> tuple[dict[str, float], int] | None:
        """The run's own budget columns (the non-NULL ones) and its resumes, as a resume left
        them; None when the row is gone."""
        rows = writer.query(self.budgets_sql, (self.run_id,))
        if not rows:
            return None
        *values, resumes = rows[0]
        return {k: v for k, v in zip(bud.RUN_BUDGET_KEYS, values) if v is not None}, int(resumes or 0)


# The run's own status moves, rendered once per backend (not per run: the lineage plays no part).
@functools.cache
def _pause_sql(d: Dialect) -> str:
    return status_move_sql(lc.PAUSED, lc.RUNNING, f"stop_reason = {d.ph}, stop_detail = {d.ph}, paused_at = {d.clock_ph}",
                           d.ph)


@functools.cache
def _give_up_sql(d: Dialect) -> str:
    return status_move_sql(lc.STOPPING, lc.PAUSED, f"stop_requested_at = {d.clock_ph}", d.ph)


@functools.cache
def _stop_request_sql(d: Dialect) -> str:
    return status_move_sql(lc.STOPPING, lc.RUNNING, f"stop_reason = {d.ph}, stop_detail = {d.ph}, "
                           f"stop_requested_at = {d.clock_ph}", d.ph)


@functools.cache
def _poll_sql(d: Dialect, n: int) -> str:
    return f"SELECT status, stop_reason, stop_detail, id FROM runs WHERE id IN ({', '.join([d.ph] * n)})"


def poll_statuses(writer: Writer, run_ids: Sequence[str]) -> list[RunStatus]:
    """The in-flight poll: the status of the runs (and ancestors) with a tool running."""
    if not run_ids:
        return []
    return [RunStatus(*r) for r in writer.query(_poll_sql(writer.dialect, len(run_ids)), tuple(run_ids))]


PARENT_COLUMNS = ("id", "agent", "status", "parent_id", "steps", "tool_calls", "cost_eur", "tokens_in", "tokens_out",
                  "started_at", "resumes", *bud.RUN_BUDGET_KEYS)


@dataclass(frozen=True)
class ParentRun:
    """A parent run as a child opening in another process reads it: its status, totals, own
    budgets (`asked`, the non-NULL columns) and own parent."""

    id: str
    agent: str
    status: str
    parent_id: str | None
    steps: int
    tool_calls: int
    cost_eur: float
    tokens: int  # in + out
    started_at: dt.datetime | None
    resumes: int
    asked: dict[str, float] = field(default_factory=dict)

    def budget_row(self) -> dict[str, Any]:
        """The run as a mapping for watchdog.core.budgets.for_run."""
        return {**self.asked, "resumes": self.resumes}


@functools.cache
def _parent_sql(d: Dialect) -> str:
    return f"SELECT {', '.join(PARENT_COLUMNS)} FROM runs WHERE id = {d.ph}"


def parent_run(writer: Writer, run_id: str) -> ParentRun | None:
    """The run `run_id` as a parent, or None when the store has no such run."""
    rows = writer.query(_parent_sql(writer.dialect), (run_id,))
    if not rows:
        return None
    m = dict(zip(PARENT_COLUMNS, rows[0]))
    return ParentRun(
        id=m["id"], agent=m["agent"], status=m["status"], parent_id=m["parent_id"], steps=int(m["steps"] or 0),
        tool_calls=int(m["tool_calls"] or 0), cost_eur=float(m["cost_eur"] or 0.0),
        tokens=int(m["tokens_in"] or 0) + int(m["tokens_out"] or 0),
        started_at=writer.dialect.parse_ts(m["started_at"]), resumes=int(m["resumes"] or 0),
        asked={k: m[k] for k in bud.RUN_BUDGET_KEYS if m[k] is not None})
