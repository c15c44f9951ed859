"""change feed: every change of a run, and every new event of it, numbers the run anew

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

`runs.change_seq` is the number of the run's latest change: each INSERT or UPDATE of the run
row and each event inserted for it takes the next number of one store-wide counter, so "which
runs changed since N" is one range read of the index on change_seq, whatever the number of
active runs (issue 25: a tick that costs what changed). The database writes it, never a writer:

* PostgreSQL: the counter is the sequence `aw_change_seq`, on which no agent, gateway or viewer
  role gets any grant (sql/postgres-roles.sql revokes every sequence's): none can read ahead,
  set or rewind it. The triggers' functions are SECURITY DEFINER (they run as the tables' owner,
  with a fixed search_path) so that a writer's statement can take a number it may not take
  itself. Their triggers are named zz_aw_*, to fire after 0010's aw_* ones: `zz_aw_change_seq`
  is the last BEFORE trigger on runs (they fire by name), so whatever a writer puts into
  change_seq, on INSERT or UPDATE, is overwritten with the next number. An
  event numbers its run at COMMIT (a deferred constraint trigger), and only when the run row was
  not already renumbered by the same transaction (the SDK's record updates its run's counters
  in it): one write of the run row per record, as before, and a number taken as late as it can
  be, which keeps small the window in which a later number commits before an earlier one (the
  change feed re-reads that window, see watchdog.store.changes).
* SQLite: a sequence is a one-row table, `change_counter`, bumped by AFTER triggers in the
  writer's own transaction (SQLite commits one writer at a time, so numbers commit in order).
  Its row never goes down and is never deleted (triggers refuse both). All writers of a file
  share one trust domain there (DESIGN.md): the guard is against mistakes, not the file's owner.
  On PostgreSQL the table exists (the models are one for both backends) and stays empty: a row
  as counter would make every agent's transaction wait for the others' commits.

Existing active runs are numbered by the upgrade; ended runs keep 0 (no tick waits on them).
Self-contained: the active statuses are the lifecycle's (tests/store/test_migrations.py checks them).
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

ACTIVE = ("running", "stopping", "paused")
SEQUENCE = "aw_change_seq"

# -- SQLite: the counter row is (1, seq, run_id): run_id names the run the last number went to, so
# the runs trigger can tell its own renumbering (skip) from a writer's update (number it).
_SQLITE_BUMP = """  UPDATE change_counter SET seq = seq + 1, run_id = {rid} WHERE id = 1;
  UPDATE runs SET change_seq = (SELECT seq FROM change_counter WHERE id = 1) WHERE id = {rid};"""
_SQLITE = (
    # An update of a run row that is not the triggers' own renumbering: the row holding the
    # counter's number that differs from what it held is that renumbering, nothing else (after
    # every statement the counter's run row holds the counter's number).
    f"""CREATE TRIGGER aw_change_runs_update AFTER UPDATE ON runs FOR EACH ROW
WHEN NOT (NEW.change_seq IS NOT OLD.change_seq
          AND NEW.id IS (SELECT run_id FROM change_counter WHERE id = 1)
          AND NEW.change_seq IS (SELECT seq FROM change_counter WHERE id = 1))
BEGIN
{_SQLITE_BUMP.format(rid="NEW.id")}
END""",
    f"""CREATE TRIGGER aw_change_runs_insert AFTER INSERT ON runs FOR EACH ROW
BEGIN
{_SQLITE_BUMP.format(rid="NEW.id")}
END""",
    f"""CREATE TRIGGER aw_change_events_insert AFTER INSERT ON events FOR EACH ROW
BEGIN
{_SQLITE_BUMP.format(rid="NEW.run_id")}
END""",
    """CREATE TRIGGER aw_change_counter_update BEFORE UPDATE ON change_counter FOR EACH ROW
