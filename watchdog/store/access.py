"""How a command reaches the store: an engine on a migrated store, what a driver's error means, and Alembic
driven from code.

How a command reaches the store: an engine on a migrated store, a read-only one for the web
view, and what a driver's error means, in one line, to the person who ran the command.

The CLI and the web view call these and never see SQLAlchemy's exception classes or a backend
branch (each backend's piece is its class in watchdog.store.dialects).

Alembic, driven from code: works from any directory, with no alembic.ini.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from watchdog.core.text import url_without_password
from watchdog.store.dialects import for_url
from watchdog.store.engine import (GATEWAY_ROLE, Engine, is_missing_schema, make_engine, normalise_url, require_tables,
                                   row_locked, share_sqlite_files)


if TYPE_CHECKING:  # alembic is imported by the migration verbs only: opening a store (the web view,
    from alembic.config import Config as AlembicConfig  # the LiteLLM callback) never loads it

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


def roles_choosing_event_ids(engine: Engine) -> list[str]:
    """PostgreSQL: the roles (not a superuser, not the tables' owner or its members) that may
    insert an event with an id of their own: a grant from a roles script older than revision 0013
    (the daemon folds the events above the newest id it read: such an id can hide later events).
    [] on SQLite, and when the catalog cannot tell."""
    if engine.dialect.name != "postgresql":
        return []
    sql = text("""SELECT r.rolname FROM pg_roles r, (SELECT relowner FROM pg_class WHERE oid = 'events'::regclass) t
WHERE NOT r.rolsuper AND r.rolname NOT LIKE 'pg\\_%' AND NOT pg_has_role(r.oid, t.relowner, 'USAGE')
  AND has_column_privilege(r.oid, 'events'::regclass, 'id', 'INSERT')
ORDER BY 1 LIMIT 20""")
    try:
        with engine.connect() as conn:
            return [str(name) for name in conn.execute(sql).scalars()]
    except Exception:  # noqa: BLE001 — a check at start: never the reason a daemon does not run
        return []


# What a gateway's login needs to witness a run another login owns (sql/postgres-roles.sql, the
# gateway's role): read the run, append an event, read the witnesses' numbers to take the next.
# (The agents' role reads its own events' numbers too, for agent-watchdog hook: what sets the
# gateway apart is the policy that lets it read every run, unless row-level security does not
# confine the login at all.)
_READS_EVERY_RUN = """(SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user)
 OR pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'runs'::regclass), 'USAGE')
 OR EXISTS (SELECT 1 FROM pg_policies p WHERE p.schemaname = current_schema() AND p.tablename = 'runs'
            AND p.cmd IN ('SELECT', 'ALL') AND p.qual = 'true'
            AND EXISTS (SELECT 1 FROM unnest(p.roles) AS r(name)
                        WHERE r.name <> 'public' AND pg_has_role(current_user, r.name, 'MEMBER')))"""
_GATEWAY_GRANTS = (("SELECT on runs", "has_table_privilege('runs', 'SELECT')"),
                   ("INSERT on events", "has_any_column_privilege('events', 'INSERT')"),
                   ("SELECT (seq) on events", "has_column_privilege('events', 'seq', 'SELECT')"),
                   ("the gateway's policy reading every run", _READS_EVERY_RUN))


def missing_gateway_grants(engine: Engine) -> str | None:
    """PostgreSQL: what this login lacks of the gateway's role, as one line with the fix (a
    gateway started with an agents' login records nothing of the runs it joins); None when it has
    them, on SQLite, and when the catalog cannot tell (the gateway's outage handling says what
    fails then)."""
    if engine.dialect.name != "postgresql":
        return None
    sql = text("SELECT " + ", ".join(check for _, check in _GATEWAY_GRANTS))
    try:
        with engine.connect() as conn:
            row = conn.execute(sql).one()
    except Exception:  # noqa: BLE001 — a check at start: an unreachable store is an outage, not this
        return None
    missing = [what for (what, _), ok in zip(_GATEWAY_GRANTS, row) if not ok]
    if not missing:
        return None
    return (f"the store at {url_without_password(engine.url.render_as_string())} lets this login witness no run "
            f"of another login (it lacks {', '.join(missing)}): grant it {GATEWAY_ROLE}, sql/postgres-roles.sql "
            f"(docs/howto/gateways.md)")


# -- Alembic, driven from code: works from any directory, with no alembic.ini ---------------------------

def migrations_dir() -> Path:
    package = Path(__file__).resolve().parent.parent  # watchdog/
    for candidate in (package / "_migrations", package.parent / "migrations"):  # wheel, then source tree
        if (candidate / "env.py").exists():
            return candidate
    raise FileNotFoundError("agent-watchdog's migrations are missing from this installation")


def alembic_config(engine: Engine) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def check_revision(engine: Engine, revision: str) -> None:
    """A revision Alembic does not know is one line naming those it does (issue 36), not its
    CommandError: `head`, `base`, relative forms (`-1`, `+2`) and every shipped revision pass."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    from watchdog.errors import StoreError

    script = ScriptDirectory.from_config(alembic_config(engine))
    if revision in ("head", "heads", "base") or revision.lstrip("+-").isdigit() and revision[:1] in "+-":
        return
    try:
        if script.get_revision(revision) is not None:
            return
    except CommandError:
        pass
    known = ", ".join(r.revision for r in reversed(list(script.walk_revisions())))
    raise StoreError(f"unknown revision {revision!r}: give head, base or one of {known}")


