"""A store in memory, for the unit tests of the judge's rules: SQLite `:memory:` on one connection.

`memory_engine()` is an engine like `make_engine`'s for SQLite (the same pragmas, BEGIN IMMEDIATE
for writers, a deferred BEGIN for `read_connection`), on a database that lives in this process only:
no file, no socket, so tests/unit may use it under the purity guard (tests/purity.py lets exactly
`:memory:` through). StaticPool: every checkout is the one connection, or each would be a new, empty
database. Several threads may use it (a Ticker's helpers) one at a time, as SQLite serialises them.

The schema is the migrations' own, not `metadata.create_all`: `upgrade head` once per process (the
triggers that number changes and keep an event's seq once, the CHECKs, the indexes), then each new
engine is a copy of that database made with SQLite's backup API (about a millisecond).
"""

from __future__ import annotations

import functools
import sqlite3
import threading

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import StaticPool

from watchdog.store.engine import _sqlite_begin, _sqlite_pragmas

MEMORY = ":memory:"  # the one database name the unit tests' guard lets through

_template: sqlite3.Connection | None = None
_template_engine: Engine | None = None  # kept: its connection is the template
_lock = threading.Lock()


def _engine_on(db: sqlite3.Connection) -> Engine:
    engine = create_engine("sqlite://", creator=lambda: db, poolclass=StaticPool, hide_parameters=True)
    event.listen(engine, "connect", functools.partial(_sqlite_pragmas, read_only=False))
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _migrated() -> sqlite3.Connection:
    global _template, _template_engine
    with _lock:
        if _template is None:
            from watchdog.store.access import upgrade

            db = sqlite3.connect(MEMORY, check_same_thread=False)
            engine = _engine_on(db)
            upgrade(engine)
            _template, _template_engine = db, engine
        return _template


def memory_engine(*, migrated: bool = True) -> Engine:
    """A new, private store in memory, at the migrations' head (`migrated=False`: empty)."""
    db = sqlite3.connect(MEMORY, check_same_thread=False)
    if migrated:
        template = _migrated()
        with _lock:
            template.backup(db)
    return _engine_on(db)