WHEN NEW.seq < OLD.seq OR NEW.id IS NOT OLD.id OR NEW.seq IS NULL
BEGIN
  SELECT RAISE(ABORT, 'agent-watchdog: the change counter only grows');
END""",
    """CREATE TRIGGER aw_change_counter_delete BEFORE DELETE ON change_counter FOR EACH ROW
BEGIN
  SELECT RAISE(ABORT, 'agent-watchdog: the change counter is never deleted');
END""",
)
_SQLITE_TRIGGERS = ("aw_change_runs_update", "aw_change_runs_insert", "aw_change_events_insert",
                    "aw_change_counter_update", "aw_change_counter_delete")


def _pg(schema: str) -> tuple[str, ...]:
    seq = f"{schema}.{SEQUENCE}"
    # xmin of the run row is this transaction's id when this transaction wrote it (as in 0010).
    mine = "r.xmin::text = (pg_current_xact_id()::text::bigint % 4294967296)::text"
    return (
        f"CREATE SEQUENCE {seq} AS bigint",
        f"""CREATE FUNCTION aw_change_runs() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  NEW.change_seq := nextval('{seq}');
  RETURN NEW;
END
$$""",
        # Last of the BEFORE triggers on runs (they fire in the order of their names).
        "CREATE TRIGGER zz_aw_change_seq BEFORE INSERT OR UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION aw_change_runs()",
        f"""CREATE FUNCTION aw_change_events() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- change_seq = 0 only to have an UPDATE: zz_aw_change_seq writes the number.
  UPDATE {schema}.runs r SET change_seq = 0 WHERE r.id = NEW.run_id AND NOT ({mine});
  RETURN NULL;
END
$$""",
        "CREATE CONSTRAINT TRIGGER zz_aw_change_events AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION aw_change_events()",
        # Functions are executable by PUBLIC by default; a trigger function cannot be called
        # directly, but nobody but the owner has any business naming these.
        "REVOKE ALL ON FUNCTION aw_change_runs() FROM PUBLIC",
        "REVOKE ALL ON FUNCTION aw_change_events() FROM PUBLIC",
    )


def _active() -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in ACTIVE) + ")"


def upgrade() -> None:
    op.add_column('runs', sa.Column('change_seq', sa.BigInteger(), nullable=False, server_default='0'))
    op.create_index('ix_runs_change_seq', 'runs', ['change_seq'], unique=False)
    op.create_table(
        'change_counter',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('seq', sa.BigInteger(), nullable=False),
        sa.Column('run_id', sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_change_counter')),
    )
    bind = op.get_bind()
    if bind.dialect.name == 'postgresql':
        schema = '"' + bind.execute(sa.text("SELECT current_schema()")).scalar().replace('"', '""') + '"'
        for statement in _pg(schema):
            op.execute(statement)
    else:
        op.execute("INSERT INTO change_counter (id, seq) VALUES (1, 0)")
        for statement in _SQLITE:
            op.execute(statement)
    # The active runs get their first number (the triggers write it): a feed read from 0 finds them.
    op.execute(f"UPDATE runs SET change_seq = 0 WHERE {_active()}")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == 'postgresql':
        op.execute("DROP TRIGGER IF EXISTS zz_aw_change_events ON events")
        op.execute("DROP FUNCTION IF EXISTS aw_change_events()")
        op.execute("DROP TRIGGER IF EXISTS zz_aw_change_seq ON runs")
        op.execute("DROP FUNCTION IF EXISTS aw_change_runs()")
        op.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")
    else:
        for name in _SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table('change_counter')
    op.drop_index('ix_runs_change_seq', table_name='runs')
    if bind.dialect.name == 'sqlite' and bind.dialect.dbapi.sqlite_version_info >= (3, 35):
        op.execute("ALTER TABLE runs DROP COLUMN change_seq")  # in place, as 0009 does (a recreate would cascade)
        return
    with op.batch_alter_table('runs') as b:
        b.drop_column('change_seq')
