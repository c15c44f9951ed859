"""The PostgreSQL server the tests use, for conftest.py and for tests that make their own databases.

Imported by name (`from pg_support import PG_ADMIN_URL`), never through `conftest`: each kind's
folder has its own conftest.py, and a bare `import conftest` gets whichever was loaded last.
"""

from __future__ import annotations

from typing import Any

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, insert, make_url, text

from watchdog.store.engine import make_engine
from watchdog.store.schema import metadata, runs, utcnow

PG_ADMIN_URL = os.environ.get("AGENT_WATCHDOG_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgresql"]


# What `TRUNCATE <the schema's tables> RESTART IDENTITY CASCADE` would touch: those tables, the
# tables whose foreign keys reach them (CASCADE), and the sequences those tables' columns own.
_TRUNCATED = text("""
WITH RECURSIVE t(oid) AS (
    SELECT to_regclass(n) FROM unnest(CAST(:names AS text[])) AS n WHERE to_regclass(n) IS NOT NULL
    UNION SELECT k.conrelid FROM pg_constraint k JOIN t ON k.confrelid = t.oid WHERE k.contype = 'f'
)
SELECT (SELECT array_agg(quote_ident(n.nspname) || '.' || quote_ident(c.relname)) FROM t
            JOIN pg_class c ON c.oid = t.oid JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE NOT c.relispartition),
       (SELECT array_agg(d.objid) FROM pg_depend d JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
            WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
              AND d.deptype IN ('a', 'i') AND d.refobjid IN (SELECT oid FROM t))
""")


def empty_pg(url: str) -> None:
    """Empty every table of the store at url (the schema stays): the end state of
    `TRUNCATE ... RESTART IDENTITY CASCADE` on the schema's tables, without its cost (~0.3-0.5 s
    here, a new file for each table, partition and index, for each of ~460 PostgreSQL tests): as the
    superuser, DELETE with triggers and foreign-key checks off (session_replication_role = replica;
    TRUNCATE fires no row trigger either), then each owned sequence back to its start."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            if conn.execute(text("SELECT current_setting('is_superuser')")).scalar() != "on":
                names = ", ".join(t.name for t in metadata.sorted_tables)
                conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
                return
            # run_changes (revision 0018, PostgreSQL's own: not in the metadata) mirrors runs through
            # triggers this DELETE turns off; TRUNCATE empties it by its own trigger (0020).
            names = [t.name for t in metadata.sorted_tables] + ["run_changes"]
            tables, sequences = conn.execute(_TRUNCATED, {"names": names}).one()
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            for name in tables or ():
                conn.execute(text(f"DELETE FROM {name}"))
            for seq in sequences or ():
                conn.execute(text("SELECT setval(CAST(:s AS oid)::regclass, seqstart, false) FROM pg_sequence "
                                  "WHERE seqrelid = :s"), {"s": seq})
    finally:
        engine.dispose()


@contextmanager
def emptied_engine(url: str) -> Iterator[Engine]:
    """An engine on the (migrated) store at url, every table emptied first; disposed after."""
    empty_pg(url)
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def insert_runs(engine: Engine, n: int, host: str = "elsewhere") -> list[str]:
    """n running runs of agent `bot` on `host` (by default not the judge's), their ids."""
    ids = [uuid.uuid4().hex for _ in range(n)]
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(runs), [dict(id=rid, agent="bot", status="running", kill_mode="cooperative", host=host,
                                         started_at=now, last_seen_at=now) for rid in ids])
    return ids


@contextmanager
def attested_daemon(store: "RolesStore", attest: Any) -> Iterator[tuple[Engine, Any]]:
    """The daemon's engine on a RolesStore and its attestation socket's sealer (agents started
    afterwards attest through it); `attest` is conftest's fixture of that name."""
    a = attest(store.url("daemon"))
    engine = make_engine(store.url("daemon"))
    try:
        yield engine, a.sealer
    finally:
        engine.dispose()


def raw(url: str, **kw: Any) -> Any:
    """The driver's own connection (psycopg) to a store URL of SQLAlchemy's form: what a plain-SQL
    writer, or an agent holding its own transaction open, does."""
    import psycopg

    return psycopg.connect(url.replace("+psycopg", ""), **kw)


def let_go(conn: Any) -> None:
    """End a raw connection that holds row locks, the locks gone when this returns. A bare close()
    only hangs up: the server's backend releases the locks when it notices and exits, which on a
    loaded machine can be after the test's next statement (seen: a SKIP LOCKED read still passed
    over the row). ROLLBACK is answered only once the locks are released."""
    conn.rollback()
    conn.close()


class RolesStore:
    """A store of its own on the test server, set up as production is: a database owned by the
    daemon's login, migrated by it, then the real roles script (sql/postgres-roles.sql), and
    logins `a` and `b` in the agents' role and `gw` in the gateway role. `drop()` leaves nothing
    on the server (the database and every role it made)."""

    SCRIPT = Path(__file__).resolve().parents[1] / "sql" / "postgres-roles.sql"

    def __init__(self, server: str, prefix: str = "aw") -> None:
        tag = uuid.uuid4().hex[:8]
        self.db, self.daemon = f"{prefix}_{tag}", f"{prefix}_d_{tag}"
        self.agents, self.gateway, self.viewer = f"{prefix}_ag_{tag}", f"{prefix}_gw_{tag}", f"{prefix}_vw_{tag}"
        self.logins = {"a": f"{prefix}_a_{tag}", "b": f"{prefix}_b_{tag}", "gw": f"{prefix}_gl_{tag}"}
        self.roles = {"daemon": self.daemon, "agents": self.agents, "gateway": self.gateway, "viewer": self.viewer}
        self.base = make_url(server)
        self.admin = create_engine(server, isolation_level="AUTOCOMMIT")

    def url(self, who: str) -> str:
        user = self.daemon if who == "daemon" else self.logins[who]
        return self.base.set(username=user, database=self.db).render_as_string(hide_password=False)

    def roles_script(self) -> None:
        u = self.base
        done = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={self.agents}",
                               "-v", f"gateway_role={self.gateway}", "-v", f"viewer_role={self.viewer}",
                               "-h", str(u.host), "-p", str(u.port or 5432), "-U", str(u.username), "-d", self.db,
                               "-f", str(self.SCRIPT)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    def create(self, revision: str = "head") -> "RolesStore":
        from watchdog.store import access

        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{self.daemon}" LOGIN'))
            conn.execute(text(f'CREATE DATABASE "{self.db}" OWNER "{self.daemon}"'))
        try:
            engine = make_engine(self.url("daemon"))
            access.upgrade(engine, revision)
            engine.dispose()
            self.roles_script()
            with self.admin.connect() as conn:
                for key, group in (("a", self.agents), ("b", self.agents), ("gw", self.gateway)):
                    conn.execute(text(f'CREATE ROLE "{self.logins[key]}" LOGIN'))
                    conn.execute(text(f'GRANT "{group}" TO "{self.logins[key]}"'))
        except BaseException:
            self.drop()  # nothing of a failed set-up is left on the server
            raise
        return self

    def __enter__(self) -> "RolesStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()

    def drop(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)'))
            for role in (*self.logins.values(), self.agents, self.gateway, self.viewer, self.daemon):
                conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        self.admin.dispose()
