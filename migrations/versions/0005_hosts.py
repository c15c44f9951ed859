"""several hosts on one store: lease expiry and leader on daemons, per-host scan index,
retention and listing indexes, the sealed top tool of ended runs

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-08
"""

from alembic import op
import sqlalchemy as sa

# Self-contained: a migration never imports the application.

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

UNSEALED = "ended_at IS NOT NULL AND top_tool_calls IS NULL"


def upgrade():
    # Adding nullable columns and indexes: no table is rebuilt, on SQLite either.
    with op.batch_alter_table('daemons') as batch_op:
        batch_op.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('leader_since', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('runs') as batch_op:
        batch_op.add_column(sa.Column('top_tool', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('top_tool_calls', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('top_tool_errors', sa.Integer(), nullable=True))
        batch_op.drop_index('ix_runs_status')
        batch_op.create_index('ix_runs_status_host', ['status', 'host'], unique=False)
        batch_op.create_index('ix_runs_started_at_id', ['started_at', 'id'], unique=False)
        batch_op.create_index('ix_runs_ended_at', ['ended_at'], unique=False)
        batch_op.create_index('ix_runs_unsealed', ['ended_at'], unique=False,
                              postgresql_where=sa.text(UNSEALED), sqlite_where=sa.text(UNSEALED))
    with op.batch_alter_table('alerts') as batch_op:
        batch_op.create_index('ix_alerts_run_id', ['run_id'], unique=False)
        batch_op.create_index('ix_alerts_intervention_id', ['intervention_id'], unique=False)


def downgrade():
    with op.batch_alter_table('alerts') as batch_op:
        batch_op.drop_index('ix_alerts_intervention_id')
        batch_op.drop_index('ix_alerts_run_id')
    for name in ('ix_runs_unsealed', 'ix_runs_ended_at', 'ix_runs_started_at_id', 'ix_runs_status_host'):
        op.drop_index(name, table_name='runs')
    op.create_index('ix_runs_status', 'runs', ['status'], unique=False)
    columns = ('top_tool_errors', 'top_tool_calls', 'top_tool')
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite' and bind.dialect.dbapi.sqlite_version_info >= (3, 35):
        # In place: a batch recreate would drop `runs`, and with it (ON DELETE CASCADE) every event.
        for col in columns:
            op.execute(f"ALTER TABLE runs DROP COLUMN {col}")
    else:
        with op.batch_alter_table('runs') as batch_op:
            for col in columns:
                batch_op.drop_column(col)
    with op.batch_alter_table('daemons') as batch_op:
        batch_op.drop_column('leader_since')
        batch_op.drop_column('expires_at')
