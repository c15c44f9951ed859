"""The SQL behind a run's own evidence: the sealed record of its key, and its MAC'd records.

The daemon writes `attestations.evidence` (JSON, sealed: watchdog.daemon.trust.authentic) next to
the identity it attested; it reads back a run's events that carry a MAC to count only those
the run's attested process wrote (watchdog.core.evidence_mac). Both only at attestation and
before a first signal: never on the tick's hot path.
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import String, and_, select, type_coerce, update
from sqlalchemy.engine import Connection

from watchdog.store.schema import attestations, events

# What the MAC covers (watchdog.core.evidence_mac.FIELDS), plus the id, the seq and the MAC. The
# time as the writer wrote it (SQLite text): the MAC covers that text.
_EVENT_COLS = (events.c.id, events.c.seq, events.c.kind, events.c.tool, events.c.args_hash, events.c.ok,
               events.c.model, events.c.tokens_in, events.c.tokens_out, events.c.cached_tokens_in,
               events.c.reasoning_tokens, events.c.cost_eur, events.c.attempt,
               type_coerce(events.c.at, String).label("at_text"), events.c.mac)

# At most this many of a run's records are read per check (the rest at the next tick): whatever a
# writer appends, one check costs a bounded time.
CHUNK = 20_000


def save(conn: Connection, run_id: str, evidence_json: str) -> None:
    conn.execute(update(attestations).where(attestations.c.run_id == run_id).values(evidence=evidence_json))


def load(conn: Connection, run_id: str) -> Any:
    """The run's attestation row with its evidence (None: never attested)."""
    return conn.execute(select(attestations).where(attestations.c.run_id == run_id)).first()


def macd_events(conn: Connection, run_id: str, after_id: int = 0, limit: int = CHUNK) -> Sequence[Any]:
    """The run's events that carry a MAC (the others can never be the run's own) with an id above
    `after_id`, oldest first, at most `limit`."""
    q = (select(*_EVENT_COLS).where(and_(events.c.run_id == run_id, events.c.mac.is_not(None),
                                         events.c.id > after_id))
         .order_by(events.c.id).limit(limit))
    return conn.execute(q).all()
