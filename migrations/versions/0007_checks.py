"""checks: the table contract enforced by the database (counters, statuses, timestamps, lengths)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

The table contract is public: clients in other languages write rows with plain SQL.
A malformed row (text in a counter, a NaN cost, an unknown status, a timestamp that does
not parse) is refused at the door with a message naming the check, instead of reaching
the daemon. The daemon still survives rows written before this revision or by hand with
the checks off (it quarantines them, see watchdog/daemon/trust/quarantine.py).

Both databases check with BEFORE INSERT / UPDATE triggers (a plpgsql function on
PostgreSQL), each check on an UPDATE only when the update changes one of its columns:
a CHECK constraint would re-check the whole row on every update, so a malformed row
from before could never be stopped, ended or booked. (On SQLite, ALTER TABLE cannot add
a CHECK anyway, and recreating `runs` would cascade a delete into its events.) The
SQLite triggers honour `PRAGMA ignore_check_constraints`; on PostgreSQL the checks are
off for a session with `SET session_replication_role = replica` (superuser), as every
trigger is. Existing rows are never re-checked.
"""

from alembic import op

# Self-contained: a migration never imports the application. tests/store/test_migrations.py
# checks these lists against watchdog.core.lifecycle and the budget registry: a new status
# or budget needs a new revision, never an edit of this one.
STATUSES = ("running", "paused", "stopping", "completed", "failed", "killed", "lost")
KILL_MODES = ("cooperative", "process", "tree")
EVENT_KINDS = ("step", "tool", "heartbeat")
STAGES = ("term", "kill", "refused", "not_signalled", "failed", "done")  # the stop ladder's
ISO_GLOB = "[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9][ T][0-2][0-9]:[0-5][0-9]:[0-6][0-9]*"
LABELS_MAX_CHARS = 4096
RUN_COUNTERS = ("steps", "tool_calls", "tool_errors", "tokens_in", "tokens_out", "cached_tokens_in",
                "reasoning_tokens", "cost_unpriced_tokens", "last_seq", "resumes")
