"""owners: every run row belongs to the login that wrote it; each writer keeps to its own rows

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

`runs.owner` is the PostgreSQL login (`session_user`, which `SET ROLE` does not change) that
inserted the run, written by the database: a value the writer supplies is overwritten. Rows
from before this revision have none (NULL): only the daemon's role may change them.

On PostgreSQL, for every role but the daemon's (the tables' owner, which runs `db upgrade`) and
superusers, i.e. the agents', the gateway's and any other:

* row-level security: such a login reads and changes only the runs it owns and inserts events
  only for them (sql/postgres-roles.sql adds what the gateway and the viewer may do beyond that);
* a trigger on runs (`aw_runs_writer`, fired before the 0007 checks): the times are the
  server's `now()`; counters only grow; the status moves only as DESIGN.md's trust model
  lists; `resumes`, the ladder's columns (signal_stage, signalled_at), the sealed top tool,
  booked_at and owner are not the writer's; budgets only go down; `parent_id` names a run of
  the same owner, at insert (the SDK sets it in the inserting transaction) and never after.
* a trigger on events (`aw_events_writer`): `at` is the server's `now()`.

The daemon's role and superusers are not restricted: the daemon stops, books, seals and
rebases any row. On SQLite the column exists and stays NULL: all writers of a file share one
trust domain there (DESIGN.md).

Self-contained: the status lists below are the lifecycle's (tests/system/test_owners_pg.py checks them).
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

ACTIVE = ("running", "stopping", "paused")
ENDED_BY_WRITER = ("completed", "failed", "killed")
# What a writer may move its own run to, from each status (DESIGN.md, "Trust model"). paused →
# stopping is the SDK's own give-up on a pause nobody answered (watchdog.sdk.obey).
MOVES = {
    "running": ("stopping", "paused", *ENDED_BY_WRITER),
    "stopping": ENDED_BY_WRITER,
    "paused": ("stopping", *ENDED_BY_WRITER),
}
COUNTERS = ("steps", "tool_calls", "tool_errors", "tokens_in", "tokens_out", "cost_eur", "cached_tokens_in",
            "reasoning_tokens", "cost_unpriced_tokens", "last_seq")
BUDGETS = ("max_steps", "max_tool_calls", "max_tokens", "max_identical_calls", "max_cost_eur", "max_wall_s",
           "heartbeat_timeout_s")
NOT_THE_WRITERS = ("resumes", "signal_stage", "signalled_at", "top_tool", "top_tool_calls", "top_tool_errors",
                   "booked_at", "owner", "id", "started_at")
TIMES = ("stop_requested_at", "ended_at", "paused_at")  # set to now() whenever the writer sets them

# Policies of this revision (every other policy on the two tables is sql/postgres-roles.sql's).
POLICIES = (("runs", "aw_runs_own"), ("events", "aw_events_own"))


# Who is not restricted: the daemon's role and superusers. The test is TRUNCATE on the table
# (the owner has it, and so do its members and superusers; the roles script never grants it):
# a role that may empty the table gains nothing from rewriting rows, and the test is one ACL
# lookup of the session's login (no query), which the agents' hot path pays on every row.
_TRUSTED = "has_table_privilege(session_user, TG_RELID, 'TRUNCATE')"


def _quote(values) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _refuse(what: str) -> str:
    return f"RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = 'agent-watchdog: {what}';"


def _runs_function(schema: str) -> str:
    moves = " OR ".join(f"(OLD.status = '{a}' AND NEW.status IN ({_quote(b)}))" for a, b in MOVES.items())
    grown = " OR ".join(f"NEW.{c} < OLD.{c}" for c in COUNTERS)
    raised = " OR ".join(f"(OLD.{c} IS NOT NULL AND (NEW.{c} IS NULL OR NEW.{c} > OLD.{c}))" for c in BUDGETS)
    theirs = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in NOT_THE_WRITERS)
    times = "\n".join(
        f"    IF NEW.{c} IS DISTINCT FROM OLD.{c} THEN\n"
        f"      IF NEW.{c} IS NULL THEN {_refuse(f'{c} is set by the server and never cleared by a writer')} END IF;\n"
        f"      NEW.{c} := now();\n"
        f"    END IF;" for c in TIMES)
    insert_times = "\n".join(f"    IF NEW.{c} IS NOT NULL THEN NEW.{c} := now(); END IF;" for c in TIMES)
    return f"""CREATE FUNCTION aw_runs_writer() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  trusted boolean := {_TRUSTED};
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF trusted THEN
      NEW.owner := coalesce(NEW.owner, session_user::text);
      RETURN NEW;
    END IF;
    NEW.owner := session_user;
    IF NEW.resumes IS DISTINCT FROM 0 THEN {_refuse('resumes is the operator''s (agent-watchdog resume), not the writer''s')} END IF;
    IF NEW.signal_stage IS NOT NULL OR NEW.signalled_at IS NOT NULL OR NEW.booked_at IS NOT NULL
       OR NEW.top_tool IS NOT NULL OR NEW.top_tool_calls IS NOT NULL OR NEW.top_tool_errors IS NOT NULL THEN
      {_refuse('signal_stage, signalled_at, top_tool*, booked_at are the daemon''s')}
    END IF;
    IF NEW.status NOT IN ({_quote(MOVES)}, {_quote(ENDED_BY_WRITER)}) THEN
      {_refuse('a writer inserts a run running, stopping, paused or ended')}
    END IF;
    NEW.started_at := now();
    NEW.last_seen_at := now();
{insert_times}
    IF NEW.ended_at IS NOT NULL AND NEW.status IN ({_quote(ACTIVE)}) THEN {_refuse('ended_at is for an ended run')} END IF;
    IF NEW.parent_id IS NOT NULL AND (NEW.parent_id = NEW.id OR NOT EXISTS (
         SELECT 1 FROM {schema}.runs p WHERE p.id = NEW.parent_id AND p.owner = session_user)) THEN
      {_refuse('parent_id must name a run of the same owner')}
    END IF;
    RETURN NEW;
  END IF;
  IF trusted THEN
    RETURN NEW;
  END IF;
  IF {theirs} THEN
    {_refuse('id, owner, started_at, resumes, signal_stage, signalled_at, top_tool*, booked_at are not the writer''s')}
  END IF;
  IF {grown} THEN
    {_refuse('counters only grow')}
  END IF;
  IF {raised} THEN
    {_refuse('a writer may lower its run''s budgets, never raise them (agent-watchdog resume does)')}
  END IF;
  IF NEW.status <> OLD.status AND NOT ({moves}) THEN
    {_refuse('this status change is not the writer''s (running -> stopping, paused, completed, failed, killed; stopping, paused -> completed, failed, killed)')}
  END IF;
  -- (Filling in a detail the stop did not give is the SDK's end: COALESCE(stop_detail, ...).)
  IF OLD.status <> 'running' AND ((OLD.stop_reason IS NOT NULL AND NEW.stop_reason IS DISTINCT FROM OLD.stop_reason)
                                 OR (OLD.stop_detail IS NOT NULL AND NEW.stop_detail IS DISTINCT FROM OLD.stop_detail)) THEN
    {_refuse('a stop''s reason, once given, is kept')}
  END IF;
  IF NEW.last_seen_at IS DISTINCT FROM OLD.last_seen_at THEN
    NEW.last_seen_at := greatest(OLD.last_seen_at, now());
  END IF;
{times}
  IF NEW.ended_at IS NOT NULL AND NEW.status IN ({_quote(ACTIVE)}) THEN {_refuse('ended_at is for an ended run')} END IF;
  IF NEW.parent_id IS DISTINCT FROM OLD.parent_id THEN
    -- Only in the transaction that inserted the run (the SDK's start writes it so), only once.
    IF OLD.parent_id IS NOT NULL OR NEW.parent_id IS NULL OR NEW.parent_id = NEW.id
       OR NOT EXISTS (SELECT 1 FROM {schema}.runs s WHERE s.id = OLD.id
                        AND s.xmin::text = (pg_current_xact_id()::text::bigint % 4294967296)::text)
       OR NOT EXISTS (SELECT 1 FROM {schema}.runs p WHERE p.id = NEW.parent_id AND p.owner = session_user) THEN
      {_refuse('parent_id is set once, with the run''s insert, to a run of the same owner')}
    END IF;
  END IF;
  RETURN NEW;
END
$$"""


_EVENTS_FUNCTION = f"""CREATE FUNCTION aw_events_writer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NOT {_TRUSTED} THEN
    NEW.at := now();  -- the server's clock, never the writer's
  END IF;
  RETURN NEW;
END
$$"""

# Is this run the session login's own? A plpgsql function, so that its query is planned once
# per session: the SDK's statements are never prepared (PgBouncer's transaction pooling), and
# an EXISTS subquery in the events policy was planned anew for every event (1.35x a record).
# Its table is named with its schema: a plpgsql body resolves names at run time, and a writer
# may create a TEMP table `runs` that the search path would find first.
def _owned_function(schema: str) -> str:
    return f"""CREATE FUNCTION aw_run_owned(run text) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN EXISTS (SELECT 1 FROM {schema}.runs r WHERE r.id = run AND r.owner = session_user);
END
$$"""


# Own rows only, for every role the policies apply to (not the tables' owner, not superusers),
# except one the triggers trust too: a login in the daemon's role (a member of the owner) or
# granted TRUNCATE is the daemon's, whether or not it connects as the owner itself. (A policy's
# names are bound when it is created: no search path reaches them.)
_OWN_RUN = "has_table_privilege(session_user, 'runs'::regclass, 'TRUNCATE') OR owner = session_user"
_OWN_EVENT = "has_table_privilege(session_user, 'events'::regclass, 'TRUNCATE') OR aw_run_owned(run_id)"


def upgrade() -> None:
    op.add_column('runs', sa.Column('owner', sa.String(length=63), nullable=True))
    if op.get_bind().dialect.name != 'postgresql':
        return
    schema = '"' + op.get_bind().execute(sa.text("SELECT current_schema()")).scalar().replace('"', '""') + '"'
    op.execute(_owned_function(schema))
    op.execute(_runs_function(schema))
    op.execute("CREATE TRIGGER aw_runs_writer BEFORE INSERT OR UPDATE ON runs "
               "FOR EACH ROW EXECUTE FUNCTION aw_runs_writer()")
    op.execute(_EVENTS_FUNCTION)
    op.execute("CREATE TRIGGER aw_events_writer BEFORE INSERT ON events "
               "FOR EACH ROW EXECUTE FUNCTION aw_events_writer()")
    op.execute(f"CREATE POLICY aw_runs_own ON runs USING ({_OWN_RUN}) WITH CHECK ({_OWN_RUN})")
    op.execute(f"CREATE POLICY aw_events_own ON events USING ({_OWN_EVENT}) WITH CHECK ({_OWN_EVENT})")
    op.execute("ALTER TABLE runs ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE events ENABLE ROW LEVEL SECURITY")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        # Every policy on the two tables goes, sql/postgres-roles.sql's too (they read the owner
        # column, or only mean something with row-level security on): the roles script of the
        # older revision grants what it did before.
        op.execute("""DO $$ DECLARE p record; BEGIN
  FOR p IN SELECT policyname, tablename FROM pg_policies
            WHERE schemaname = current_schema() AND tablename IN ('runs', 'events') LOOP
    EXECUTE format('DROP POLICY %I ON %I', p.policyname, p.tablename);
  END LOOP;
END $$""")
        op.execute("ALTER TABLE runs DISABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE events DISABLE ROW LEVEL SECURITY")
        op.execute("DROP TRIGGER IF EXISTS aw_events_writer ON events")
        op.execute("DROP FUNCTION IF EXISTS aw_events_writer()")
        op.execute("DROP TRIGGER IF EXISTS aw_runs_writer ON runs")
        op.execute("DROP FUNCTION IF EXISTS aw_runs_writer()")
        op.execute("DROP FUNCTION IF EXISTS aw_run_owned(text)")
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite' and bind.dialect.dbapi.sqlite_version_info >= (3, 35):
        op.execute("ALTER TABLE runs DROP COLUMN owner")  # in place, as 0009 does (a recreate would cascade)
        return
    with op.batch_alter_table('runs') as b:
        b.drop_column('owner')
