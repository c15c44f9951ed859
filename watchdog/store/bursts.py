"""A burst of SDK records in one transaction (issue 35: batched writes where the writer allows it).

Records that several threads of one agent process make at the same moment (watchdog.sdk.burst)
are written together: every event row as it would be alone (its seq, its MAC, the same columns,
so the triggers, the checks, row-level security and the daemon's fold see exactly the same
events), and each run's counters once, summed over its records of the burst. Each run's status
is read back in the same transaction as its records, so a stop is seen by the record that
follows it, as with one record per transaction.

PostgreSQL: one call, `aw_burst(events, runs)` (revision 0017: a plpgsql function with the
invoker's rights, so row-level security, the triggers and the checks apply as to the login's own
INSERT and UPDATE), the records as one JSON array and the runs' summed updates as another: the
server parses and plans nothing per burst (the session keeps the function's plans; a multi-row
VALUES list cost ~65 us of planning a record, more than its insert), each run's row is locked in
id order, its counters added once and its status returned under that lock, then the events go
in; one round trip in autocommit. SQLite: one multi-row INSERT, one UPDATE per run and one
SELECT of the statuses, inside the writer's BEGIN IMMEDIATE (the write lock taken once).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from watchdog.store.agent_writes import EVENT_COLUMNS, AgentSQL, Statement

# Records per burst at most: 20 parameters each keeps SQLite's statement far below its 32,766
# parameters (PostgreSQL's JSON form has 2 whatever the size).
BURST_MAX_RECORDS = 256

# The counters of AgentSQL.update_run's parameters that a burst sums per run (steps .. unpriced).
_SUMMED = 9
_SEQ, _AT, _PROGRESS, _ID = 9, 10, 11, 12

Record = tuple[Sequence[Any], Sequence[Any]]  # (event: EVENT_COLUMNS, update: update_run's parameters)


def _per_run(records: Sequence[Record]) -> dict[str, list[Any]]:
    """Each run's update parameters summed over its records: the counters added, the highest seq
    and time, the progress of its last record that said one (as the records one by one leave it)."""
    runs: dict[str, list[Any]] = {}
    for _event, update in records:
        acc = runs.get(update[_ID])
        if acc is None:
            runs[update[_ID]] = list(update)
            continue
        for i in range(_SUMMED):
            acc[i] += update[i]
        acc[_SEQ] = max(acc[_SEQ], update[_SEQ])
        if update[_AT] is not None:
            acc[_AT] = update[_AT] if acc[_AT] is None else max(acc[_AT], update[_AT])
        if update[_PROGRESS] is not None:
            acc[_PROGRESS] = update[_PROGRESS]
    return runs


# The burst on PostgreSQL: one call of revision 0017's aw_burst (its plans kept by the session),
# each record a JSON array of EVENT_COLUMNS, each run's summed update one of update_run's parameters.
_BURST_SQL = "SELECT out_id, out_status, out_reason, out_detail FROM aw_burst(%s::jsonb, %s::jsonb)"


def _array_statement(ordered: Sequence[Record], runs: dict[str, list[Any]]) -> Statement:
    # default=str: a time given explicitly (a datetime) as the text PostgreSQL reads back.
    return _BURST_SQL, (json.dumps([event for event, _update in ordered], default=str),
                        json.dumps(list(runs.values()), default=str))


def _values_cte(sql: AgentSQL, insert: str, ev_params: list[Any], runs: dict[str, list[Any]]) -> Statement:
    """The burst as a multi-row VALUES list in a data-modifying WITH (revision 0015's form: kept
    for the benchmark's before/after in the same run, benchmarks/bench_bursts.py)."""
    b = sql.backend
    row = ("(%s::bigint, %s::bigint, %s::bigint, %s::bigint, %s::bigint, %s::float8, %s::bigint, %s::bigint, "
           "%s::bigint, %s::bigint, %s::timestamptz, %s::text, %s::text)")
    up = (
        f"WITH ev AS ({insert}), "
        "u (steps, calls, errors, t_in, t_out, cost, cached, reasoning, unpriced, seq, at, progress, id) "
        f"AS (VALUES {', '.join([row] * len(runs))}) "
        "UPDATE runs SET steps = runs.steps + u.steps, tool_calls = runs.tool_calls + u.calls, "
        "tool_errors = runs.tool_errors + u.errors, tokens_in = runs.tokens_in + u.t_in, "
        "tokens_out = runs.tokens_out + u.t_out, cost_eur = runs.cost_eur + u.cost, "
        "cached_tokens_in = runs.cached_tokens_in + u.cached, "
        "reasoning_tokens = runs.reasoning_tokens + u.reasoning, "
        "cost_unpriced_tokens = runs.cost_unpriced_tokens + u.unpriced, "
        f"last_seq = {b.greatest}(runs.last_seq, u.seq), "
        f"last_seen_at = {b.greatest}(runs.last_seen_at, COALESCE(u.at, now())), "
        "progress = COALESCE(u.progress, runs.progress) FROM u WHERE runs.id = u.id "
        "RETURNING runs.id, runs.status, runs.stop_reason, runs.stop_detail"
    )
    return up, (*ev_params, *(v for update in runs.values() for v in update))


def burst_statements(sql: AgentSQL, records: Sequence[Record], *, arrays: bool = True) -> list[Statement]:
    """The statements of a burst; their rows are (run id, status, stop_reason, stop_detail), one per run.

    The events go in by run id then seq (as one thread's records would, run by run). `arrays`
    False: PostgreSQL's multi-row VALUES form instead of the arrays (a benchmark's baseline)."""
    if not records:
        raise ValueError("a burst of no records")
    if len(records) > BURST_MAX_RECORDS:
        raise ValueError(f"a burst of {len(records)} records: at most {BURST_MAX_RECORDS}")
    b = sql.backend
    ordered = sorted(records, key=lambda r: (r[1][_ID], r[1][_SEQ]))
    runs = _per_run(ordered)
    if b.modifying_cte and b.returning and arrays:
        return [_array_statement(ordered, runs)]
    ph, clock, json_ph = b.ph, b.clock_ph, b.json_ph
    one = "(" + ", ".join(json_ph if c == "args" else clock if c == "at" else ph for c in EVENT_COLUMNS) + ")"
    insert = f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES {', '.join([one] * len(ordered))}"
    ev_params = [v for event, _update in ordered for v in event]
    if b.modifying_cte and b.returning:
        return [_values_cte(sql, insert, ev_params, runs)]
    update_run = sql.update_run.split(" RETURNING ")[0]  # the statuses are read once, below
    statements: list[Statement] = [(insert, ev_params)]
    statements += [(update_run, tuple(update)) for update in runs.values()]
    statements.append((f"SELECT id, status, stop_reason, stop_detail FROM runs WHERE id IN "
                       f"({', '.join([ph] * len(runs))})", tuple(runs)))
    return statements
