"""Group commit of the records this process's threads make at the same moment (issue 35).

A record alone is written as before: one transaction of its own (Watchdog.write). When records
arrive while the process's connections are all writing, they wait, and the next thread free to
write takes every record waiting and writes them as one burst (watchdog.store.bursts): one
transaction, one round trip on PostgreSQL, the SQLite write lock taken once. Nothing is delayed
to fill a burst: a burst is only what queued up behind a write in progress.

Each record still waits for its own transaction and gets its run's status read back in it, so a
stop is seen by the next record, as with one record per transaction. A burst the store refuses
or cannot take (an outage, a duplicate record, a deadlock) is not retried as a burst: each of its
records is written again alone, in its own thread, through Watchdog.write (its outage buffer,
its rejection count, its misconfiguration error raised to the agent whose record it was).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from watchdog.store.bursts import BURST_MAX_RECORDS, burst_statements

if TYPE_CHECKING:
    from watchdog.store.agent_writes import Writer
    from watchdog.store.lineage import Statement


class Writes(Protocol):
    """What a burst needs of the Watchdog (watchdog.sdk.client.Watchdog; a protocol: no import cycle)."""

    @property
    def writer(self) -> Writer: ...

    @property
    def buffered(self) -> int: ...

    def write(self, statements: Sequence[Statement], *, raise_conflict: bool = False) -> Sequence[Any] | None: ...

    def note_written(self) -> None: ...

_ALONE = object()  # a record to write alone (Watchdog.write), in its own thread


class _Pending:
    __slots__ = ("event", "update", "statements", "row", "taken", "done")

    def __init__(self, event: Sequence[Any], update: Sequence[Any], statements: Sequence[Statement]) -> None:
        self.event, self.update, self.statements = event, update, statements
        self.row: Any = None
        self.taken = False  # in a burst being written (by another thread, maybe)
        self.done = False


class Bursts:
    """The records of one Watchdog waiting to be written; at most `writers` transactions at once
    (its writer's pool size: one connection each)."""

    def __init__(self, wd: Writes, writers: int) -> None:
        self.wd = wd
        self.writers = writers
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Pending] = []
        self._writing = 0
        self.bursts = 0  # transactions of more than one record so far (tests, benchmarks)
        self.burst_records = 0  # the records they held
        _ALL.add(self)

    def _after_fork(self) -> None:
        # A forked child has none of the parent's threads: their queued records are not its own,
        # and the parent's lock may have been held at the fork.
        self._cond = threading.Condition(threading.Lock())
        self._queue = []
        self._writing = 0

    def record(self, event: Sequence[Any], update: Sequence[Any], statements: Sequence[Statement]) -> Any:
        """Write one record (`statements`: its writes alone, AgentSQL.record and the status read;
        `event`, `update`: the same as a burst takes them); the status row it read back, or None."""
        me = _Pending(event, update, statements)
        with self._cond:
            self._queue.append(me)
            while not me.done and (me.taken or self._writing >= self.writers):
                self._cond.wait()
            leader = not me.done
            if leader:
                batch, self._queue = self._queue, []
                for p in batch:
                    p.taken = True
                self._writing += 1
        if leader:
            try:
                others = [p for p in batch if p is not me]
                if not others or self.wd.buffered:  # alone, or behind buffered records (kept in order)
                    for p in others:
                        p.row = _ALONE
                    return self.wd.write(statements)  # in the slot: what arrives meanwhile queues up
                for i in range(0, len(batch), BURST_MAX_RECORDS):
                    self._write(batch[i:i + BURST_MAX_RECORDS])
            finally:
                with self._cond:
                    self._writing -= 1
                    for p in batch:
                        p.done = True
                    self._cond.notify_all()
        if me.row is _ALONE:
            return self.wd.write(statements)
        return me.row

    def _write(self, batch: list[_Pending]) -> None:
        wd = self.wd
        if len(batch) == 1:
            batch[0].row = _ALONE
            return
        try:
            rows = wd.writer.transaction_rows(burst_statements(wd.writer.sql, [(p.event, p.update) for p in batch]))
        except Exception:  # noqa: BLE001 — each record is written again alone, and fails alone if it must
            for p in batch:
                p.row = _ALONE
            return
        wd.note_written()
        status = {row[0]: tuple(row[1:]) for row in rows}
        for p in batch:
            p.row = status.get(p.update[-1])
        self.bursts += 1
        self.burst_records += len(batch)


_ALL: weakref.WeakSet[Bursts] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for bursts in list(_ALL):
        bursts._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
