"""run changes: the change feed's index leaves the runs row, so a record's update of it is HOT

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

Issue 35 (batched ingest at 0.8x COPY, a burst of one record per run): measured on PostgreSQL 15
with the roles script, 16 agent writers, 16 records of 16 runs a burst, 10,000 active runs:
every one of the 46,896 run-row updates of a 6 s round was a non-HOT update (pg_stat_user_tables:
n_tup_upd 46,896, n_tup_hot_upd 0), because each one renumbers `runs.change_seq` (0012) and two
indexes hold it (0012's ix_runs_change_seq, 0016's ix_runs_shard_change_seq). A non-HOT update
inserts a new entry into every one of the row's 10 indexes: index inserts were 23 % of a
writer's server CPU (perf). With those two indexes gone, 83-90 % of the same updates were HOT
and the server's CPU an event fell from 181-191 us to 129-162 us.

So on PostgreSQL the feed's index is a narrow table of its own, `run_changes` (run id, its
number, its shard bucket), one row per run: the same number as `runs.change_seq`, which stays
where it is (the feed's rows still read it), now unindexed:

* The statement triggers `zz_aw_run_changes_*` (AFTER INSERT / UPDATE / DELETE ON runs, over the
  statement's transition table, SECURITY DEFINER) copy each written run's number into it, in the
  same statement, hence in the same transaction and snapshot as the run row: a reader sees both
  numbers or neither, and a number still commits when its transaction commits (the feed's late
  window is unchanged). One statement per statement of runs, not one per row.
* Nobody but the tables' owner has any right on the table (the roles script grants none: no
  writer can read, set or rewind a number, as with the sequence), and the triggers write it
  over whatever was there.
* The runs row gets fillfactor 80: a HOT update needs free space on the row's own page, and
  the rows of a fleet loaded at once fill their pages (85 % of updates HOT at 100, 90 % at 80).

The update of `run_changes` is itself not HOT (its number is indexed), but it inserts into its 3
narrow indexes instead of the run row's 10. SQLite is unchanged: it rewrites only the indexes
whose columns change, so runs.change_seq keeps its index there (the models' index).
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

TABLE = "run_changes"
RUNS_FILLFACTOR = 80
NEW_RUNS, OLD_RUNS = "aw_new_runs", "aw_old_runs"
# Each written run's number, upserted: a run row written while triggers were off (a restore, a
# fixture's bulk load) gets its row at its next change instead of never being read; and the
# conflict is found by the primary key whatever plan the session cached (a transition table has
# no statistics: a join with it could be planned as a scan of every run).
_UPSERT = (f"INSERT INTO {{s}}.{TABLE} AS c (run_id, change_seq, shard) SELECT n.id, n.change_seq, n.shard FROM {NEW_RUNS} n\n"
           "    ON CONFLICT (run_id) DO UPDATE SET change_seq = EXCLUDED.change_seq, shard = EXCLUDED.shard\n"
           "    WHERE c.change_seq IS DISTINCT FROM EXCLUDED.change_seq")
# (trigger, function, event, transition table, body)
_TRIGGERS = (
    ("zz_aw_run_changes_insert", "aw_run_changes_insert", "INSERT", f"NEW TABLE AS {NEW_RUNS}", _UPSERT),
    ("zz_aw_run_changes_update", "aw_run_changes_update", "UPDATE", f"NEW TABLE AS {NEW_RUNS}", _UPSERT),
    ("zz_aw_run_changes_delete", "aw_run_changes_delete", "DELETE", f"OLD TABLE AS {OLD_RUNS}",
     f"DELETE FROM {{s}}.{TABLE} c WHERE c.run_id = ANY (ARRAY(SELECT o.id FROM {OLD_RUNS} o))"),
)


def _schema(bind) -> str:
    return '"' + bind.execute(sa.text("SELECT current_schema()")).scalar().replace('"', '""') + '"'


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    schema = _schema(bind)
    op.execute(f"CREATE TABLE {TABLE} (run_id varchar(32) NOT NULL, change_seq bigint NOT NULL, shard smallint,"
               f" CONSTRAINT pk_{TABLE} PRIMARY KEY (run_id))")
    op.execute(f"REVOKE ALL ON {TABLE} FROM PUBLIC")
    op.execute(f"INSERT INTO {TABLE} (run_id, change_seq, shard) SELECT id, change_seq, shard FROM runs")
    op.execute(f"CREATE INDEX ix_{TABLE}_change_seq ON {TABLE} (change_seq)")
    op.execute(f"CREATE INDEX ix_{TABLE}_shard_change_seq ON {TABLE} (shard, change_seq)")
    for trigger, function, event, transition, body in _TRIGGERS:
        op.execute(f"""CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- An UPDATE of no row still fires its statement trigger (0017's feed trigger renumbers none
  -- of the SDK's runs, already renumbered by the record's own update): one probe, no INSERT.
  IF EXISTS (SELECT FROM {transition.split()[-1]}) THEN
    {body.format(s=schema)};
  END IF;
  RETURN NULL;
END
$$""")
        op.execute(f"REVOKE ALL ON FUNCTION {function}() FROM PUBLIC")
        op.execute(f"CREATE TRIGGER {trigger} AFTER {event} ON runs REFERENCING {transition} "
                   f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()")
    op.execute("DROP INDEX ix_runs_change_seq")
    op.execute("DROP INDEX ix_runs_shard_change_seq")
    op.execute(f"ALTER TABLE runs SET (fillfactor = {RUNS_FILLFACTOR})")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    op.execute("ALTER TABLE runs RESET (fillfactor)")
    op.execute("CREATE INDEX ix_runs_change_seq ON runs (change_seq)")
    op.execute("CREATE INDEX ix_runs_shard_change_seq ON runs (shard, change_seq)")
    for trigger, function, _event, _transition, _body in _TRIGGERS:
        op.execute(f"DROP TRIGGER {trigger} ON runs")
        op.execute(f"DROP FUNCTION {function}()")
    op.execute(f"DROP TABLE {TABLE}")