RUN_BUDGETS_INT = ("max_steps", "max_tool_calls", "max_tokens", "max_identical_calls")
RUN_BUDGETS_FLOAT = ("max_cost_eur", "max_wall_s", "heartbeat_timeout_s")
RUN_TIMES = ("started_at", "last_seen_at")
RUN_TIMES_NULLABLE = ("stop_requested_at", "signalled_at", "ended_at", "paused_at")
EVENT_TEXTS = ("tool", "args_hash", "error_class", "error_msg", "model", "progress")
EVENT_COUNTERS = ("tokens_in", "tokens_out", "cached_tokens_in", "reasoning_tokens", "attempt")
AGENT_MAX_CHARS = 128
MAX_AMOUNT = 1e15  # euros or seconds: also what keeps NaN and infinity out (NaN > any number on PostgreSQL)

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def _in(col, values) -> str:
    return f"{col} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def _checks(dialect: str) -> dict[str, list[tuple[str, str, str]]]:
    """table -> [(name, condition on the row (columns bare), what it means)]. One condition per
    column wherever possible: an UPDATE is checked only in the columns it changes, so a bad
    value in one column never refuses an update of another (the daemon can still stop, end,
    book or rebase an old malformed row)."""
    sqlite = dialect == "sqlite"

    def integer(col, nullable=False):
        cond = f"typeof({col}) = 'integer' AND {col} >= 0" if sqlite else f"{col} >= 0"
        return f"({col} IS NULL OR ({cond}))" if nullable else cond

    def amount(col, nullable=False):
        cond = (f"typeof({col}) IN ('integer', 'real') AND {col} >= 0 AND {col} < {MAX_AMOUNT:.0f}" if sqlite
                else f"{col} >= 0 AND {col} < {MAX_AMOUNT:.0f}")
        return f"({col} IS NULL OR ({cond}))" if nullable else cond

    def when(col, nullable=False):
        # SQLite: the contract's text (julianday alone accepts 'now', which never grows old).
        cond = (f"(typeof({col}) = 'text' AND {col} GLOB '{ISO_GLOB}' AND julianday({col}) IS NOT NULL)" if sqlite
                else f"({col} BETWEEN '1970-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00')")
        return f"({col} IS NULL OR {cond})" if nullable else cond

    runs = [
        ("ck_runs_status", _in("status", STATUSES), "status must be one of " + ", ".join(STATUSES)),
        ("ck_runs_kill_mode", _in("kill_mode", KILL_MODES), "kill_mode must be one of " + ", ".join(KILL_MODES)),
        ("ck_runs_agent", f"length(agent) BETWEEN 1 AND {AGENT_MAX_CHARS}",
         f"agent must be 1 to {AGENT_MAX_CHARS} characters"),
        *(("ck_runs_counters", integer(c), f"{c}: counters must be non-negative integers") for c in RUN_COUNTERS),
        ("ck_runs_cost", amount("cost_eur"), "cost_eur must be a finite non-negative number"),
        *(("ck_runs_budgets", integer(c, True), f"{c}: budgets must be NULL or non-negative finite numbers")
          for c in RUN_BUDGETS_INT),
        *(("ck_runs_budgets", amount(c, True), f"{c}: budgets must be NULL or non-negative finite numbers")
          for c in RUN_BUDGETS_FLOAT),
        *(("ck_runs_times", when(c), f"{c}: timestamps must be valid and finite") for c in RUN_TIMES),
        *(("ck_runs_times", when(c, True), f"{c}: timestamps must be valid and finite") for c in RUN_TIMES_NULLABLE),
        ("ck_runs_pid", integer("pid", True), "pid must be NULL or a non-negative integer"),
        ("ck_runs_signal_stage", f"(signal_stage IS NULL OR {_in('signal_stage', STAGES)})",
         "signal_stage must be NULL or one of " + ", ".join(STAGES)),
    ]
    if sqlite:  # PostgreSQL's json type already refuses text that is not JSON
        runs.append(("ck_runs_labels", f"(labels IS NULL OR (json_valid(labels) AND length(labels) <= {LABELS_MAX_CHARS}))",
                     f"labels must be JSON of at most {LABELS_MAX_CHARS} characters"))
    else:
        runs.append(("ck_runs_labels", f"(labels IS NULL OR length(labels::text) <= {LABELS_MAX_CHARS})",
                     f"labels must be at most {LABELS_MAX_CHARS} characters of JSON"))
    events = [
        ("ck_events_kind", _in("kind", EVENT_KINDS), "kind must be one of " + ", ".join(EVENT_KINDS)),
        ("ck_events_tool", "(kind <> 'tool' OR (tool IS NOT NULL AND length(tool) > 0))",
         "a tool event must name its tool"),
        ("ck_events_at", when("at"), "at must be a valid, finite timestamp"),
        ("ck_events_counters", integer("seq"), "seq: must be a non-negative integer"),
        *(("ck_events_counters", integer(c, True), f"{c}: token counts must be non-negative integers")
          for c in EVENT_COUNTERS),
        *(("ck_events_amounts", amount(c, True), f"{c}: must be NULL or a finite non-negative number")
          for c in ("cost_eur", "duration_s")),
    ]
    if sqlite:  # PostgreSQL's column types already say it
        events.extend(("ck_events_text", f"typeof({c}) IN ('text', 'null')", f"{c}: must be text")
                      for c in EVENT_TEXTS)
    return {"runs": runs, "events": events}


_COLUMNS = {
    "runs": ("status", "kill_mode", "agent", "labels", "pid", "signal_stage", *RUN_COUNTERS, "cost_eur", *RUN_BUDGETS_INT,
             *RUN_BUDGETS_FLOAT, *RUN_TIMES, *RUN_TIMES_NULLABLE),
    "events": ("kind", "at", "seq", *EVENT_TEXTS, *EVENT_COUNTERS, "cost_eur", "duration_s"),
}


