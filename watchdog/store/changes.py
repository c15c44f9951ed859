"""The change feed: which runs changed since the last look, in one range read (issue 25).

Every INSERT or UPDATE of a run row and every event inserted for a run gives the run the next
number of one store-wide counter, `runs.change_seq`, written by the database's triggers and
never by a writer (migration 0012). `ChangeFeed.read` returns the runs numbered above its
cursor, as light rows (what the tick needs to route a run: its identity, status and the times
its deadlines are computed from), and moves the cursor: O(changed), never O(active).

Late commits. SQLite commits one writer at a time, so the numbers commit in their order and a
cursor never passes a number still to come. PostgreSQL takes a number inside the transaction
and commits transactions in any order: a number below the cursor may become visible after the
cursor passed it. The feed therefore re-reads the numbers above where its cursor stood
`late_reads` reads ago and reports those it has not reported yet (a window that is empty when
nothing changes: an idle read costs one probe of the index). A transaction that stays open
for longer than that window delays only its own run's change, until the run's next change or
deadline (the tick reads every active run at least once a minute: watchdog.daemon.tick.activeset).

A sharded judge (watchdog.daemon.leases.shards) reads only its part of the feed: with a `reach`
(watchdog.store.shards.Reach) every read of the feed, its late window included, is confined in
SQL to the runs of the reach's hosts and of its buckets (`runs.shard`, revision 0016).

On PostgreSQL (revision 0018) the numbers' index is the narrow table `run_changes`, kept equal to
`runs.change_seq` by the database in the same statement, so that a record's update of its run
row is a HOT one (watchdog.store.change_index): the range is read there, and since revision
0020 the light rows too (the table holds a copy of their columns, host included, written by the
same statement: one table read in index order, a reach confined on it).

Nothing of the feed is kept in the store: a restarted daemon starts from 0 (`read` returns
every run that ever changed) or, cheaper, from `start` (the active runs and the high-water
mark of one snapshot).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence, cast

from sqlalchemy import select, text
from sqlalchemy.engine import Connection

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.store import change_index, dialects
from watchdog.store.schema import runs
from watchdog.store.shards import Reach, bucket_mask_sql

log = logging.getLogger("watchdog.changes")

# Reads after which a number below the cursor is no longer waited for (PostgreSQL): with one read
# per tick, that many ticks for a writer's transaction between taking its number and committing.
# A writer's transaction takes its number in its UPDATE (or, for an event, at the end of its
# INSERT: revision 0017's statement trigger, no longer at COMMIT) and commits within
# milliseconds: three ticks is ample, and keeps the window's re-read small.
LATE_READS = 3
# At `start`, the numbers below the high-water mark that may still commit late (PostgreSQL).
START_WINDOW = 1_000


@dataclass(frozen=True, slots=True)
class RunChange:
    """A run that changed: what the tick needs to route it, the times in epoch seconds (None
    where the row holds no readable time: the tick's full read reports such a row)."""

    id: str
    agent: str
    status: str
    host: str
    pid: int | None
    pid_create_time: float | None
    kill_mode: str
    change_seq: int
    started_s: float | None
    seen_s: float | None
    stop_requested_s: float | None
    signalled_s: float | None
    paused_s: float | None
    signal_stage: str | None
    resumes: int
    asked: dict[str, float]  # the run's own budget columns that are set (RUN_BUDGET_KEYS)

    @property
    def active(self) -> bool:
        return self.status in lc.ACTIVE_STATUSES


class ChangeBatch(NamedTuple):
    changed: tuple[RunChange, ...]  # in the order of their numbers
    cursor: int  # the feed's cursor after this read: pass it to the next read
    unreadable: int = 0  # rows numbered in this read whose identity did not read (not in `changed`)


class ChangedRows(NamedTuple):
    rows: list[Sequence[Any]]  # the caller's columns of each changed run whose id and number read
    ids: frozenset[str]
    cursor: int
    unreadable: int = 0
    high_water: int = 0  # the highest number any run held in this read's snapshot (see high_water)


_IDENTITY = ("id", "agent", "status", "host", "pid", "pid_create_time", "kill_mode", "change_seq",
             "signal_stage", "resumes")
_TIMES = ("started_at", "last_seen_at", "stop_requested_at", "signalled_at", "paused_at")


_LIGHT: dict[str, Any] = {}  # dialect name -> the light SELECT (built once: building it cost ~2 ms)


def _light(conn: Connection) -> Any:
    q = _LIGHT.get(conn.dialect.name)
    if q is None:
        backend = dialects.of(conn)
        q = _LIGHT[conn.dialect.name] = select(*(runs.c[c] for c in _IDENTITY),
                                               *(backend.epoch_s(runs.c[t]) for t in _TIMES),
                                               *(runs.c[k] for k in RUN_BUDGET_KEYS))
    return q


# (dialect name, source, what) -> a SELECT of the runs above a number, rendered
_ABOVE: dict[tuple[str, str, str], str] = {}


def _rendered(conn: Connection, src: change_index.Source, what: str, columns: Any) -> str:
    """A read of every tick, rendered once per backend and run as the driver's own statement:
    building, compiling and typing a 25-column SELECT each time cost more than the read itself."""
    sql = _ABOVE.get((conn.dialect.name, src.key, what))
    if sql is None:
        stmt = src.rows(columns).where(src.number > 0).order_by(src.number)
        rendered = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        marker = f"{src.number.table.name}.change_seq > "
        head, sep, tail = rendered.rpartition(marker + "0")
        assert sep, rendered
        sql = _ABOVE[(conn.dialect.name, src.key, what)] = head + marker + dialects.of(conn).ph + tail
    return sql


def _float(value: object) -> float | None:
    """A finite number, else None (a row written by hand may hold text where a number belongs)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _time(value: object) -> float | None:
    # The database computed it (epoch_s): a float or NULL; anything else is not a time.
    return value if value.__class__ is float else _float(value)


def _row(r: Sequence[Any]) -> RunChange | None:
    """The light row, or None for a row whose identity is unreadable (not a text id)."""
    rid, agent, status, host, pid, ctime, kill_mode, seq, stage, resumes = r[:10]
    if rid.__class__ is not str or seq.__class__ is not int:
        return None
    asked = {}
    for k, v in zip(RUN_BUDGET_KEYS, r[15:]):
        if v is not None and (f := _float(v)) is not None:
            asked[k] = f
    return RunChange(
        rid, str(agent), str(status), str(host), pid if pid.__class__ is int else None, _float(ctime),
        str(kill_mode), seq, _time(r[10]), _time(r[11]), _time(r[12]), _time(r[13]), _time(r[14]),
        stage if stage.__class__ is str else None, resumes if resumes.__class__ is int else 0, asked)


# The high-water probe (one probe of the index, change_index.Source.top), and the late window's
# numbers: the tick reads both with the rows above the cursor, in the same round trip
# (Dialect.read_batch).


def _open(backend: dialects.Dialect, src: change_index.Source) -> str:
    """Every number above one bound (`{ph}`): the late window's read, open above, unconfined."""
    return src.above.format(ph=backend.ph)


def _window(backend: dialects.Dialect, src: change_index.Source, reach: Reach | None = None) -> str:
    if reach is None:
        return src.window.format(ph=backend.ph)
    return _confined(src.window_hosts.format(ph=backend.ph), backend, src, src.host)


# A reach's confinement of a pre-rendered read (PostgreSQL only: judges are sharded there): its
# buckets' runs on any host (the Reach's bit mask, tested on the number's row: `runs` or
# `run_changes`), and every run of its hosts (an array; `runs.host`, or run_changes' copy of it).
_REACH = " AND (" + bucket_mask_sql("{shard}", "{ph}") + " OR {host} = ANY({ph}))"


def reach_params(reach: Reach) -> tuple[bytes, list[str]]:
    return reach.mask, sorted(reach)


def reach_clause(reach: Reach, shard: str = "runs.shard", host: str = "runs.host") -> Any:
    """The same confinement as an SQLAlchemy condition on `runs` (two parameters), or on the
    columns named."""
    mask, hosts = reach_params(reach)
    return text("(" + bucket_mask_sql(shard, ":r_mask") + f" OR {host} = ANY(:r_hosts))").bindparams(
        r_mask=mask, r_hosts=hosts)


def _confined(sql: str, backend: dialects.Dialect, src: change_index.Source, host: str) -> str:
    """A rendered `... WHERE <number> > ? [ORDER BY ...]` read, confined to a reach."""
    head, sep, tail = sql.partition(" ORDER BY ")
    return head + _REACH.format(shard=src.shard, host=host, ph=backend.ph) + sep + tail


def high_water(conn: Connection) -> int:
    """The highest number any run holds now (0 for none)."""
    return _number(conn.exec_driver_sql(change_index.source(conn).top).scalar())


def _number(top: object) -> int:
    return int(top) if isinstance(top, int) else 0


class ChangeFeed:
    """Which runs changed since the cursor. One per reader (it remembers what it reported in
    the late-commit window); not shared between threads."""

    def __init__(self, since: int = 0, *, late_reads: int = LATE_READS):
        if since < 0 or late_reads < 1:
            raise ValueError("since >= 0 and late_reads >= 1")
        self.cursor = since
        self._late_reads = late_reads
        self._lows: deque[int] = deque(maxlen=late_reads)  # the cursor before each of the last reads
        self._reported: set[int] = set()  # numbers above the window's low end already reported
        self._batches: deque[list[int]] = deque()  # what each of the last reads added to it
        self._visible: set[int] | None = None  # a reach's: every number the last read saw above its low end

    def read(self, conn: Connection, since: int | None = None) -> ChangeBatch:
        """The runs numbered above the cursor (and, where commits come out of order, the late
        ones below it not reported yet), light, in number order; the cursor moves past them.
        `since`: start over from that number (0: every run that ever changed)."""
        got = self.read_rows(conn, "feed light", _light(conn), i_id=0, i_seq=7, since=since)
        out = sorted((c for r in got.rows if (c := _row(r)) is not None), key=lambda c: c.change_seq)
        return ChangeBatch(tuple(out), got.cursor, got.unreadable)

    def read_rows(self, conn: Connection, what: str, columns: Any, *, i_id: int, i_seq: int,
                  since: int | None = None, reach: Reach | None = None) -> ChangedRows:
        """`read` with the caller's columns (a SELECT of `runs` holding its id and change_seq at
        `i_id` and `i_seq`; `what` names it, unique per SELECT: it is rendered once): for a reader that wants its own
        row of each changed run (the tick's light row, watchdog.store.scan.changed_light)
        without a second read by id. Ended runs are among them. `reach`: only its runs (the
        feed's cursor then counts only theirs: one reach per feed, a new feed when it changes)."""
        src = change_index.source(conn)
        rows, probed = self._fetch(conn, since, src, _rendered(conn, src, what, columns), columns, reach)
        ids: set[str] = set()
        good: list[Sequence[Any]] = []
        numbers: list[int] = []
        top = self.cursor
        unreadable = 0
        for r in rows:
            rid, seq = r[i_id], r[i_seq]
            if seq.__class__ is not int:
                unreadable += 1
                continue
            numbers.append(seq)
            if rid.__class__ is not str:
                unreadable += 1
                continue
            ids.add(rid)
            good.append(r)
            if seq > top:
                top = seq
        self._moved(conn, numbers, top)
        return ChangedRows(good, frozenset(ids), top, unreadable, probed)

    def _fetch(self, conn: Connection, since: int | None, src: change_index.Source, above: str, columns: Any,
               reach: Reach | None = None) -> tuple[list[Sequence[Any]], int]:
        """The rows numbered above the cursor, and the late ones of the window (see `read`);
        and the high-water mark, probed in the same round trip."""
        if since is not None and since != self.cursor:
            self._restart(since)
        backend = dialects.of(conn)
        cursor = self.cursor
        low = cursor if backend.commits_in_order or not self._lows else min(self._lows[0], cursor)
        reads, opened, confined = self._reads(backend, src, above, reach, low, src.host_of(columns))
        got = backend.read_batch(conn, reads)
        rows: list[Sequence[Any]] = got[0]
        probed = _number(got[1][0][0]) if got[1] else 0
        if low < cursor:
            late = self._late(got, cursor, confined)
            if late:
                cond = src.number.in_(late)
                if reach is not None:
                    cond = cond & reach_clause(reach, src.shard, src.host_of(columns))
                rows = list(conn.execute(src.rows(columns).where(cond))) + rows
        if opened:
            self._visible = {n for (n,) in got[2]}
        return rows, probed

    def _reads(self, backend: dialects.Dialect, src: change_index.Source, above: str, reach: Reach | None,
               low: int, host: str) -> tuple[list[tuple[str, tuple[Any, ...]]], bool, bool]:
        """_fetch's statements: the rows above the cursor (`host`: the column their confinement
        reads), the high-water probe, and the late window's numbers; whether the window is read
        open (a reach's) and whether confined."""
        cursor = self.cursor
        extra: tuple[Any, ...] = () if reach is None else reach_params(reach)
        if reach is not None:
            above = _confined(above, backend, src, host)
        reads: list[tuple[str, tuple[Any, ...]]] = [(above, (cursor, *extra)), (src.top, ())]
        # A reach's late window (issue 35): every number visible above the window's low end, the
        # index alone, not confined: confined, each number's run row was probed for its host, ~3
        # reads of every judge's changes a tick. A number at or below the cursor is late if the
        # read before did not see it (a number is one change of one run: visible once committed,
        # gone only when its run changes again); only those are read whole, confined.
        opened = reach is not None and not backend.commits_in_order
        if opened:
            reads.append((_open(backend, src), (low,)))
        confined = low < cursor and not (opened and self._visible is not None)
        if confined:
            # The late window: its numbers only (the index alone), whole rows for the few not
            # reported yet: a number that committed after the cursor passed it.
            reads.append((_window(backend, src, reach), (low, cursor, *extra)))
        return reads, opened, confined

    def _late(self, got: list[list[Any]], cursor: int, confined: bool) -> list[int]:
        """The window's numbers not reported yet: of the confined window's read (the last), or of
        the open one (the third) those at or below the cursor the read before did not see."""
        reported = self._reported
        if confined:
            return [n for (n,) in got[-1] if n not in reported]
        seen = self._visible
        assert seen is not None
        return sorted(n for (n,) in got[2] if n <= cursor and n not in seen and n not in reported)

    def _moved(self, conn: Connection, numbers: list[int], top: int) -> None:
        if not dialects.of(conn).commits_in_order:
            # A number reported `late_reads` reads ago is at or below the window's new low end:
            # it leaves the window with the read that reported it.
            self._reported.update(numbers)
            self._batches.append(numbers)
            self._lows.append(self.cursor)
            while len(self._batches) > self._late_reads:
                self._reported.difference_update(self._batches.popleft())
        self.cursor = top

    def start(self, conn: Connection) -> ChangeBatch:
        """A restarted reader: the active runs and the high-water mark, from one snapshot (pass
        a `read_connection`). The late-commit window starts START_WINDOW numbers below the mark,
        every number visible in it counted as reported, so a transaction that took its number
        before the snapshot and commits after it is still read."""
        top = self.mark(conn)
        rows = conn.execute(_light(conn).where(runs.c.status.in_(lc.ACTIVE_STATUSES))
                            .order_by(runs.c.change_seq)).all()
        active = tuple(c for r in rows if (c := _row(r)) is not None)
        return ChangeBatch(active, top)

    def mark(self, conn: Connection, reach: Reach | None = None) -> int:
        """`start` for a reader that read the active runs itself in this snapshot (the tick's full
        read): the cursor moves to the high-water mark, the late-commit window set up as `start`
        does. Returns the mark."""
        top = high_water(conn)
        before = self.cursor
        # The window's low end as the reads before this one left it: a number taken before this
        # snapshot by a transaction still open is not lost to the mark's move (a full tick's).
        prior = min(self._lows[0], before) if self._lows else before
        if top < before:  # retention pruned the newest numbered runs, or a writer rewound the counter
            log.info("change numbers went back (%d after %d): the feed goes on from %d", top, before, top)
        self._restart(top)
        backend = dialects.of(conn)
        if not backend.commits_in_order:
            floor = max(0, top - START_WINDOW)
            if 0 < prior < floor:
                floor = prior
            src = change_index.source(conn)
            window, extra = _window(backend, src, reach), cast(tuple[Any, ...], ())
            if reach is not None:
                extra = reach_params(reach)
            visible = [n for (n,) in backend.read_batch(conn, [(window, (floor, top, *extra))])[0]]
            self._reported = set(visible)
            self._batches.append(visible)
            self._lows.append(floor)
        return top

    def _restart(self, since: int) -> None:
        if since < 0:
            raise ValueError("since >= 0")
        self.cursor = since
        self._lows.clear()
        self._batches.clear()
        self._reported = set()
        self._visible = None
