"""Where the change feed finds its numbers: PostgreSQL's `run_changes`, or `runs` itself (issue 35).

On PostgreSQL (revision 0018) the index of the runs' change numbers is a narrow table of its own,
`run_changes` (run_id, change_seq, shard), kept equal to `runs.change_seq` by the database's
statement triggers in the same statement as each write of a run row: `runs.change_seq` is then
in no index of `runs`, so a record's update of its run's counters is a HOT update (no new entry
in the row's 10 indexes). SQLite keeps the models' index on `runs.change_seq` (it rewrites only
the indexes whose columns change).

Since revision 0020 the index's table also holds a copy of the light columns the feed reads
(`LIGHT`: identity, host, status, stop times, own budgets, measured counters, start and last
sight, parent), written by the same triggers from the run row as stored: the feed reads one
table in the order of its index, no probe of `runs` per changed run (issues 34 and 35). A read
that wants a column outside the copy still joins `runs`.

The feed (watchdog.store.changes) asks `Source` for the pieces of SQL that differ. A store older
than 0018 (a benchmark's `--revision`) is read from `runs` as before, one at 0018 or 0019 from
the index joined to `runs`; which one is looked up once per engine.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Column, SmallInteger, String, column, table
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql import visitors

from watchdog.store.schema import runs

TABLE = "run_changes"
PG_ONLY = (TABLE,)  # revision 0018's table, not in the models (read by name)
MODEL_ONLY = ("ix_runs_change_seq",)  # the models' index that PostgreSQL drops at 0018

# Revision 0020's copy of the run row in the index's table (named as in `runs`; the migration
# keeps the same list). What the feed's light reads need: watchdog.store.scan's tick row and
# watchdog.store.changes' RunChange.
LIGHT = ("agent", "status", "kill_mode", "host", "pid", "pid_create_time",
         "max_steps", "max_tool_calls", "max_cost_eur", "max_tokens", "max_wall_s", "max_identical_calls",
         "heartbeat_timeout_s", "steps", "tool_calls", "cost_eur", "tokens_in", "tokens_out",
         "started_at", "last_seen_at", "stop_requested_at", "signal_stage", "signalled_at", "paused_at",
         "parent_id", "resumes")

run_changes = table(TABLE, column("run_id", String(32)), column("change_seq", BigInteger),
                    column("shard", SmallInteger), *(column(c, runs.c[c].type) for c in LIGHT))
_COPIED = {"id": run_changes.c.run_id, "change_seq": run_changes.c.change_seq, "shard": run_changes.c.shard,
           **{c: run_changes.c[c] for c in LIGHT}}


# id(a caller's SELECT) -> (it, whether run_changes' copy holds every column of runs it reads, its
# SELECT of the copy): the callers build their SELECTs once and read with them every tick.
_ON_COPY: dict[int, tuple[Any, bool, Any]] = {}


def _copy_of(columns: Any) -> tuple[bool, Any]:
    got = _ON_COPY.get(id(columns))
    if got is None or got[0] is not columns:
        used = {e.name for e in visitors.iterate(columns) if isinstance(e, Column) and e.table is runs}
        alone = used <= _COPIED.keys()
        opts: dict[str, Any] = {}
        got = _ON_COPY[id(columns)] = (columns, alone,
                                       visitors.replacement_traverse(columns, opts, _on_copy)
                                       if alone else None)
    return got[1], got[2]


def _on_copy(element: Any, **kw: Any) -> Any:
    if isinstance(element, Column) and element.table is runs:
        return _COPIED[element.name]
    return None


@dataclass(frozen=True, slots=True)
class Source:
    key: str  # names the source in the callers' caches of rendered SQL
    number: Any  # the column the feed's range reads and orders by
    shard: str  # the bucket column a reach confines the range's read with
    top: str  # the high-water probe
    window: str  # the late window's numbers, with a `{ph}` for each of its two bounds
    window_hosts: str  # the same, where a reach's confinement can read the run's host (`host`)
    above: str  # every number above one bound (`{ph}`): a reach's late window read open, unconfined
    host: str = "runs.host"  # the host column a reach confines with, in `window_hosts` and `rows`
    copied: bool = False  # the index's table holds the LIGHT columns (revision 0020)

    def rows(self, columns: Any) -> Any:
        """A SELECT of `runs` (`columns`) that can be filtered and ordered by `number`: of the
        index's table alone when it holds every column asked for (`reads_alone`)."""
        if self.number is runs.c.change_seq:
            return columns
        if self.copied:
            alone, copy = _copy_of(columns)
            if alone:
                return copy
        return columns.select_from(runs.join(run_changes, run_changes.c.run_id == runs.c.id))

    def reads_alone(self, columns: Any) -> bool:
        """Whether `rows(columns)` reads the index's table alone (no join with `runs`)."""
        return self.copied and _copy_of(columns)[0]

    def host_of(self, columns: Any) -> str:
        """The host column a reach's confinement of `rows(columns)` reads."""
        return f"{TABLE}.host" if self.number is not runs.c.change_seq and self.reads_alone(columns) else "runs.host"


