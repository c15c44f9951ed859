"""run changes light: the change feed's index also holds the light columns the feed reads

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-08

Issues 34 and 35. Since 0018 the feed reads its range of numbers in `run_changes` and each
changed run's light row from `runs`: a nested loop, one probe of runs' primary key (a text
compare per level under the database's collation) and one heap fetch of each row, on top of
run_changes' own heap fetches (its rows are updated with every write, so never all-visible:
no index-only path). auto_explain at 10,000 active runs, ~300 changed a tick: 1.1 ms a read
before 0018 (one index range scan of runs), 2.9 ms after, two reads a tick: the changed tick's
1.16x of issue 34. A sharded judge's confinement to its hosts (`runs.host = ANY(...)`) read the
run row for every number of the range or the late window too (issue 35).

So `run_changes` carries what the feed reads of a run, copied by the same statement triggers
(0018) from the statement's transition table, i.e. from the run row as it is stored, after
every BEFORE trigger and check (the writer's own text never reaches it any other way): its
identity and host, its status and stop times, its own budgets, the counters the budgets
measure, its start and last sight, its parent. The feed then reads one table in the order of
its index, as it read `runs` before 0018; `runs` keeps its HOT updates (none of these columns
is indexed there). The trust rules are 0018's: no login but the tables' owner has any right
on the table, the triggers are SECURITY DEFINER with a fixed search_path, every write of a run
renumbers it (0012's BEFORE trigger) and so rewrites its copy in the same statement.

The columns are copied under the lock that stops every writer of runs (as 0019), so no write
is lost between the copy and the new triggers. `runs.host` itself is a writer's claim made at
registration only: no login may update it (the roles script's column grants), so the host a run
is judged under is the one it registered, in both tables.
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

TABLE = "run_changes"
NEW_RUNS = "aw_new_runs"
# watchdog.store.change_index.LIGHT (kept here: a migration never imports the package; a test
# checks the two are equal). Named as in `runs`; their types are read from `runs`.
LIGHT = ("agent", "status", "kill_mode", "host", "pid", "pid_create_time",
         "max_steps", "max_tool_calls", "max_cost_eur", "max_tokens", "max_wall_s", "max_identical_calls",
         "heartbeat_timeout_s", "steps", "tool_calls", "cost_eur", "tokens_in", "tokens_out",
         "started_at", "last_seen_at", "stop_requested_at", "signal_stage", "signalled_at", "paused_at",
         "parent_id", "resumes")
FUNCTIONS = ("aw_run_changes_insert", "aw_run_changes_update")
# TRUNCATE runs (the owner's: a test's reset, an operator's) fires no DELETE trigger: before this
# revision an index row left behind joined no run and was never read; a copy is read alone.
TRUNCATE_FUNCTION, TRUNCATE_TRIGGER = "aw_run_changes_truncate", "zz_aw_run_changes_truncate"


def _schema(bind) -> str:
    return '"' + bind.execute(sa.text("SELECT current_schema()")).scalar().replace('"', '""') + '"'


def _upsert(schema: str, columns: tuple[str, ...], source: str, alias: str) -> str:
    cols = ", ".join(("run_id", "change_seq", "shard", *columns))
    picked = ", ".join(f"{alias}.{c}" for c in ("id", "change_seq", "shard", *columns))
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in ("change_seq", "shard", *columns))
    return (f"INSERT INTO {schema}.{TABLE} AS c ({cols}) SELECT {picked} FROM {source} {alias}\n"
            f"    ON CONFLICT (run_id) DO UPDATE SET {sets}")


def _function(schema: str, function: str, columns: tuple[str, ...]) -> str:
    # Every write of a run row renumbers it (0012's BEFORE trigger): its copy changes exactly when
    # its number does, so the number alone tells a statement's rewrite of a row already copied.
    body = _upsert(schema, columns, NEW_RUNS, "n") + "\n    WHERE c.change_seq IS DISTINCT FROM EXCLUDED.change_seq"
    return f"""CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- An UPDATE of no row still fires its statement trigger (0017's feed trigger renumbers none
  -- of the SDK's runs, already renumbered by the record's own update): one probe, no INSERT.
  IF EXISTS (SELECT FROM {NEW_RUNS}) THEN
    {body};
  END IF;
  RETURN NULL;
END
$$"""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    schema = _schema(bind)
    # First the lock writers of runs take before they write run_changes (their triggers): no deadlock.
    op.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
    types = dict(bind.execute(sa.text(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute "
        "WHERE attrelid = 'runs'::regclass AND attnum > 0 AND NOT attisdropped")).all())
    op.execute(f"ALTER TABLE {TABLE} " + ", ".join(f"ADD COLUMN {c} {types[c]}" for c in LIGHT))
    for function in FUNCTIONS:
        op.execute(_function(schema, function, LIGHT))
    every = ", ".join(("change_seq", "shard", *LIGHT))
    op.execute(_upsert(schema, LIGHT, f"{schema}.runs", "r")
               + f"\n    WHERE ROW(c.{every.replace(', ', ', c.')}) IS DISTINCT FROM ROW(EXCLUDED.{every.replace(', ', ', EXCLUDED.')})")
    op.execute(f"DELETE FROM {TABLE} c WHERE NOT EXISTS (SELECT FROM runs r WHERE r.id = c.run_id)")
    op.execute(f"""CREATE FUNCTION {TRUNCATE_FUNCTION}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  TRUNCATE {schema}.{TABLE};
  RETURN NULL;
END
$$""")
    op.execute(f"REVOKE ALL ON FUNCTION {TRUNCATE_FUNCTION}() FROM PUBLIC")
    op.execute(f"CREATE TRIGGER {TRUNCATE_TRIGGER} AFTER TRUNCATE ON runs FOR EACH STATEMENT "
               f"EXECUTE FUNCTION {TRUNCATE_FUNCTION}()")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    schema = _schema(bind)
    op.execute(f"DROP TRIGGER {TRUNCATE_TRIGGER} ON runs")
    op.execute(f"DROP FUNCTION {TRUNCATE_FUNCTION}()")
    for function in FUNCTIONS:
        op.execute(_function(schema, function, ()))
    op.execute(f"ALTER TABLE {TABLE} " + ", ".join(f"DROP COLUMN {c}" for c in LIGHT))
