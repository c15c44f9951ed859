"""Helpers shared by the framework integration tests: reading the store, and the real daemon.

The daemon is the real `agent-watchdog run` in a subprocess on the test's SQLite
store, ticking every 0.2 s, with a tool-call budget of 6 that the runaway runs
exceed. Steps and identical calls get budgets far above what a runaway reaches
before a tick, so max_tool_calls is the one budget the daemon can find breached.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from sqlalchemy import select

from watchdog.store.engine import make_engine
from watchdog.store.schema import daemons, events, runs, settings

DAEMON_DEFAULTS = """\
[defaults]
max_tool_calls = 6
max_steps = 1000
max_identical_calls = 1000
"""
DAEMON_READY_S = 30.0


def daemon_config() -> str:
    """The daemon's TOML: this user allowed, its own key and socket, a fast tick, small budgets."""
    from daemon_support import daemon_toml

    return daemon_toml(tick_s=0.2, cancel_grace_s=5) + "\n" + DAEMON_DEFAULTS


def run_row(url: str, run_id: str) -> dict:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).mappings().one()
            return dict(row)
    finally:
        engine.dispose()


def event_rows(url: str, run_id: str) -> list[dict]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.seq)).mappings()
            return [dict(r) for r in rows]
    finally:
        engine.dispose()


def run_ids(url: str) -> list[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return [r[0] for r in conn.execute(select(runs.c.id).order_by(runs.c.started_at))]
    finally:
        engine.dispose()


def daemon_command() -> list[str]:
    script = Path(sys.executable).with_name("agent-watchdog")
    if script.exists():
        return [str(script)]
    found = shutil.which("agent-watchdog")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from watchdog.cli import main; sys.exit(main())"]


def daemon_ticking(url: str) -> bool:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            lease = conn.execute(select(daemons.c.pid)).first()
            published = conn.execute(select(settings.c.key)).first()
            return lease is not None or published is not None
    finally:
        engine.dispose()
