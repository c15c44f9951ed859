"""Writing what the schema refuses: rows from before its checks, or by hand with them off."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def constraints_off(engine):
    """A transaction in which the store's checks (migration 0007's triggers) do not apply, as
    for a row written before that revision or by hand: SQLite's ignore_check_constraints,
    PostgreSQL's replica role (superuser; it turns off the session's triggers)."""
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
            try:
                yield conn
            finally:
                conn.exec_driver_sql("PRAGMA ignore_check_constraints = OFF")
        else:
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
            yield conn
