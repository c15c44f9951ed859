"""alerts: claimed_by / claimed_until (delivery claims), dead_at (dead letters)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

A delivery pass claims the rows it sends (several deliverers on one store send each
alert once; a crashed claimer's claims expire). An alert not delivered within
[daemon] alert_expire_s, or a row that cannot be read, is dead-lettered: kept, never
retried.
"""

from alembic import op
import sqlalchemy as sa

# Self-contained: a migration never imports the application.

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

COLUMNS = ('claimed_by', 'claimed_until', 'dead_at')


def upgrade():
    op.add_column('alerts', sa.Column('claimed_by', sa.String(length=255), nullable=True))
    op.add_column('alerts', sa.Column('claimed_until', sa.DateTime(timezone=True), nullable=True))
    op.add_column('alerts', sa.Column('dead_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index(op.f('ix_alerts_dead_at'), 'alerts', ['dead_at'], unique=False)


def downgrade():
    # Before this revision an alert is undelivered or delivered: a dead letter is closed
    # (delivered_at set, its last_error says why), so the older outbox never retries it.
    op.execute("UPDATE alerts SET delivered_at = dead_at WHERE dead_at IS NOT NULL AND delivered_at IS NULL")
    op.drop_index(op.f('ix_alerts_dead_at'), table_name='alerts')
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite' and bind.dialect.dbapi.sqlite_version_info >= (3, 35):
        for col in reversed(COLUMNS):  # in place, as 0006 does: no table recreate
            op.execute(f"ALTER TABLE alerts DROP COLUMN {col}")
        return
    with op.batch_alter_table('alerts') as b:
        for col in reversed(COLUMNS):
            b.drop_column(col)
