"""evidence: the sealed record behind a run's evidence key (attestations.evidence)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

On SQLite a signal needs records only the run's attested process could have written: the
daemon hands that process a per-run key at attestation, derived from its own key, the run id
and a nonce. `attestations.evidence` keeps that nonce, when the run was attested and the
budgets it registered with, sealed with the daemon's key (JSON), so a restarted daemon derives
the same key and no writer can move the run's start or lower its budgets behind it.
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('attestations', sa.Column('evidence', sa.Text(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite' and bind.dialect.dbapi.sqlite_version_info >= (3, 35):
        op.execute("ALTER TABLE attestations DROP COLUMN evidence")  # in place, as 0009 does
        return
    with op.batch_alter_table('attestations') as b:
        b.drop_column('evidence')
