"""Where the change feed finds its numbers: PostgreSQL's `run_changes`, or `runs` itself (issue 35).

On PostgreSQL (revision 0018) the index of the runs' change numbers is a narrow table of its own,
`run_changes` (run_id, change_seq, shard), kept equal to `runs.change_seq` by the database's
statement triggers in the same statement as each write of a run row: `runs.change_seq` is then
in no index of `runs`, so a record's update of its run's counters is a HOT update (no new entry
in the row's 10 indexes). SQLite keeps the models' index on `runs.change_seq` (it rewrites only
the indexes whose columns change).

The feed (watchdog.store.changes) reads the range from the index's table and the rows from
`runs`: `Source` holds the pieces of SQL that differ. A store older than 0018 (a benchmark's
`--revision`) is read from `runs` as before; which one is looked up once per engine.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, SmallInteger, String, column, table
from sqlalchemy.engine import Connection, Engine

from watchdog.store.schema import runs

TABLE = "run_changes"
PG_ONLY = (TABLE,)  # revision 0018's table, not in the models (read by name)
MODEL_ONLY = ("ix_runs_change_seq",)  # the models' index that PostgreSQL drops at 0018

run_changes = table(TABLE, column("run_id", String(32)), column("change_seq", BigInteger),
                    column("shard", SmallInteger))


@dataclass(frozen=True, slots=True)
class Source:
    key: str  # names the source in the callers' caches of rendered SQL
    number: Any  # the column the feed's range reads and orders by
    shard: str  # the bucket column a reach confines the range's read with
    top: str  # the high-water probe
    window: str  # the late window's numbers, with a `{ph}` for each of its two bounds
    window_hosts: str  # the same, joined with `runs` (a reach's confinement reads runs.host)
    above: str  # every number above one bound (`{ph}`): a reach's late window read open, unconfined

    def rows(self, columns: Any) -> Any:
        """A SELECT of `runs` (`columns`) that can be filtered and ordered by `number`."""
        if self.number is runs.c.change_seq:
            return columns
        return columns.select_from(runs.join(run_changes, run_changes.c.run_id == runs.c.id))


_RUNS_ABOVE = "SELECT change_seq FROM runs WHERE change_seq > {ph}"
_RUNS_WINDOW = _RUNS_ABOVE + " AND change_seq <= {ph}"
RUNS = Source("runs", runs.c.change_seq, "runs.shard", "SELECT max(change_seq) FROM runs", _RUNS_WINDOW,
              _RUNS_WINDOW, _RUNS_ABOVE)
_INDEX_ABOVE = f"SELECT change_seq FROM {TABLE} WHERE change_seq > {{ph}}"
INDEXED = Source(TABLE, run_changes.c.change_seq, f"{TABLE}.shard", f"SELECT max(change_seq) FROM {TABLE}",
                 _INDEX_ABOVE + " AND change_seq <= {ph}",
                 f"SELECT {TABLE}.change_seq FROM {TABLE} JOIN runs ON runs.id = {TABLE}.run_id "
                 f"WHERE {TABLE}.change_seq > {{ph}} AND {TABLE}.change_seq <= {{ph}}",
                 _INDEX_ABOVE)

# The index is revision 0018's table only when it is where `runs` is and has its owner: a table of
# that name a writer made (before 0018, or where PUBLIC may create in the schema: PostgreSQL 14
# and older by default) would otherwise decide which changes the daemon sees.
_OURS = (f"SELECT EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_class r"
         f" ON r.relnamespace = c.relnamespace AND r.relowner = c.relowner"
         f" WHERE c.oid = to_regclass('{TABLE}') AND c.relkind = 'r' AND r.oid = to_regclass('runs'))")

_KNOWN: "weakref.WeakKeyDictionary[Engine, Source]" = weakref.WeakKeyDictionary()


def source(conn: Connection) -> Source:
    """The feed's source for this connection's store (looked up once per engine)."""
    engine = conn.engine
    got = _KNOWN.get(engine)
    if got is None:
        got = RUNS
        if conn.dialect.name == "postgresql" and conn.exec_driver_sql(_OURS).scalar():
            got = INDEXED
        _KNOWN[engine] = got
    return got
