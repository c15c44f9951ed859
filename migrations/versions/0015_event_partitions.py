"""event partitions: on PostgreSQL `events` is partitioned by day, so retention drops whole days

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07

Issue 35: a store that takes ~60,000 events/s grows by ~5 billion rows a day; `db prune`
deleting them row by row cannot keep up, and never gives the disk back. On PostgreSQL `events`
becomes a declaratively partitioned table, one partition per UTC day (`events_pYYYYMMDD`) and a
default one (`events_default`) for a row no day partition covers (so an insert never fails for
want of a partition). Retention then detaches and drops a whole expired day
(watchdog.store.partitions); the daemon's leader makes the next days' partitions ahead.
SQLite keeps one table.

The partition key is a new column, `stored_at` (the server's `now()` at insert), not `at`:

* a row is routed to its partition *before* the BEFORE ROW triggers run, and PostgreSQL refuses
  a trigger that moves the row to another partition. 0010's trigger writes the server's time
  into `at` for every confined writer, so routing on `at` would refuse an honest writer whose
  clock is a little off around midnight (and a writer could aim its rows at any day);
* `stored_at` has no INSERT grant for any confined role (sql/postgres-roles.sql grants every
  column but `id` and `stored_at`): its DEFAULT is the only value a writer's row can get, so the
  row lands in today's partition, decided by the database.

What the table promised holds on partitions:

* (run_id, seq) is unique: a unique index of a partitioned table must contain the partition
  key, which would only make (run_id, seq, stored_at) unique. The trigger `events_seq_once`
  (SECURITY DEFINER: it reads every partition, whoever inserts) locks the run's row in `runs`
  (FOR NO KEY UPDATE, until the end of the transaction; never an advisory lock, whose keys any
  login can read in pg_locks and hold) and refuses a second row with the same key, with the
  unique_violation error and constraint name the old unique constraint raised, so every writer's
  "duplicate record" handling is unchanged;
* the primary key is (id, stored_at); ids still come only from the sequence (no role may insert
  `id`), so each id is unique and new ids are above old ones, as the fold needs;
* the triggers (0007's checks, 0010's server time, 0012's change feed), the row-level security
  policies (0010's and the roles script's) and the grants are moved from the old table to the
  new one by this migration: PostgreSQL clones row triggers onto every partition, and applies
  the parent's policies and grants to every statement through the parent. A partition itself
  has no grant for any role but its owner (whatever the owner's default privileges say) and
  row-level security with no policy: reading or writing one directly is refused.

Existing rows are copied with `stored_at = at`, into a partition per day they cover. The
downgrade copies them back into one table (and drops `stored_at`).
"""

from __future__ import annotations

import datetime as dt

from alembic import op
import sqlalchemy as sa

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

DAYS_AHEAD = 2  # day partitions made beyond today (the daemon's leader keeps making them)
OLD = "aw_events_unpartitioned"
PARTED = "aw_events_partitioned"
SEQ_ONCE = "events_seq_once"
# The witnesses' numbers (watchdog.store.joined.WITNESS_SEQ_BASE, sql/postgres-roles.sql): a gateway
# may append there to any run; below it only the run's own login may.
WITNESS_SEQ_BASE = 1 << 30


def _schema(bind) -> str:
    return '"' + bind.execute(sa.text("SELECT current_schema()")).scalar().replace('"', '""') + '"'


def _day_partition(day: dt.date) -> str:
    nxt = day + dt.timedelta(days=1)
    return (f"CREATE TABLE IF NOT EXISTS events_p{day:%Y%m%d} PARTITION OF events "
            f"FOR VALUES FROM ('{day.isoformat()} 00:00:00+00') TO ('{nxt.isoformat()} 00:00:00+00')")


