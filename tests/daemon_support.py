"""Shared helpers for the daemon and ladder tests: configs with tiny graces and
read-only views of what the daemon wrote."""

from __future__ import annotations

import datetime as dt
import os
import pwd

from sqlalchemy import select

from attest_support import short_dir
from watchdog.core.config import parse
from watchdog.core.seal import Sealer
from watchdog.daemon.stops.killer import Killer
from watchdog.store.schema import alerts, interventions, runs

CANCEL_GRACE_S = 0.5
TERM_GRACE_S = 0.5
# The test process's user, named explicitly: root (CI) is never a default of allowed_users.
ME = pwd.getpwuid(os.geteuid()).pw_name
# A sealing key for tests that drive a Ticker and the outbox without attested processes.
SEALER = Sealer(os.urandom(32), Killer().host)


def config(**sections):
    """A Config from a TOML-like dict, with tiny graces unless told otherwise, this user as
    the allowed one, and the daemon's key and socket in a fresh short directory."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in sections.items()}
    daemon = raw.setdefault("daemon", {})
    daemon.setdefault("cancel_grace_s", CANCEL_GRACE_S)
    daemon.setdefault("term_grace_s", TERM_GRACE_S)
    daemon.setdefault("allowed_users", [ME])
    if "key_file" not in daemon or "socket" not in daemon:
        folder = short_dir()
        daemon.setdefault("key_file", str(folder / "attest.key"))
        daemon.setdefault("socket", str(folder / "attest.sock"))
    # The daemon's own files (lease lock, state file) next to its key: never the system's.
    daemon.setdefault("state_dir", os.path.dirname(daemon["key_file"]))
    # The model the test runs record: priced (at nothing), so that the daemon's "model has no
    # price" alert does not join the alerts a test counts. tests/system/test_money.py tests that alert.
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


def daemon_toml(**keys) -> str:
    """A [daemon] table for a config file: this user allowed, key and socket in a fresh short directory."""
    import json

    folder = short_dir()
    values = {"allowed_users": [ME], "key_file": str(folder / "attest.key"), "socket": str(folder / "attest.sock"),
              "state_dir": str(folder), **keys}
    return "[daemon]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def ticker(engine, cfg=None, killer=None):
    """A Ticker on the test's store with the test sealer, allowed to signal this user's processes."""
    from watchdog.daemon.tick.ticker import Ticker

    return Ticker(engine, cfg or config(), killer or Killer(allowed_users=[ME]), sealer=SEALER)


def wait_ticks(engine, n: int = 2, timeout_s: float = 30.0) -> None:
    """Until a daemon on the store has ended `n` more ticks (its lease row's last_tick_at moved
    on `n` times): what it could have done meanwhile, it has done. The positive event a test
    waits for before it asserts that something did not happen (never a sleep)."""
    import time

    from sqlalchemy import func

    from watchdog.store.schema import daemons

    def newest():
        with engine.connect() as conn:
            return conn.execute(select(func.max(daemons.c.last_tick_at))).scalar()

    seen, moved = newest(), 0
    deadline = time.monotonic() + timeout_s
    while moved < n:
        assert time.monotonic() < deadline, f"no daemon ended {n} ticks in {timeout_s} s (last tick {seen})"
        time.sleep(0.02)
        now = newest()
        if now != seen:
            seen, moved = now, moved + 1
