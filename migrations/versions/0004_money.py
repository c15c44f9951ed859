"""money: cached / reasoning / unpriced tokens, the max_tokens budget, the period ledger and rollups

Revision ID: 0004
Revises: 0002
Create Date: 2026-12-01

- runs: cached_tokens_in, reasoning_tokens, cost_unpriced_tokens (counters), max_tokens
  (a run's own budget), booked_at (when the daemon booked the ended run into the ledger)
- events: cached_tokens_in, reasoning_tokens
- spend_ledger: per scope (agent or label set) and calendar period, the cost of the runs that ended in it
- agent_rollups / agent_rollup_tools: per agent and 5-minute bucket, the ended runs' totals (drift)

Runs that had ended before this migration are marked booked: the ledger starts now
(their history is not re-counted into today's budgets by the first tick).
"""

import sqlite3

from alembic import op
import sqlalchemy as sa

# Self-contained: a migration never imports the application (whose code moves on).

revision = '0004'
down_revision = '0002'
branch_labels = None
depends_on = None

ENDED = ('completed', 'failed', 'killed', 'lost')


def upgrade():
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_tokens', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('cached_tokens_in', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('reasoning_tokens', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('cost_unpriced_tokens', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('booked_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f('ix_runs_status_booked_at'), ['status', 'booked_at'], unique=False)
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cached_tokens_in', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('reasoning_tokens', sa.Integer(), nullable=True))

    runs = sa.table('runs', sa.column('status', sa.String), sa.column('booked_at', sa.DateTime(timezone=True)),
                    sa.column('ended_at', sa.DateTime(timezone=True)),
                    sa.column('last_seen_at', sa.DateTime(timezone=True)))
    op.execute(runs.update().where(runs.c.status.in_(ENDED))
               .values(booked_at=sa.func.coalesce(runs.c.ended_at, runs.c.last_seen_at)))

    op.create_table('spend_ledger',
    sa.Column('scope', sa.String(length=255), nullable=False),
    sa.Column('period', sa.String(length=8), nullable=False),
    sa.Column('period_key', sa.String(length=10), nullable=False),
    sa.Column('cost_eur', sa.Float(), server_default='0', nullable=False),
    sa.Column('runs', sa.Integer(), server_default='0', nullable=False),
    sa.Column('tokens', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('unpriced_tokens', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('scope', 'period', 'period_key', name=op.f('pk_spend_ledger'))
    )
    op.create_table('agent_rollups',
    sa.Column('agent', sa.String(length=128), nullable=False),
    sa.Column('bucket_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('runs', sa.Integer(), server_default='0', nullable=False),
    sa.Column('stopped', sa.Integer(), server_default='0', nullable=False),
    sa.Column('steps', sa.Integer(), server_default='0', nullable=False),
    sa.Column('tool_calls', sa.Integer(), server_default='0', nullable=False),
    sa.Column('tool_errors', sa.Integer(), server_default='0', nullable=False),
    sa.Column('cost_eur', sa.Float(), server_default='0', nullable=False),
    sa.Column('tokens', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('unpriced_tokens', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('agent', 'bucket_at', name=op.f('pk_agent_rollups'))
    )
    with op.batch_alter_table('agent_rollups', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agent_rollups_bucket_at'), ['bucket_at'], unique=False)
    op.create_table('agent_rollup_tools',
    sa.Column('agent', sa.String(length=128), nullable=False),
    sa.Column('bucket_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('tool', sa.String(length=128), nullable=False),
    sa.Column('calls', sa.Integer(), server_default='0', nullable=False),
    sa.Column('errors', sa.Integer(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('agent', 'bucket_at', 'tool', name=op.f('pk_agent_rollup_tools'))
    )
    with op.batch_alter_table('agent_rollup_tools', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agent_rollup_tools_bucket_at'), ['bucket_at'], unique=False)


def downgrade():
    with op.batch_alter_table('agent_rollup_tools', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agent_rollup_tools_bucket_at'))
    op.drop_table('agent_rollup_tools')
    with op.batch_alter_table('agent_rollups', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agent_rollups_bucket_at'))
    op.drop_table('agent_rollups')
    op.drop_table('spend_ledger')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_status_booked_at'))
    _drop_columns('events', ('reasoning_tokens', 'cached_tokens_in'))
    _drop_columns('runs', ('booked_at', 'cost_unpriced_tokens', 'reasoning_tokens', 'cached_tokens_in', 'max_tokens'))


def _drop_columns(table, names):
    # On SQLite a batch "recreate" drops and re-creates `runs`: with foreign keys on, that
    # DROP cascades to every event. SQLite >= 3.35 drops a plain column in place instead.
    if op.get_bind().dialect.name == 'sqlite' and sqlite3.sqlite_version_info >= (3, 35):
        for name in names:
            op.execute(f'ALTER TABLE {table} DROP COLUMN {name}')
        return
    with op.batch_alter_table(table, schema=None) as batch_op:
        for name in names:
            batch_op.drop_column(name)
