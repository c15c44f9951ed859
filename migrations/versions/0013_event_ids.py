"""event ids: an event's id is the store's to give, never a writer's choice

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

The daemon folds the events above the newest id it has read (watchdog.daemon.trust.scan): an id is
the table's counter's, and each new event's is above every earlier one. A writer that chose an
event's id could hide every later event from the daemon: on SQLite an event at id 2**63 - 1
makes SQLite give later rows random ids, below the daemon's mark, for ever (and the mark comes
back from the store at every restart).

* SQLite (one trust domain per file, DESIGN.md: the guard is against mistakes and forged rows,
  not the file's owner): a trigger refuses an event whose id is more than MAX_JUMP above the
  newest. A record that leaves the id to the store (NEW.id reads -1 before its insert) costs
  one probe of the primary key's last entry, and only when it names an id at all.
* PostgreSQL: the roles script (sql/postgres-roles.sql) grants the agents' and the gateway's
  roles INSERT on every column of events but the id, which only its sequence gives.
"""

from __future__ import annotations

from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

# Ids a writer may still name above the newest (an import, a test): reaching the largest id in
# such steps would take ~10**13 inserts.
MAX_JUMP = 1_000_000
TRIGGERS = ("aw_events_id", "aw_events_id_kept")


def upgrade() -> None:
    if op.get_bind().dialect.name != 'sqlite':
        return
    op.execute(f"""CREATE TRIGGER aw_events_id BEFORE INSERT ON events FOR EACH ROW
WHEN NEW.id > {MAX_JUMP} AND NEW.id > (SELECT coalesce(max(id), 0) FROM events) + {MAX_JUMP}
BEGIN
  SELECT RAISE(ABORT, 'agent-watchdog: an event''s id is the store''s to give');
END""")
    # ...nor does an event's id change afterwards (the same hole, by UPDATE). Not `UPDATE OF id`:
    # SQLite picks such triggers by the names in the SET clause, and `SET rowid = ...` (or oid,
    # _rowid_: the same column) would pass. The WHEN costs the daemon's pricing UPDATE a compare.
    op.execute("""CREATE TRIGGER aw_events_id_kept BEFORE UPDATE ON events FOR EACH ROW
WHEN NEW.rowid IS NOT OLD.rowid
BEGIN
  SELECT RAISE(ABORT, 'agent-watchdog: an event''s id never changes');
END""")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
