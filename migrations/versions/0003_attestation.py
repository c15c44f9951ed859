"""attested identities, sealed alerts, probe claims by insert, the circuit's error class

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

- attestations: process identities the daemon attested (SO_PEERCRED), sealed with its key;
- alerts.sealed_by / alerts.mac: the outbox delivers only alerts a daemon composed;
- circuit_probes: the SDK claims a half-open probe by INSERT (agents never UPDATE tool_circuits);
- tool_circuits.last_error_class: what other runs' models are told about an open circuit.
"""

from alembic import op
import sqlalchemy as sa

# Self-contained: a migration never imports the application.

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('attestations',
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('pid_create_time', sa.Float(), nullable=False),
    sa.Column('uid', sa.Integer(), nullable=False),
    sa.Column('kill_mode', sa.String(length=16), nullable=False),
    sa.Column('attested_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('mac', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_attestations_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', name=op.f('pk_attestations'))
    )
    op.create_table('circuit_probes',
    sa.Column('tool', sa.String(length=128), nullable=False),
    sa.Column('opened_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('run_id', sa.String(length=32), nullable=False),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=True),
    sa.PrimaryKeyConstraint('tool', 'opened_at', name=op.f('pk_circuit_probes'))
    )
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('sealed_by', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('mac', sa.String(length=64), nullable=True))
    with op.batch_alter_table('tool_circuits', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_error_class', sa.String(length=128), nullable=True))


def downgrade():
    with op.batch_alter_table('tool_circuits', schema=None) as batch_op:
        batch_op.drop_column('last_error_class')
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_column('mac')
        batch_op.drop_column('sealed_by')
    op.drop_table('circuit_probes')
    op.drop_table('attestations')
