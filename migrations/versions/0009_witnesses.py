"""witnesses: who saw a run (runs.source), who saw a call (events.source, events.call_id), exec's cgroup

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

A run is no longer only what the Python SDK reports: `agent-watchdog exec`, OTLP spans,
the LiteLLM callback and the MCP proxy are witnesses too. `runs.source` says which one
created the run (`sql` for a plain-SQL writer that does not say: the server default);
`events.source` which witness saw an event, and `events.call_id` the id the witnesses
share for one call (OTel tool call id, MCP request id), so a call several witnesses saw
counts once. `events.mac` authenticates a record as written by the run's attested process
(a MAC with the per-run key handed out at attestation; the format is in the table contract).
`attestations.cgroup` is the cgroup exec made for the run: the daemon's own
record (written with the attestation), never a row a writer could point elsewhere.

The runs check triggers of 0007 are rebuilt with the new kill mode `cgroup` and a check
on `source`; their builder is 0007's own (loaded from its file), with the new lists.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op
import sqlalchemy as sa

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

# tests/system/test_failsafe.py checks these lists against watchdog.core.lifecycle.
KILL_MODES = ("cooperative", "process", "tree", "cgroup")
SOURCES = ("sdk", "exec", "otlp", "litellm", "mcp", "sql")


def _checks_0007(kill_modes, sources):
    path = Path(__file__).with_name("0007_checks.py")
    spec = importlib.util.spec_from_file_location("_aw_checks_0007", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    m.KILL_MODES = kill_modes
    if sources:
        m._COLUMNS = {**m._COLUMNS, "runs": (*m._COLUMNS["runs"], "source")}
        base = m._checks

        def checks(dialect):
            out = base(dialect)
            out["runs"] = [*out["runs"], ("ck_runs_source", m._in("source", sources),
                                          "source must be one of " + ", ".join(sources))]
            return out

        m._checks = checks
    return m


def _rebuild_runs_checks(m) -> None:
    bind = op.get_bind()
    dialect = bind.dialect.name
    checks = m._checks(dialect)["runs"]
    if dialect == "sqlite":
        for op_name in ("insert", "update"):
            op.execute(f"DROP TRIGGER IF EXISTS ck_runs_{op_name}")
            op.execute(m._sqlite_trigger("runs", op_name, checks))
    else:
        op.execute("DROP TRIGGER IF EXISTS ck_runs ON runs")
        op.execute("DROP FUNCTION IF EXISTS ck_runs()")
        op.execute(m._pg_function("runs", checks))
        op.execute("CREATE TRIGGER ck_runs BEFORE INSERT OR UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION ck_runs()")


def upgrade() -> None:
    op.add_column('runs', sa.Column('source', sa.String(length=16), nullable=False, server_default='sql'))
    op.add_column('events', sa.Column('source', sa.String(length=16), nullable=True))
    op.add_column('events', sa.Column('call_id', sa.String(length=128), nullable=True))
    op.add_column('events', sa.Column('mac', sa.String(length=64), nullable=True))
    op.add_column('attestations', sa.Column('cgroup', sa.Text(), nullable=True))
    _rebuild_runs_checks(_checks_0007(KILL_MODES, SOURCES))


def downgrade() -> None:
    # A run stopped through its cgroup is, for the older daemon, a tree run.
    op.execute("UPDATE runs SET kill_mode = 'tree' WHERE kill_mode = 'cgroup'")
    _rebuild_runs_checks(_checks_0007(KILL_MODES[:3], None))
    bind = op.get_bind()
    drops = (('attestations', 'cgroup'), ('events', 'mac'), ('events', 'call_id'), ('events', 'source'), ('runs', 'source'))
    if bind.dialect.name == 'sqlite' and bind.dialect.dbapi.sqlite_version_info >= (3, 35):
        for table, col in drops:  # in place, as 0006 does: no table recreate (it would cascade)
            op.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
        return
    for table, col in drops:
        with op.batch_alter_table(table) as b:
            b.drop_column(col)
