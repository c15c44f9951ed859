"""The PostgreSQL server the tests use, for conftest.py and for tests that make their own databases.

Imported by name (`from pg_support import PG_ADMIN_URL`), never through `conftest`: each kind's
folder has its own conftest.py, and a bare `import conftest` gets whichever was loaded last.
"""

from __future__ import annotations

import os

from sqlalchemy import text

from watchdog.store.engine import make_engine
from watchdog.store.schema import metadata

PG_ADMIN_URL = os.environ.get("AGENT_WATCHDOG_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgresql"]


def empty_pg(url: str) -> None:
    """Empty every table of the store at url (the schema stays)."""
    engine = make_engine(url)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()
