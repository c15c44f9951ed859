"""run shards: on PostgreSQL each run row and each new event carries its run's shard bucket

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

Issue 35: N judges share one store's runs by hash of run id (watchdog.daemon.leases.shards), and
each must read only its shards' part of the change feed and of the new events, in SQL: a read
of every changed run and every event, filtered in Python, made four judges' ticks no faster
than one's. So the tick's reads carry a stored number, `shard`: the run id's bucket among
watchdog.store.shards.BUCKETS (1024), the top 10 bits of the first 32 of md5(run id). A judge's
shard i of n is the buckets b with b * n // 1024 == i; its reads are `shard = ANY(:buckets)`.

No writer can skew it (a writer picks its run's id, never its shard or its judge):

* `runs.shard` is a generated column (GENERATED ALWAYS AS ... STORED): PostgreSQL refuses any
  value an INSERT or UPDATE gives it. Indexed with change_seq: the feed's read of one judge's
  changed runs (`shard = ANY(:buckets) AND change_seq > :cursor`).
* `events.shard` is written by the trigger `zz_aw_events_shard` from the row's own run_id, over
  whatever the writer gave (a generated column would break retention's `INSERT ... SELECT *`
  between partitions, watchdog.store.partitions; the trigger is cloned onto every partition).
  Not indexed: a judge reads the events above its high-water mark by the id index, the shard a
  filter on those few rows; an index would cost every one of ~60,000 inserts a second.
  Events stored before this revision keep NULL: a judge reads them only by run id (the cold
  fold of its runs' history, a takeover's fold of a shard's runs), never by the shard filter,
  which reads only events above a high-water mark taken after the upgrade. So no rewrite of a
  table of billions of rows.

SQLite keeps its tables: judges are sharded on PostgreSQL only (advisory locks).
"""

from __future__ import annotations

from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

# watchdog.store.shards.bucket_sql: the same expression (kept here: a migration never imports the package)
BUCKET_OF = "((('x' || substr(md5({col}), 1, 8))::bit(32)::bigint >> 22)::smallint)"
FUNCTION = "aw_events_shard"
TRIGGER = "zz_aw_events_shard"


def upgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute(f"ALTER TABLE runs ADD COLUMN shard smallint GENERATED ALWAYS AS ({BUCKET_OF.format(col='id')}) STORED")
    op.execute("CREATE INDEX ix_runs_shard_change_seq ON runs (shard, change_seq)")
    op.execute("ALTER TABLE events ADD COLUMN shard smallint")
    op.execute(f"""CREATE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  NEW.shard := {BUCKET_OF.format(col='NEW.run_id')};
  RETURN NEW;
END $$""")
    op.execute(f"REVOKE ALL ON FUNCTION {FUNCTION}() FROM PUBLIC")
    op.execute(f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()")


def downgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON events")
    op.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    op.execute("ALTER TABLE events DROP COLUMN IF EXISTS shard")
    op.execute("DROP INDEX IF EXISTS ix_runs_shard_change_seq")
    op.execute("ALTER TABLE runs DROP COLUMN IF EXISTS shard")
