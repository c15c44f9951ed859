"""the initial store: runs, events, interventions, alerts, tool_circuits

Revision ID: 0001
Revises: 
Create Date: 2026-11-29
"""

from alembic import op
import sqlalchemy as sa

# Self-contained: a migration never imports the application (whose code moves on);
# timestamps are timestamptz on PostgreSQL and text on SQLite, as DateTime(timezone=True) makes them.


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('daemons',
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('pid_create_time', sa.Float(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_tick_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_event_id', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('host', name=op.f('pk_daemons'))
    )
    op.create_table('runs',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('agent', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('stop_reason', sa.String(length=32), nullable=True),
    sa.Column('stop_detail', sa.Text(), nullable=True),
    sa.Column('kill_mode', sa.String(length=16), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('pid_create_time', sa.Float(), nullable=True),
    sa.Column('labels', sa.JSON(), nullable=True),
    sa.Column('max_wall_s', sa.Float(), nullable=True),
    sa.Column('max_steps', sa.Integer(), nullable=True),
    sa.Column('max_tool_calls', sa.Integer(), nullable=True),
    sa.Column('max_cost_eur', sa.Float(), nullable=True),
    sa.Column('max_identical_calls', sa.Integer(), nullable=True),
    sa.Column('heartbeat_timeout_s', sa.Float(), nullable=True),
    sa.Column('steps', sa.Integer(), server_default='0', nullable=False),
    sa.Column('tool_calls', sa.Integer(), server_default='0', nullable=False),
    sa.Column('tool_errors', sa.Integer(), server_default='0', nullable=False),
    sa.Column('tokens_in', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('tokens_out', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('cost_eur', sa.Float(), server_default='0', nullable=False),
    sa.Column('last_seq', sa.Integer(), server_default='0', nullable=False),
    sa.Column('progress', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('stop_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('signal_stage', sa.String(length=16), nullable=True),
    sa.Column('signalled_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_agent_started_at'), ['agent', 'started_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_status'), ['status'], unique=False)

    op.create_table('settings',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.JSON(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_settings'))
    )
    op.create_table('tool_circuits',
    sa.Column('tool', sa.String(length=128), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('opened_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('open_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('errors_in_window', sa.Integer(), server_default='0', nullable=False),
    sa.Column('window_s', sa.Float(), nullable=True),
    sa.Column('last_error', sa.String(length=500), nullable=True),
    sa.Column('probe_run_id', sa.String(length=32), nullable=True),
    sa.Column('probe_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('tool', name=op.f('pk_tool_circuits'))
    )
    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('tool', sa.String(length=128), nullable=True),
    sa.Column('args_hash', sa.String(length=64), nullable=True),
    sa.Column('args', sa.JSON(), nullable=True),
    sa.Column('ok', sa.Boolean(), nullable=True),
    sa.Column('error_class', sa.String(length=128), nullable=True),
    sa.Column('error_msg', sa.String(length=500), nullable=True),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('model', sa.String(length=128), nullable=True),
    sa.Column('tokens_in', sa.Integer(), nullable=True),
    sa.Column('tokens_out', sa.Integer(), nullable=True),
    sa.Column('cost_eur', sa.Float(), nullable=True),
    sa.Column('progress', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_events_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events')),
    sa.UniqueConstraint('run_id', 'seq', name=op.f('uq_events_run_id_seq'))
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_tool_at'), ['tool', 'at'], unique=False)

    op.create_table('interventions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=True),
    sa.Column('tool', sa.String(length=128), nullable=True),
    sa.Column('action', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.String(length=32), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('outcome', sa.String(length=255), nullable=True),
    sa.Column('actor', sa.String(length=255), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_interventions_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_interventions'))
    )
    with op.batch_alter_table('interventions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_interventions_at'), ['at'], unique=False)
        batch_op.create_index(batch_op.f('ix_interventions_run_id'), ['run_id'], unique=False)

    op.create_table('alerts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('dedupe_key', sa.String(length=255), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=True),
    sa.Column('intervention_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('title', sa.String(length=500), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('delivered_targets', sa.JSON(), nullable=True),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['intervention_id'], ['interventions.id'], name=op.f('fk_alerts_intervention_id_interventions'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_alerts_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alerts')),
    sa.UniqueConstraint('dedupe_key', name=op.f('uq_alerts_dedupe_key'))
    )
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_alerts_delivered_at_next_attempt_at'), ['delivered_at', 'next_attempt_at'], unique=False)



def downgrade():
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_alerts_delivered_at_next_attempt_at'))

    op.drop_table('alerts')
    with op.batch_alter_table('interventions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_interventions_run_id'))
        batch_op.drop_index(batch_op.f('ix_interventions_at'))

    op.drop_table('interventions')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_tool_at'))

    op.drop_table('events')
    op.drop_table('tool_circuits')
    op.drop_table('settings')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_status'))
        batch_op.drop_index(batch_op.f('ix_runs_agent_started_at'))

    op.drop_table('runs')
    op.drop_table('daemons')
