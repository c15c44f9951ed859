"""Writing what the schema refuses: rows from before its checks, or by hand with them off."""

from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import text


@contextmanager
def constraints_off(engine):
    """A transaction in which the store's CHECK constraints (PostgreSQL) and check triggers
    (SQLite) do not apply, as for a row written before migration 0007 or by hand."""
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
            names = conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
                                      "AND name LIKE 'ck_%'")).all()
            for name, _sql in names:
                conn.exec_driver_sql(f'DROP TRIGGER "{name}"')
            yield conn
            for _name, sql in names:
                conn.exec_driver_sql(sql)
        else:
            rows = conn.execute(text(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE contype = 'c' AND conname LIKE 'ck_%'")).all()
            for table, name, _d in rows:
                conn.exec_driver_sql(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            yield conn
            for table, name, definition in rows:
                # NOT VALID, as the migration adds them: the rows written meanwhile stay.
                conn.exec_driver_sql(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition} NOT VALID'
                                     if "NOT VALID" not in definition else
                                     f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
