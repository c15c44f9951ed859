"""Alembic, driven from code: works from any directory, with no alembic.ini."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy.engine import Engine


def migrations_dir() -> Path:
    package = Path(__file__).resolve().parent.parent  # watchdog/
    for candidate in (package / "_migrations", package.parent / "migrations"):  # wheel, then source tree
        if (candidate / "env.py").exists():
            return candidate
    raise FileNotFoundError("agent-watchdog's migrations are missing from this installation")


def alembic_config(engine: Engine) -> AlembicConfig:
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


def upgrade(engine: Engine, revision: str = "head") -> None:
    check_revision(engine, revision)
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
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
