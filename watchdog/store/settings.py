"""What is published in `settings` (the config, the period budgets, each daemon's own description) and which
daemons watch the store.

The `settings` table: what the daemon publishes so the SDK, the daemon and the CLI agree.

One row per key, the value JSON. The keys are the table contract's, spelled here once:
`config` (the profiles and the price table, watchdog.core.config.Config.published),
`budget_closed` and `budget_state` (the period budgets, watchdog.core.periods). Only the
daemon writes them (on PostgreSQL the agents' role cannot); the SDK reads `config` and
`budget_closed` through its pre-rendered statement (watchdog.store.agent_writes).

Which daemons watch this store, as `agent-watchdog status`, `runs` and `top` show it (issue 36).

Two sources, both daemon-owned: the `daemons` lease rows (one per host: its pid, start, last
tick, lease expiry, leadership) and what each daemon publishes about itself under the
`settings` key `daemon:<host>` (its receivers' addresses, whom it can signal). On PostgreSQL
only the daemon's login writes either; on SQLite any writer could, so this is shown, never
obeyed. Liveness is the lease's expiry against the store's clock.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from watchdog.core.periods import CLOSED_KEY, STATE_KEY
from watchdog.store.leases import MAX_LEASE_S, db_now
from watchdog.store.schema import settings, daemons, settings as settings_table

__all__ = ["CONFIG_KEY", "CLOSED_KEY", "STATE_KEY", "Published", "get", "get_with_time", "put", "DaemonStatus",
           "KEY_CHARS", "SELF_PREFIX", "Watchers", "banner", "no_live_daemon", "publish_self", "self_key", "watchers"]


CONFIG_KEY = "config"


class Published(NamedTuple):
    value: Any
    updated_at: dt.datetime | None


def put(conn: Connection, key: str, value: Any, now: dt.datetime) -> None:
    """Publish `value` under `key` (an update, else an insert)."""
    done = conn.execute(update(settings).where(settings.c.key == key).values(value=value, updated_at=now))
    if done.rowcount == 0:
        conn.execute(insert(settings).values(key=key, value=value, updated_at=now))


def get(conn: Connection, key: str) -> Any:
    """The published value, None when nothing is published under `key`."""
    return conn.execute(select(settings.c.value).where(settings.c.key == key)).scalar()


def get_with_time(conn: Connection, key: str) -> Published | None:
    """The published value and when it was published; None when nothing is."""
    row = conn.execute(select(settings.c.value, settings.c.updated_at).where(settings.c.key == key)).first()
    return None if row is None else Published(row.value, row.updated_at)


# -- Which daemons watch this store, as `agent-watchdog status`, `runs` and `top` show it (issue 36) ----

SELF_PREFIX = "daemon:"
KEY_CHARS = 64  # settings.key


def self_key(host: str) -> str:
    """The settings key under which the daemon of `host` publishes itself."""
    return (SELF_PREFIX + host)[:KEY_CHARS]


def publish_self(conn: Connection, host: str, value: dict[str, Any], now: dt.datetime) -> None:
    put(conn, self_key(host), value, now)


@dataclass(frozen=True)
class DaemonStatus:
    host: str
    pid: int
    started_at: dt.datetime
    last_tick_at: dt.datetime | None
    expires_at: dt.datetime | None
    leader_since: dt.datetime | None
    live: bool
    published: dict[str, Any] = field(default_factory=dict)  # what it says of itself (receivers, signals)


@dataclass(frozen=True)
class Watchers:
    now: dt.datetime  # the store's clock
    daemons: tuple[DaemonStatus, ...]

    @property
    def live(self) -> tuple[DaemonStatus, ...]:
        return tuple(d for d in self.daemons if d.live)

    def last_seen(self) -> dt.datetime | None:
        """When a daemon was last seen alive (its last tick, else its lease's last renewal)."""
        times = [d.last_tick_at or d.started_at for d in self.daemons]
        return max(times) if times else None


def _aware(t: Any) -> dt.datetime | None:
    if not isinstance(t, dt.datetime):
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def _live(expires: dt.datetime | None, now: dt.datetime) -> bool:
    """A lease is live until its expiry; one further out than any daemon writes (a row written by
    hand) counts as dead: a banner too many, never one missing."""
    return expires is not None and now < expires <= now + dt.timedelta(seconds=MAX_LEASE_S)


def watchers(conn: Connection) -> Watchers:
    """Every daemon that ever held a lease on this store, live or not, with what it published."""
    now = _aware(db_now(conn)) or dt.datetime.now(dt.timezone.utc)
    published: dict[str, dict[str, Any]] = {}
    for key, value in conn.execute(select(settings_table.c.key, settings_table.c.value)
                                   .where(settings_table.c.key.startswith(SELF_PREFIX))):
        if isinstance(value, dict):
            published[key] = value
    found = []
    for r in conn.execute(select(daemons).order_by(daemons.c.host)):
        expires = _aware(r.expires_at)
        mine = published.get(self_key(r.host), {})
        if mine.get("pid") != r.pid:
            mine = {}  # published by an earlier daemon of the host: not this one's word
        found.append(DaemonStatus(host=r.host, pid=r.pid, started_at=_aware(r.started_at) or now,
                                  last_tick_at=_aware(r.last_tick_at), expires_at=expires,
                                  leader_since=_aware(r.leader_since), live=_live(expires, now),
                                  published=mine))
    return Watchers(now, tuple(found))


def no_live_daemon(conn: Connection) -> str | None:
    """The banner `runs` and `top` print when no daemon watches the store; None when one does."""
    w = watchers(conn)
    if w.live:
        return None
    seen = w.last_seen()
    since = f"since {seen.strftime('%Y-%m-%d %H:%M:%S')} UTC" if seen else "ever"
    return f"agent-watchdog: no live daemon {since}: no run is judged"  # fits top's 80 columns


def banner(conn: Connection) -> str | None:
    """no_live_daemon, or None when this login may not read the daemons' rows (an agent's
    PostgreSQL role): in a savepoint, so the caller's snapshot survives a refused read."""
    try:
        with conn.begin_nested():
            return no_live_daemon(conn)
    except Exception as exc:  # noqa: BLE001 — a banner is a courtesy; the listing goes on
        from watchdog.store.engine import store_unavailable

        if store_unavailable(exc):
            raise
        return None