def _pattern(table: str):
    import re

    names = sorted(_COLUMNS[table], key=len, reverse=True)
    return re.compile(r"(?<![\w.'])(" + "|".join(names) + r")(?![\w'(])")


def _on_new(cond: str, table: str) -> str:
    """The condition on NEW.column: every column of the table named bare is prefixed."""
    return _pattern(table).sub(r"NEW.\1", cond)


def _changed(cond: str, table: str, dialect: str) -> str:
    """An UPDATE changed one of the columns the condition reads: only then is it checked, so a
    row written before this revision (or by hand with the checks off) can still be updated in
    its other columns (the daemon books, stops or ends it) without being fixed first."""
    cols = sorted(set(_pattern(table).findall(cond)))
    op = "IS NOT" if dialect == "sqlite" else "IS DISTINCT FROM"
    cast = {"labels": "::text"} if dialect != "sqlite" else {}  # PostgreSQL's json has no equality
    return "(" + " OR ".join(f"NEW.{c}{cast.get(c, '')} {op} OLD.{c}{cast.get(c, '')}" for c in cols) + ")"


def _message(name: str, what: str) -> str:
    return f"CHECK constraint failed: {name} ({what})"


def _sqlite_trigger(table: str, op_name: str, checks) -> str:
    guards, lines = [], []
    for name, cond, what in checks:
        guard = f"NOT coalesce({_on_new(cond, table)}, 0)"
        if op_name == "update":
            guard = f"({_changed(cond, table, 'sqlite')} AND {guard})"
        guards.append(guard)
        lines.append(f"    SELECT RAISE(ABORT, '{_message(name, what)}') WHERE {guard};")
    body = "\n".join(lines)
    # The WHEN clause is one expression, evaluated once per row: the body (a statement per
    # check, to name the one that failed) runs only for a row that fails one, never on the
    # agents' hot path. Honours PRAGMA ignore_check_constraints, as a CHECK constraint would.
    return (f"CREATE TRIGGER ck_{table}_{op_name} BEFORE {op_name.upper()} ON {table} FOR EACH ROW\n"
            f"WHEN ({' OR '.join(guards)})\n"
            f"  AND NOT (SELECT ignore_check_constraints FROM pragma_ignore_check_constraints)\n"
            f"BEGIN\n{body}\nEND")


def _pg_function(table: str, checks) -> str:
    lines = []
    for name, cond, what in checks:
        lines.append(f"  IF (TG_OP = 'INSERT' OR {_changed(cond, table, 'postgresql')}) "
                     f"AND NOT coalesce({_on_new(cond, table)}, false) THEN\n"
                     f"    RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = '{_message(name, what)}';\n"
                     f"  END IF;")
    body = "\n".join(lines)
    return (f"CREATE FUNCTION ck_{table}() RETURNS trigger LANGUAGE plpgsql AS $$\nBEGIN\n{body}\n"
            f"  RETURN NEW;\nEND\n$$")


def upgrade() -> None:
    bind = op.get_bind()
    dialect = bind.dialect.name
    for table, checks in _checks(dialect).items():
        if dialect == "sqlite":
            for op_name in ("insert", "update"):
                op.execute(_sqlite_trigger(table, op_name, checks))
        else:
            # A trigger rather than CHECK constraints: a CHECK re-checks the whole row on every
            # UPDATE, so one malformed row from before could never be stopped, ended or booked.
            op.execute(_pg_function(table, checks))
            op.execute(f"CREATE TRIGGER ck_{table} BEFORE INSERT OR UPDATE ON {table} "
                       f"FOR EACH ROW EXECUTE FUNCTION ck_{table}()")


def downgrade() -> None:
    bind = op.get_bind()
    dialect = bind.dialect.name
    for table in _checks(dialect):
        if dialect == "sqlite":
            for op_name in ("insert", "update"):
                op.execute(f"DROP TRIGGER IF EXISTS ck_{table}_{op_name}")
        else:
            op.execute(f"DROP TRIGGER IF EXISTS ck_{table} ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS ck_{table}()")
