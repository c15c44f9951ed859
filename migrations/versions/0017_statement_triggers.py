"""statement triggers: a burst of events pays its seq-once check and its change feed once

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-07

Issue 35 (batched ingest at 0.8x COPY): measured on PostgreSQL 15 with the roles script, the
row triggers of 0015 and 0012 were most of an event's cost in a burst (pg_stat_user_functions,
16 agent writers): `events_seq_once` ~26 us a row (a plpgsql call, an ownership probe, a lock
of the run row, a probe of every partition's (run_id, seq) index), `aw_change_events` ~7 us a
row (a deferred constraint trigger: one queued call and one UPDATE statement of the run row per
event, a no-op when the run row was already renumbered, as the SDK's is).

Both become one statement-level AFTER INSERT trigger each, reading the statement's rows from
its transition table (`REFERENCING NEW TABLE`), so a multi-row INSERT or a COPY of N events
costs two queries, not 2N calls:

* `events_seq_once` locks the rows of the statement's runs in `runs` (FOR NO KEY UPDATE, in id
  order, so two bursts never wait on each other in a cycle; the lock is still the run's own
  row, never an advisory key) and then, in a fresh snapshot (READ COMMITTED: each statement of
  a volatile function takes one), refuses the statement if any of its (run_id, seq) is stored
  twice, counting the rows committed by a transaction it waited for. Same error as before
  (unique_violation, constraint uq_events_run_id_seq), so every writer's "duplicate record"
  handling is unchanged. The ownership probe 0015 made first is no longer needed: row-level
  security's WITH CHECK is applied to each row as it is inserted, before any AFTER trigger, so
  another login's probe is refused as row-level security refuses it before its number is looked
  at (tests/system/test_partitions_pg.py).
* `zz_aw_change_events` numbers each run of the statement once, unless the transaction already
  renumbered its row (the SDK's record updates its counters in the same statement). A statement
  trigger cannot be deferred: the number is taken at the end of the INSERT instead of at COMMIT,
  which is the same moment for an autocommit statement (every SDK record and burst, the
  gateways, the OTLP receiver); a longer transaction's number may commit later than it would
  have, which the change feed's late window (watchdog.store.changes.LATE_READS) re-reads.

The BEFORE row triggers stay row triggers (they must change or check the row itself: the
server's time, 0007's checks), and so does row-level security. SQLite is unchanged.
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa

revision = '0017'
down_revision = '0015'
branch_labels = None
depends_on = None

SEQ_ONCE = "events_seq_once"
SEQ_ONCE_ROWS = "events_seq_once_rows"  # the function of this revision (0015's keeps its name)
CHANGE = "zz_aw_change_events"
CHANGE_ROWS = "aw_change_events_rows"
NEW_ROWS = "aw_new_events"


def _schema(bind) -> str:
    return '"' + bind.execute(sa.text("SELECT current_schema()")).scalar().replace('"', '""') + '"'


def _seq_once_rows(schema: str) -> str:
    return f"""CREATE FUNCTION {SEQ_ONCE_ROWS}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  dup record;
BEGIN
  -- The runs' own rows are the lock (see 0015), taken in id order by every inserter; a writer
  -- racing for the same number waits here for the first one's COMMIT, then sees its row below.
  -- (= ANY (ARRAY(...)): probes of the primary key; a transition table has no statistics, and a
  -- join with it was planned as a scan of every run.)
  PERFORM 1 FROM {schema}.runs r WHERE r.id = ANY (ARRAY(SELECT DISTINCT n.run_id FROM {NEW_ROWS} n))
    ORDER BY r.id FOR NO KEY UPDATE;
  SELECT n.run_id, n.seq INTO dup FROM (SELECT DISTINCT run_id, seq FROM {NEW_ROWS}) n
   WHERE (SELECT count(*) FROM (SELECT 1 FROM {schema}.events e WHERE e.run_id = n.run_id AND e.seq = n.seq
                                LIMIT 2) two) > 1
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'unique_violation', CONSTRAINT = 'uq_events_run_id_seq',
      MESSAGE = 'duplicate key value violates unique constraint "uq_events_run_id_seq"',
      DETAIL = format('Key (run_id, seq)=(%s, %s) already exists.', dup.run_id, dup.seq);
  END IF;
  RETURN NULL;
END
$$"""


def _change_rows(schema: str) -> str:
    return f"""CREATE FUNCTION {CHANGE_ROWS}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- change_seq = 0 only to have an UPDATE: zz_aw_change_seq writes the number (0012).
  UPDATE {schema}.runs r SET change_seq = 0 WHERE r.id = ANY (ARRAY(SELECT DISTINCT n.run_id FROM {NEW_ROWS} n))
     AND NOT (r.xmin::text = (pg_current_xact_id()::text::bigint % 4294967296)::text);
  RETURN NULL;
END
$$"""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    schema = _schema(bind)
    op.execute(f"DROP TRIGGER {SEQ_ONCE} ON events")
    op.execute(_seq_once_rows(schema))
    op.execute(f"REVOKE ALL ON FUNCTION {SEQ_ONCE_ROWS}() FROM PUBLIC")
    # Statement triggers fire by name too: the seq-once check (and its locks) before the feed.
    op.execute(f"CREATE TRIGGER {SEQ_ONCE} AFTER INSERT ON events REFERENCING NEW TABLE AS {NEW_ROWS} "
               f"FOR EACH STATEMENT EXECUTE FUNCTION {SEQ_ONCE_ROWS}()")
    op.execute(f"DROP TRIGGER {CHANGE} ON events")
    op.execute(_change_rows(schema))
    op.execute(f"REVOKE ALL ON FUNCTION {CHANGE_ROWS}() FROM PUBLIC")
    op.execute(f"CREATE TRIGGER {CHANGE} AFTER INSERT ON events REFERENCING NEW TABLE AS {NEW_ROWS} "
               f"FOR EACH STATEMENT EXECUTE FUNCTION {CHANGE_ROWS}()")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    op.execute(f"DROP TRIGGER {CHANGE} ON events")
    op.execute(f"DROP FUNCTION {CHANGE_ROWS}()")
    op.execute(f"CREATE CONSTRAINT TRIGGER {CHANGE} AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED "
               "FOR EACH ROW EXECUTE FUNCTION aw_change_events()")
    op.execute(f"DROP TRIGGER {SEQ_ONCE} ON events")
    op.execute(f"DROP FUNCTION {SEQ_ONCE_ROWS}()")
    op.execute(f"CREATE TRIGGER {SEQ_ONCE} BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION {SEQ_ONCE}()")
