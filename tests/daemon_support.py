"""Shared helpers for the daemon and ladder tests: configs with tiny graces and
read-only views of what the daemon wrote."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from watchdog.core.config import parse
from watchdog.store.schema import alerts, interventions, runs

CANCEL_GRACE_S = 0.5
TERM_GRACE_S = 0.5


def config(**sections):
    """A Config from a TOML-like dict, with tiny graces unless told otherwise."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in sections.items()}
    daemon = raw.setdefault("daemon", {})
    daemon.setdefault("cancel_grace_s", CANCEL_GRACE_S)
    daemon.setdefault("term_grace_s", TERM_GRACE_S)
    # The model the test runs record: priced (at nothing), so that the daemon's "model has no
    # price" alert does not join the alerts a test counts. tests/test_money.py tests that alert.
    raw.setdefault("prices", {"gpt-x": {"input_eur_per_mtok": 0.0, "output_eur_per_mtok": 0.0}})
    return parse(raw)


def later(t: dt.datetime, seconds: float) -> dt.datetime:
    return t + dt.timedelta(seconds=seconds)


def run_row(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def actions(engine, run_id) -> list[str]:
    with engine.connect() as conn:
        return [r.action for r in conn.execute(
            select(interventions.c.action).where(interventions.c.run_id == run_id).order_by(interventions.c.id))]


def interventions_of(engine, run_id) -> list:
    with engine.connect() as conn:
        return conn.execute(
            select(interventions).where(interventions.c.run_id == run_id).order_by(interventions.c.id)).all()


def alerts_of(engine, run_id=None) -> list:
    q = select(alerts).order_by(alerts.c.id)
    if run_id is not None:
        q = q.where(alerts.c.run_id == run_id)
    with engine.connect() as conn:
        return conn.execute(q).all()
