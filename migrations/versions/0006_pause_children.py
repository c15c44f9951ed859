"""runs: parent_id (child runs), paused_at and resumes (pause and approve), partial (a stopped run's partial result)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

The new status `paused` needs no column. Where the store already checks the status
(a `ck_runs_status` CHECK constraint from an earlier revision), that one constraint is
replaced by one that also allows `paused`.
"""

from alembic import op
import sqlalchemy as sa

# Self-contained: a migration never imports the application.

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

STATUSES = ("running", "stopping", "completed", "failed", "killed", "lost")
WITH_PAUSED = ("running", "paused", "stopping", "completed", "failed", "killed", "lost")


def _status_in(statuses) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def _has_status_check(bind) -> bool:
    if bind.dialect.name == "sqlite":
        sql = bind.execute(sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'")).scalar()
        return "ck_runs_status" in (sql or "")
    return bind.execute(sa.text(
        "SELECT 1 FROM pg_constraint WHERE conname = 'ck_runs_status' AND conrelid = 'runs'::regclass")).first() is not None


def _replace_status_check(statuses) -> None:
    bind = op.get_bind()
    if not _has_status_check(bind):
        return
    with op.batch_alter_table('runs', recreate='always' if bind.dialect.name == 'sqlite' else 'auto') as b:
        b.drop_constraint(op.f('ck_runs_status'), type_='check')
        b.create_check_constraint(op.f('ck_runs_status'), _status_in(statuses))


def upgrade():
    # parent_id is a plain indexed column, no foreign key: SQLite cannot add one without
    # recreating the table, and a child outliving its pruned parent is harmless (the SDK checks
    # the parent exists when the child opens).
    op.add_column('runs', sa.Column('parent_id', sa.String(length=32), nullable=True))
    op.add_column('runs', sa.Column('paused_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('runs', sa.Column('resumes', sa.Integer(), server_default='0', nullable=False))
    op.add_column('runs', sa.Column('partial', sa.Text(), nullable=True))
    op.create_index(op.f('ix_runs_parent_id'), 'runs', ['parent_id'], unique=False)
    _replace_status_check(WITH_PAUSED)


def downgrade():
    # Paused runs do not exist before this revision: they go back to running (their SDK,
    # if still alive, holds them until it sees a status it knows).
    op.execute("UPDATE runs SET status = 'running', paused_at = NULL WHERE status = 'paused'")
    _replace_status_check(STATUSES)
    op.drop_index(op.f('ix_runs_parent_id'), table_name='runs')
    columns = ('partial', 'resumes', 'paused_at', 'parent_id')
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite' and bind.dialect.dbapi.sqlite_version_info >= (3, 35):
        # In place: a batch recreate would drop `runs`, and with it (ON DELETE CASCADE) every event.
        for col in columns:
            op.execute(f"ALTER TABLE runs DROP COLUMN {col}")
        return
    with op.batch_alter_table('runs') as b:
        for col in columns:
            b.drop_column(col)
