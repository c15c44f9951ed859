"""hook source: runs a coding CLI's hooks witness (`agent-watchdog hook`, runs.source = 'hook')

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07

`agent-watchdog hook claude-code|codex|gemini` records each session of a coding CLI as one
run with `source = 'hook'`. The runs check (0007's builder, as 0009 rebuilt it) gets the new
source; the downgrade ends as 0009's list (hook runs become plain-SQL ones, `sql`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

# tests/system/test_failsafe.py checks this list against watchdog.core.lifecycle.
SOURCES = ("sdk", "exec", "otlp", "litellm", "mcp", "hook", "sql")


def _m9():
    path = Path(__file__).with_name("0009_witnesses.py")
    spec = importlib.util.spec_from_file_location("_aw_witnesses_0009", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def upgrade() -> None:
    m9 = _m9()
    m9._rebuild_runs_checks(m9._checks_0007(m9.KILL_MODES, SOURCES))


def downgrade() -> None:
    m9 = _m9()
    op.execute("UPDATE runs SET source = 'sql' WHERE source = 'hook'")
    m9._rebuild_runs_checks(m9._checks_0007(m9.KILL_MODES, m9.SOURCES))
