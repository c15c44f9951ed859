"""The store verbs the daemon's outbox, lease and cluster call instead of writing SQL
(watchdog.store.outbox.refuse / waiting_before, watchdog.store.leases.record_tick and the
lease's session), on both backends."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import insert, select

from watchdog.store import leases, outbox
from watchdog.store.schema import alerts, daemons

T0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)


def _alert(conn, key: str, **extra) -> int:
    values = dict(dedupe_key=key, title="t", body="b", created_at=T0, attempts=0, delivered_targets=[],
                  sealed_by="h1", mac="m", next_attempt_at=T0)
    values.update(extra)
    return conn.execute(insert(alerts).values(**values).returning(alerts.c.id)).scalar_one()


def test_refused_rows_are_closed_with_why_and_their_claims_end(engine):
    with engine.begin() as conn:
        a, b, c = (_alert(conn, k, claimed_by="pass", claimed_until=T0) for k in ("a", "b", "c"))
        outbox.refuse(conn, [a, b], now=T0, reason="refused: not sealed")
    with engine.connect() as conn:
        got = {r.id: r for r in conn.execute(select(alerts))}
    assert [(got[i].delivered_at is not None, got[i].last_error, got[i].attempts, got[i].claimed_by)
            for i in (a, b)] == [(True, "refused: not sealed", 1, None)] * 2
    assert got[c].delivered_at is None and got[c].claimed_by == "pass"


def test_waiting_before_reads_typed_rows_older_than_the_pass(engine):
    with engine.begin() as conn:
        a = _alert(conn, "a", delivered_targets=["t1"])
        b = _alert(conn, "b")
        _alert(conn, "done", delivered_at=T0)
        _alert(conn, "other host", sealed_by="h2")
        c = _alert(conn, "c")
    with engine.connect() as conn:
        older = outbox.waiting_before(conn, host="h1", below_id=c, exclude=[b])
    assert older == [outbox.Waiting(a, ["t1"], T0)]
    assert older[0].delivered_targets == ["t1"]


def test_record_tick_writes_the_hosts_row_and_only_the_named_holders(engine):
    with engine.begin() as conn:
        leases.write_holder(conn, host="h1", pid=10, create_time=1.0, lease_s=30)
        leases.record_tick(conn, "h1", now=T0, last_event_id=7, pid=11)  # not the holder: nothing
        assert conn.execute(select(daemons.c.last_tick_at)).scalar() is None
        leases.record_tick(conn, "h1", now=T0, last_event_id=7, pid=10)
        assert tuple(conn.execute(select(daemons.c.last_tick_at, daemons.c.last_event_id)).one()) == (T0, 7)
        leases.record_tick(conn, "h1", now=T0 + dt.timedelta(seconds=1), last_event_id=8)  # any holder
        assert conn.execute(select(daemons.c.last_event_id)).scalar() == 8


def test_the_leases_own_session_is_in_autocommit_and_ends_for_good(engine):
    conn = leases.open_session(engine)
    leases.ping(conn)
    assert conn.get_execution_options()["isolation_level"] == "AUTOCOMMIT"
    leases.end_session(conn)
    assert conn.closed
    leases.end_session(None)  # nothing to end
    assert leases.is_postgres(engine) == (engine.dialect.name == "postgresql")
    assert leases.DriverError.__name__ == "DBAPIError"
