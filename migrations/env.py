"""Alembic environment: the URL and the engine come from agent-watchdog, never from an alembic.ini."""

from alembic import context

from watchdog.store.engine import make_engine
from watchdog.store.schema import UTCDateTime, metadata

config = context.config


def render_item(type_, obj, autogen_context):
    """Autogenerate writes plain SQLAlchemy types: a migration never imports our modules."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def run_migrations_offline():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online():
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection):
    # Batch mode: SQLite cannot ALTER most things in place; batch recreates the table.
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True,
                      compare_type=True, render_item=render_item)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