_RUNS_ABOVE = "SELECT change_seq FROM runs WHERE change_seq > {ph}"
_RUNS_WINDOW = _RUNS_ABOVE + " AND change_seq <= {ph}"
RUNS = Source("runs", runs.c.change_seq, "runs.shard", "SELECT max(change_seq) FROM runs", _RUNS_WINDOW,
              _RUNS_WINDOW, _RUNS_ABOVE)
_INDEX_ABOVE = f"SELECT change_seq FROM {TABLE} WHERE change_seq > {{ph}}"
_INDEX_WINDOW = _INDEX_ABOVE + " AND change_seq <= {ph}"
INDEXED = Source(TABLE, run_changes.c.change_seq, f"{TABLE}.shard", f"SELECT max(change_seq) FROM {TABLE}",
                 _INDEX_WINDOW,
                 f"SELECT {TABLE}.change_seq FROM {TABLE} JOIN runs ON runs.id = {TABLE}.run_id "
                 f"WHERE {TABLE}.change_seq > {{ph}} AND {TABLE}.change_seq <= {{ph}}",
                 _INDEX_ABOVE)
# Revision 0020: the host is in the index's table too: a reach's window reads it alone.
COPIED = Source(TABLE + "+light", run_changes.c.change_seq, f"{TABLE}.shard", INDEXED.top, _INDEX_WINDOW,
                _INDEX_WINDOW, _INDEX_ABOVE, host=f"{TABLE}.host", copied=True)

# The index is revision 0018's table only when it is where `runs` is and has its owner: a table of
# that name a writer made (before 0018, or where PUBLIC may create in the schema: PostgreSQL 14
# and older by default) would otherwise decide which changes the daemon sees.
_OURS = (f"SELECT EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_class r"
         f" ON r.relnamespace = c.relnamespace AND r.relowner = c.relowner"
         f" WHERE c.oid = to_regclass('{TABLE}') AND c.relkind = 'r' AND r.oid = to_regclass('runs'))")

# Whether it holds revision 0020's copy: the last of its LIGHT columns.
_LIGHT_IN = (f"SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass('{TABLE}')"
             f" AND attname = '{LIGHT[-1]}' AND NOT attisdropped)")

_KNOWN: "weakref.WeakKeyDictionary[Engine, Source]" = weakref.WeakKeyDictionary()


def source(conn: Connection) -> Source:
    """The feed's source for this connection's store (looked up once per engine)."""
    engine = conn.engine
    got = _KNOWN.get(engine)
    if got is None:
        got = RUNS
        if conn.dialect.name == "postgresql" and conn.exec_driver_sql(_OURS).scalar():
            got = COPIED if conn.exec_driver_sql(_LIGHT_IN).scalar() else INDEXED
        _KNOWN[engine] = got
    return got
