"""events.attempt: a tool call's retry number, so retries are not counted as identical calls

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

# Self-contained: a migration never imports the application.

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('events') as batch_op:
        batch_op.add_column(sa.Column('attempt', sa.Integer(), nullable=True))


def downgrade():
    with op.batch_alter_table('events') as batch_op:
        batch_op.drop_column('attempt')
