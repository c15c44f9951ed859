"""run changes resync: the numbers written while 0018 copied runs into run_changes

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07

0018 fills `run_changes` with one INSERT ... SELECT FROM runs, then creates its triggers. The
SELECT does not stop writers (an ACCESS SHARE lock), and its snapshot is the statement's: a
writer's transaction open at that moment (an UPDATE of its run, a number taken), or one that
commits before CREATE TRIGGER takes its lock on runs, commits a number the copy never saw and no
trigger copied. That run's index row keeps its older number until the run's next change: a daemon
started after the upgrade (the feed reads `run_changes`) does not see that change (a stop
request, the run's end, a counter past its budget) until the run changes again or the tick's
full read comes round. Reproduced with a writer's transaction held open across `db upgrade`
(tests/store/test_run_changes_abuse.py).

So the index is copied again under a lock that stops every writer of runs (SHARE ROW EXCLUSIVE,
the lock CREATE TRIGGER takes): within the upgrade's transaction from an older store, 0018's
CREATE TRIGGER already holds it, and on a store already at 0018 no write is in flight while the
rows are compared. Only the rows that differ are written; a row of a run that is gone (none
should be: the delete trigger) goes. SQLite has no run_changes.
"""

from __future__ import annotations

from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    op.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
    op.execute("INSERT INTO run_changes AS c (run_id, change_seq, shard) SELECT id, change_seq, shard FROM runs\n"
               "    ON CONFLICT (run_id) DO UPDATE SET change_seq = EXCLUDED.change_seq, shard = EXCLUDED.shard\n"
               "    WHERE (c.change_seq, c.shard) IS DISTINCT FROM (EXCLUDED.change_seq, EXCLUDED.shard)")
    op.execute("DELETE FROM run_changes c WHERE NOT EXISTS (SELECT FROM runs r WHERE r.id = c.run_id)")


def downgrade() -> None:
    pass  # nothing to undo: 0018's downgrade drops the table
