"""How a command reaches the store: an engine on a migrated store, a read-only one for the web
view, and what a driver's error means, in one line, to the person who ran the command.

The CLI and the web view call these and never see SQLAlchemy's exception classes or a backend
branch (each backend's piece is its class in watchdog.store.dialects).
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy.exc import DBAPIError, OperationalError

from watchdog.store.dialects import for_url
from watchdog.store.engine import (Engine, is_missing_schema, make_engine, normalise_url, require_tables,
                                   share_sqlite_files)


def open_store(url: str, *, must_exist: bool = False, read_only: bool = False, tables: bool = False) -> Engine:
    """An engine on the store. `tables`: it must have been migrated (`db upgrade`): StoreError
    naming the fix otherwise. Checking never changes the store (a SQLite file is probed through
    a read-only engine: a writer's first connection would make it a WAL database)."""
    engine = make_engine(url, must_exist=must_exist, read_only=read_only)
    if tables:
        if for_url(normalise_url(url)).embedded and not read_only:
            probe = make_engine(url, read_only=True)
            try:
                require_tables(probe, url)
            finally:
                probe.dispose()
        else:
            require_tables(engine, url)
    return engine


def open_daemon_store(url: str) -> Engine:
    """The daemon's engine. An embedded store (SQLite) must be there with its tables now (a
    server that is down at start is waited for: the daemon's lease retries); opening it makes
    its -wal and -shm files (the daemon's, under its umask), which the agents' group writes
    too: 0660."""
    embedded = for_url(normalise_url(url)).embedded
    engine = open_store(url, must_exist=True, tables=embedded)
    if embedded:
        with engine.connect():
            share_sqlite_files(url)
    return engine


def open_read_only(url: str) -> Engine:
    """An engine that cannot write (the web view): SQLite opened read-only, PostgreSQL with
    read-only transactions; the store must have its tables."""
    args = for_url(normalise_url(url)).read_only_connect_args()
    engine = make_engine(url, read_only=True, connect_args=args) if args else make_engine(url, read_only=True)
    require_tables(engine, url)
    return engine


class DriverError(NamedTuple):
    """A database driver's error as a person reads it (never the SQL or its parameters)."""

    first_line: str  # the driver's own first line
    missing_schema: bool  # a table or column is missing: the store is older than this code


def driver_error(exc: BaseException) -> DriverError | None:
    """`exc` as a DriverError when the database driver raised it; None for anything else."""
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig
    first = (str(orig).strip().splitlines() or [type(orig).__name__])[0] if orig is not None else str(exc)
    return DriverError(first, is_missing_schema(exc))


def unreachable(exc: BaseException) -> str | None:
    """The first line of the driver's error when `exc` says the store could not be reached (or
    was locked): a start-up may wait for it. None for any other error."""
    if not isinstance(exc, OperationalError):
        return None
    return str(exc.orig if exc.orig is not None else exc).strip().splitlines()[0][:200]