def _seq_once(schema: str) -> str:
    return f"""CREATE FUNCTION {SEQ_ONCE}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  -- Below the witnesses' range only the run's own login (or the daemon) may write a run (the
  -- policies refuse anyone else, but only after this trigger): refused here first, so another
  -- login's probe learns nothing of which numbers a run it cannot see has used.
  IF NEW.seq < {WITNESS_SEQ_BASE} AND NOT has_table_privilege(session_user, TG_RELID, 'TRUNCATE')
     AND NOT EXISTS (SELECT 1 FROM {schema}.runs r WHERE r.id = NEW.run_id AND r.owner = session_user) THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = 'new row violates row-level security policy for table "events"';
  END IF;
  -- Two writers of the same run wait on each other here (for the rest of the first one's
  -- transaction); the second then sees the first's row. The run's own row is the lock, not an
  -- advisory key: a key is listed in pg_locks for every login to take and hold, a row lock only by
  -- a session that may update the row (row-level security hides another owner's run). Everyone
  -- takes it, the tables' owner too (its own ingest races like any writer). The SDK's insert
  -- updates that row in the same transaction anyway.
  PERFORM 1 FROM {schema}.runs r WHERE r.id = NEW.run_id FOR NO KEY UPDATE;
  IF EXISTS (SELECT 1 FROM {schema}.events e WHERE e.run_id = NEW.run_id AND e.seq = NEW.seq) THEN
    RAISE EXCEPTION USING ERRCODE = 'unique_violation', CONSTRAINT = 'uq_events_run_id_seq',
      MESSAGE = 'duplicate key value violates unique constraint "uq_events_run_id_seq"',
      DETAIL = format('Key (run_id, seq)=(%s, %s) already exists.', NEW.run_id, NEW.seq);
  END IF;
  RETURN NEW;
END
$$"""


def _lock_down(bind, name: str) -> None:
    """A partition is read and written only through `events` (whose policies and grants apply to
    every statement through it): no grant of its own (default privileges of the owner's would give
    one) and row-level security with no policy, so nobody but the owner reaches it directly."""
    op.execute(f"REVOKE ALL ON {name} FROM PUBLIC")
    for (grantee,) in bind.execute(sa.text(
            "SELECT DISTINCT quote_ident(a.grantee::regrole::text) FROM pg_class c, aclexplode(c.relacl) a "
            "WHERE c.oid = to_regclass(:t) AND a.grantee <> 0 AND a.grantee <> c.relowner"), {"t": name}).all():
        op.execute(f"REVOKE ALL ON {name} FROM {grantee}")
    op.execute(f"ALTER TABLE {name} ENABLE ROW LEVEL SECURITY")


