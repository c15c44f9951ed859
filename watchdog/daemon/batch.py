"""The tick's writes for running runs in one transaction, with a SAVEPOINT per run."""

from __future__ import annotations

from contextlib import contextmanager


class Batch:
    """The tick's writes for running runs (stop requests, lost runs, rate alarms) in ONE
    transaction, opened at the first write, with a SAVEPOINT per run so a failing run rolls
    back only its own rows: one commit per tick instead of one per run."""

    def __init__(self, engine):
        self.engine = engine
        self.conn = None
        self.tx = None

    @contextmanager
    def run(self):
        if self.conn is None:
            self.conn = self.engine.connect()
            self.tx = self.conn.begin()
        sp = self.conn.begin_nested()
        try:
            yield self.conn
        except BaseException:
            sp.rollback()
            raise
        sp.commit()

    def commit(self):
        if self.conn is None:
            return
        try:
            self.tx.commit()
        finally:
            self.close()

    def close(self):
        """Without a commit: what is pending is rolled back."""
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = self.tx = None
