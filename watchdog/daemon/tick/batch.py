"""The tick's writes for running runs in one transaction, with a SAVEPOINT per run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from watchdog.store.engine import Connection, Engine, bound_lock_waits


class _Transaction(Protocol):
    def commit(self) -> None: ...


class Batch:
    """The tick's writes for running runs (stop requests, lost runs, rate alarms) in ONE
    transaction, opened at the first write, with a SAVEPOINT per run so a failing run rolls
    back only its own rows: one commit per tick instead of one per run. On PostgreSQL its lock
    waits are bounded (engine.bound_lock_waits, for the whole transaction): a run whose row a
    writer holds locked fails its own step (rolled back to its SAVEPOINT), never the tick's."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # The open connection and its transaction: both set at the first write, both None after.
        self._open: tuple[Connection, _Transaction] | None = None

    @property
    def conn(self) -> Connection | None:
        return None if self._open is None else self._open[0]

    @contextmanager
    def run(self) -> Iterator[Connection]:
        if self._open is None:
            conn = self.engine.connect()
            self._open = (conn, conn.begin())
            bound_lock_waits(conn)
        conn = self._open[0]
        sp = conn.begin_nested()
        try:
            yield conn
        except BaseException:
            sp.rollback()
            raise
        sp.commit()

    def commit(self) -> None:
        if self._open is None:
            return
        try:
            self._open[1].commit()
        finally:
            self.close()

    def close(self) -> None:
        """Without a commit: what is pending is rolled back."""
        if self._open is not None:
            try:
                self._open[0].close()
            finally:
                self._open = None
