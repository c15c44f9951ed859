"""statement triggers: a burst of events pays its seq-once check and its change feed once

Revision ID: 0017
Revises: 0016
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
server's time, 0007's checks), and so does row-level security, whose test of an event's run
becomes a subquery instead of a plpgsql call (the same test). `aw_burst(events, runs)` is the
SDK's burst as one call with the invoker's rights (see _burst). SQLite is unchanged.
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

SEQ_ONCE = "events_seq_once"
SEQ_ONCE_ROWS = "events_seq_once_rows"  # the function of this revision (0015's keeps its name)
CHANGE = "zz_aw_change_events"
CHANGE_ROWS = "aw_change_events_rows"
NEW_ROWS = "aw_new_events"
BURST = "aw_burst"

# A burst's JSON (watchdog.store.bursts): each event an array of these columns, in this order, and
# each run's update an array of its counters (summed over its records), seq, time, progress, id.
EVENT_COLUMNS = (
    ("run_id", "text"), ("seq", "int"), ("at", "timestamptz"), ("kind", "text"), ("tool", "text"),
    ("args_hash", "text"), ("args", "json"), ("ok", "boolean"), ("error_class", "text"), ("error_msg", "text"),
    ("duration_s", "float8"), ("model", "text"), ("tokens_in", "bigint"), ("tokens_out", "bigint"),
    ("cost_eur", "float8"), ("progress", "text"), ("attempt", "bigint"), ("cached_tokens_in", "bigint"),
    ("reasoning_tokens", "bigint"), ("mac", "text"),
)  # fmt: skip
UPDATE_FIELDS = (
    ("steps", "bigint"), ("calls", "bigint"), ("errors", "bigint"), ("t_in", "bigint"), ("t_out", "bigint"),
    ("cost", "float8"), ("cached", "bigint"), ("reasoning", "bigint"), ("unpriced", "bigint"), ("seq", "bigint"),
    ("at", "timestamptz"), ("progress", "text"), ("id", "text"),
)  # fmt: skip

# Row-level security's test of an event's run, as a subquery instead of 0010's plpgsql function
# aw_run_owned (the same test: the run's owner is the login; `runs` bound by oid when the policy
# is made, and read under its own policies, as the function read it): a plpgsql call per row was
# ~10 % of a burst's server time (perf).
_OWN_FN = "has_table_privilege(session_user, 'events'::regclass, 'TRUNCATE') OR aw_run_owned(run_id)"
_OWN_SUBQUERY = ("has_table_privilege(session_user, 'events'::regclass, 'TRUNCATE') OR EXISTS "
                 "(SELECT 1 FROM runs r WHERE r.id = run_id AND r.owner = session_user)")


def _fields(fields, source: str = "r") -> list[str]:
    out = []
    for i, (_name, sql_type) in enumerate(fields):
        v = f"({source}->>{i})" + ("" if sql_type == "text" else f"::{sql_type}")
        out.append(f"COALESCE({v}, now())" if sql_type == "timestamptz" else v)
    return out


def _burst(schema: str) -> str:
    """The SDK's burst as one call (watchdog.store.bursts): the same two writes the client would
    send as one statement, with the invoker's rights (row-level security, every trigger, every
    check as for any INSERT and UPDATE of the login), but parsed and planned once per session
    (plpgsql keeps its plans): a burst's text was ~15 % of its server time. The runs' counters
    first, their rows locked in id order (two bursts sharing runs never wait on each other in a
    cycle) and their statuses read under that lock; then the events, whose statement triggers
    find the rows locked and renumbered by this transaction already."""
    ev_cols = ", ".join(c for c, _ in EVENT_COLUMNS)
    up = ", ".join(f"{v} AS {n}" for v, (n, _t) in zip(_fields(UPDATE_FIELDS), UPDATE_FIELDS))
    return f"""CREATE FUNCTION {BURST}(evs jsonb, ups jsonb)
RETURNS TABLE (out_id text, out_status text, out_reason text, out_detail text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY WITH u AS (SELECT {up} FROM jsonb_array_elements(ups) AS x(r)),
    lk AS MATERIALIZED (SELECT k.id FROM {schema}.runs k WHERE k.id = ANY (ARRAY(SELECT u.id FROM u)) ORDER BY k.id
                        FOR NO KEY UPDATE)
  UPDATE {schema}.runs SET steps = runs.steps + u.steps, tool_calls = runs.tool_calls + u.calls,
    tool_errors = runs.tool_errors + u.errors, tokens_in = runs.tokens_in + u.t_in,
    tokens_out = runs.tokens_out + u.t_out, cost_eur = runs.cost_eur + u.cost,
    cached_tokens_in = runs.cached_tokens_in + u.cached, reasoning_tokens = runs.reasoning_tokens + u.reasoning,
    cost_unpriced_tokens = runs.cost_unpriced_tokens + u.unpriced, last_seq = GREATEST(runs.last_seq, u.seq),
    last_seen_at = GREATEST(runs.last_seen_at, u.at), progress = COALESCE(u.progress, runs.progress)
  FROM u JOIN lk ON lk.id = u.id WHERE runs.id = ANY (ARRAY(SELECT lk.id FROM lk)) AND runs.id = u.id
  RETURNING runs.id::text, runs.status::text, runs.stop_reason::text, runs.stop_detail::text;
  INSERT INTO {schema}.events ({ev_cols}) SELECT {", ".join(_fields(EVENT_COLUMNS))}
    FROM jsonb_array_elements(evs) WITH ORDINALITY AS e(r, n) ORDER BY e.n;
END
$$"""


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
    op.execute(f"ALTER POLICY aw_events_own ON events USING ({_OWN_SUBQUERY}) WITH CHECK ({_OWN_SUBQUERY})")
    op.execute(_burst(schema))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    op.execute(f"DROP FUNCTION {BURST}(jsonb, jsonb)")
    op.execute(f"ALTER POLICY aw_events_own ON events USING ({_OWN_FN}) WITH CHECK ({_OWN_FN})")
    op.execute(f"DROP TRIGGER {CHANGE} ON events")
    op.execute(f"DROP FUNCTION {CHANGE_ROWS}()")
    op.execute(f"CREATE CONSTRAINT TRIGGER {CHANGE} AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED "
               "FOR EACH ROW EXECUTE FUNCTION aw_change_events()")
    op.execute(f"DROP TRIGGER {SEQ_ONCE} ON events")
    op.execute(f"DROP FUNCTION {SEQ_ONCE_ROWS}()")
    op.execute(f"CREATE TRIGGER {SEQ_ONCE} BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION {SEQ_ONCE}()")