# PostgreSQL: how long `db upgrade` waits for any one lock before it rolls back and tries again.
# Some revisions lock `runs` against writers (0018's CREATE TRIGGER, 0019's copy: SHARE ROW
# EXCLUSIVE), and a lock request queues every later writer of the table behind it: an agent's
# transaction left idle with a change to its run would make the upgrade, and with it every agent's
# writes, wait for as long as it stays open. So the wait is bounded (writers stall at most this
# long), the whole upgrade (one transaction) is tried again a few times, then it fails, naming the
# fix, with nothing changed.
UPGRADE_LOCK_TIMEOUT_MS = 2_000
UPGRADE_TRIES = 5
UPGRADE_RETRY_PAUSE_S = 1.0


def upgrade(engine: Engine, revision: str = "head", *, lock_timeout_ms: int = UPGRADE_LOCK_TIMEOUT_MS,
            tries: int = UPGRADE_TRIES, pause_s: float = UPGRADE_RETRY_PAUSE_S) -> None:
    from alembic import command

    from watchdog.errors import StoreError

    check_revision(engine, revision)
    cfg = alembic_config(engine)
    for attempt in range(1, max(1, tries) + 1):
        try:
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(lock_timeout_ms)}ms'")
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
            return
        except DBAPIError as exc:
            if not row_locked(exc):
                raise
            if attempt >= tries:
                raise StoreError(
                    f"db upgrade: another session kept a table of the store locked past {lock_timeout_ms} ms, "
                    f"{tries} times; nothing changed: end the long transactions on the store (pg_stat_activity, "
                    f"state 'idle in transaction') and run it again") from None
            time.sleep(pause_s)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    check_revision(engine, revision)
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def current(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head() -> str:
    """The newest revision this installation ships (what `db upgrade` migrates to)."""
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    newest = ScriptDirectory.from_config(cfg).get_current_head()
    if newest is None:  # a migrations folder with no revision in it: the same broken install as none
        raise FileNotFoundError("agent-watchdog's migrations are missing from this installation")
    return newest


def is_older(revision: str | None) -> bool:
    """The store is at a revision this installation knows and can upgrade (not at head). An
    unknown revision was written by a newer agent-watchdog: not for this one to judge."""
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    if revision is None:
        return True
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    script = ScriptDirectory.from_config(cfg)
    try:
        script.get_revision(revision)
    except CommandError:
        return False
    return revision != script.get_current_head()