def _move_dressing(bind, src: str, dst: str, skip_triggers: tuple[str, ...] = ()) -> None:
    """The triggers, policies, grants and row-level security of table `src`, made again on `dst`
    (whatever earlier revisions and the roles script put there)."""
    for name, definition in bind.execute(sa.text(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = to_regclass(:t) "
            "AND NOT tgisinternal ORDER BY tgname"), {"t": src}).all():
        if name in skip_triggers:
            continue
        head, _, tail = definition.partition(" ON ")
        _, _, rest = tail.partition(" ")  # the table's (schema-qualified) name
        op.execute(f"{head} ON {dst} {rest}")
    for name, cmd, permissive, roles, qual, check in bind.execute(sa.text(
            "SELECT polname, polcmd, polpermissive, "
            "ARRAY(SELECT CASE WHEN r = 0 THEN 'public' ELSE quote_ident(r::regrole::text) END FROM unnest(polroles) r), "
            "pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid) "
            "FROM pg_policy WHERE polrelid = to_regclass(:t) ORDER BY polname"), {"t": src}).all():
        verb = {"r": "SELECT", "a": "INSERT", "w": "UPDATE", "d": "DELETE", "*": "ALL"}[cmd]
        # 0010's policy names its table (bound by oid, so now the old one's name): the new one.
        qual, check = ((x.replace(f"'{src}'::regclass", f"'{dst}'::regclass") if x else x) for x in (qual, check))
        op.execute(f'CREATE POLICY "{name}" ON {dst} AS {"PERMISSIVE" if permissive else "RESTRICTIVE"} '
                   f'FOR {verb} TO {", ".join(roles)}' + (f" USING ({qual})" if qual else "")
                   + (f" WITH CHECK ({check})" if check else ""))
    if bind.execute(sa.text("SELECT relrowsecurity FROM pg_class WHERE oid = to_regclass(:t)"), {"t": src}).scalar():
        op.execute(f"ALTER TABLE {dst} ENABLE ROW LEVEL SECURITY")
    owner = "SELECT relowner FROM pg_class WHERE oid = to_regclass(:t)"
    for grantee, privilege in bind.execute(sa.text(
            f"SELECT a.grantee::regrole::text, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a "
            f"WHERE c.oid = to_regclass(:t) AND a.grantee <> 0 AND a.grantee <> ({owner})"), {"t": src}).all():
        op.execute(f"GRANT {privilege} ON {dst} TO {grantee}")
    for column, grantee, privilege in bind.execute(sa.text(
            f"SELECT at.attname, a.grantee::regrole::text, a.privilege_type FROM pg_attribute at, aclexplode(at.attacl) a "
            f"WHERE at.attrelid = to_regclass(:t) AND NOT at.attisdropped AND a.grantee <> 0 "
            f"AND a.grantee <> ({owner}) AND at.attname IN (SELECT attname FROM pg_attribute "
            f"WHERE attrelid = to_regclass(:d) AND NOT attisdropped)"), {"t": src, "d": dst}).all():
        op.execute(f'GRANT {privilege} ("{column}") ON {dst} TO {grantee}')


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    schema = _schema(bind)
    op.execute(f"ALTER TABLE events RENAME TO {OLD}")
    for name in ("pk_events", "uq_events_run_id_seq", "fk_events_run_id_runs"):
        op.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT {name} TO {name}_old")
    op.execute("ALTER INDEX ix_events_tool_at RENAME TO ix_events_tool_at_old")
    op.execute(f"CREATE TABLE events (LIKE {OLD} INCLUDING DEFAULTS, "
               f"stored_at timestamptz NOT NULL DEFAULT now()) PARTITION BY RANGE (stored_at)")
    op.execute("CREATE TABLE events_default PARTITION OF events DEFAULT")
    today = bind.execute(sa.text("SELECT (now() AT TIME ZONE 'UTC')::date")).scalar()
    days = set(bind.execute(sa.text(f"SELECT DISTINCT (at AT TIME ZONE 'UTC')::date FROM {OLD}")).scalars())
    days |= {today + dt.timedelta(days=n) for n in range(DAYS_AHEAD + 1)}
    for day in sorted(days):
        op.execute(_day_partition(day))
    for name in ["events_default", *(f"events_p{day:%Y%m%d}" for day in sorted(days))]:
        _lock_down(bind, name)
    columns = ", ".join(f'"{c}"' for c in bind.execute(sa.text(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum"), {"t": OLD}).scalars())
    op.execute(f"INSERT INTO events ({columns}, stored_at) SELECT {columns}, at FROM {OLD}")
    op.execute("ALTER TABLE events ADD CONSTRAINT pk_events PRIMARY KEY (id, stored_at)")
    op.execute("ALTER TABLE events ADD CONSTRAINT fk_events_run_id_runs FOREIGN KEY (run_id) "
               "REFERENCES runs (id) ON DELETE CASCADE")
    # (run_id, seq): what the unique constraint's index served (a run's events, the gateways' next seq).
    op.execute("CREATE INDEX ix_events_run_id_seq ON events (run_id, seq)")
    op.execute("CREATE INDEX ix_events_tool_at ON events (tool, at)")
    op.execute("ALTER SEQUENCE events_id_seq OWNED BY events.id")
    _move_dressing(bind, OLD, "events")
    op.execute(_seq_once(schema))
    op.execute(f"REVOKE ALL ON FUNCTION {SEQ_ONCE}() FROM PUBLIC")
    op.execute(f"CREATE TRIGGER {SEQ_ONCE} BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION {SEQ_ONCE}()")
    op.execute(f"DROP TABLE {OLD}")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != 'postgresql':
        return
    op.execute(f"ALTER TABLE events RENAME TO {PARTED}")
    for name in ("pk_events", "fk_events_run_id_runs"):
        op.execute(f"ALTER TABLE {PARTED} RENAME CONSTRAINT {name} TO {name}_old")
    op.execute("ALTER INDEX ix_events_tool_at RENAME TO ix_events_tool_at_old")
    op.execute(f"CREATE TABLE events (LIKE {PARTED} INCLUDING DEFAULTS)")
    op.execute("ALTER TABLE events DROP COLUMN stored_at")
    columns = ", ".join(f'"{c}"' for c in bind.execute(sa.text(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'events'::regclass AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum")).scalars())
    op.execute(f"INSERT INTO events ({columns}) SELECT {columns} FROM {PARTED} ORDER BY id")
    op.execute("ALTER TABLE events ADD CONSTRAINT pk_events PRIMARY KEY (id)")
    op.execute("ALTER TABLE events ADD CONSTRAINT uq_events_run_id_seq UNIQUE (run_id, seq)")
    op.execute("ALTER TABLE events ADD CONSTRAINT fk_events_run_id_runs FOREIGN KEY (run_id) "
               "REFERENCES runs (id) ON DELETE CASCADE")
    op.execute("CREATE INDEX ix_events_tool_at ON events (tool, at)")
    op.execute("ALTER SEQUENCE events_id_seq OWNED BY events.id")
    _move_dressing(bind, PARTED, "events", skip_triggers=(SEQ_ONCE,))
    op.execute(f"DROP TABLE {PARTED}")  # and its partitions
    op.execute(f"DROP FUNCTION IF EXISTS {SEQ_ONCE}()")
