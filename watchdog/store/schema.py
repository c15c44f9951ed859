"""The table definitions: the public table contract.

SQLite (WAL) is the embedded default, PostgreSQL the store for several hosts.
The SDK's hot path does not go through these Table objects (see
`watchdog.store.agent_writes`); everything else does.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect

from watchdog.core.budgets import RUN_BUDGETS
from watchdog.core.periods import utcnow  # noqa: F401  (re-exported: the store's modules and tests take it with the tables)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# SQLite only autoincrements INTEGER PRIMARY KEY; PostgreSQL needs 64 bits for events.
BigId = BigInteger().with_variant(Integer, "sqlite")

# How a timestamp is spelled on SQLite, and the GLOB that tests a hand-written one: part of the
# table contract, kept with the backend (watchdog.store.dialects).
from watchdog.store.dialects import ISO_GLOB, SQLITE_TS_FORMAT  # noqa: E402,F401  (re-exported)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC in and out, on both databases.

    PostgreSQL stores timestamptz. SQLite has no timezone type: values are
    stored as naive UTC text and come back aware, so comparisons never mix
    naive and aware datetimes.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: timestamps must be timezone-aware UTC")
        value = value.astimezone(dt.timezone.utc)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: dt.datetime | str | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # rows written by plain SQL from another language
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


runs = Table(
    "runs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("agent", String(128), nullable=False),
    Column("status", String(16), nullable=False),
    Column("stop_reason", String(32)),
    Column("stop_detail", Text),
    Column("kill_mode", String(16), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer),
    Column("pid_create_time", Float),  # psutil-compatible create time, seconds since epoch
    Column("labels", JSON),
    # The budgets this run asked for (NULL = the profile's), one column per run budget of the
    # registry (watchdog.core.budgets). Lower only, unless the profile allows raising.
    *(Column(b.key, Integer if b.integer else Float) for b in RUN_BUDGETS),
    # Denormalised counters, updated in the same transaction as each event.
    Column("steps", Integer, nullable=False, server_default="0"),
    Column("tool_calls", Integer, nullable=False, server_default="0"),
    Column("tool_errors", Integer, nullable=False, server_default="0"),
    Column("tokens_in", BigInteger, nullable=False, server_default="0"),
    Column("tokens_out", BigInteger, nullable=False, server_default="0"),
    Column("cost_eur", Float, nullable=False, server_default="0"),
    # Of tokens_in, those read from the provider's prompt cache; of tokens_out, the reasoning ones.
    Column("cached_tokens_in", BigInteger, nullable=False, server_default="0"),
    Column("reasoning_tokens", BigInteger, nullable=False, server_default="0"),
    # Tokens of steps no price table priced (yet): their cost is not in cost_eur. Never a silent zero.
    Column("cost_unpriced_tokens", BigInteger, nullable=False, server_default="0"),
    Column("last_seq", Integer, nullable=False, server_default="0"),
    Column("progress", Text),
    Column("started_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    Column("stop_requested_at", UTCDateTime),
    # The stop ladder's state lives here so a restarted daemon resumes exactly once.
    Column("signal_stage", String(16)),  # NULL | term | kill | refused | done
    Column("signalled_at", UTCDateTime),
    Column("ended_at", UTCDateTime),
    # When the daemon booked the ended run into the spend ledger (NULL: not yet; see store.ledger).
    Column("booked_at", UTCDateTime),
    # A child run (run.child): its steps, tool calls and spend also count on its parent's row.
    # No foreign key: a child may outlive its pruned parent; the SDK checks the parent at start.
    Column("parent_id", String(32)),
    # on_breach = "pause": since when it is held (NULL unless paused), and how often a human
    # resumed it (> 0: its own budget columns hold, above its profile too).
    Column("paused_at", UTCDateTime),
    Column("resumes", Integer, nullable=False, server_default="0"),
    Column("partial", Text),  # run.partial(): a short partial result, kept across a stop
    # Which witness created the run (watchdog.core.lifecycle.Source); `sql` when a plain-SQL
    # writer does not say.
    Column("source", String(16), nullable=False, server_default="sql"),
    # PostgreSQL: the login that inserted the run (session_user), written by the database, never
    # by the writer; row-level security keeps each writer to its own (migrations 0010). NULL on
    # SQLite (one trust domain per file) and for runs from before owners were recorded.
    Column("owner", String(63)),
    Index(None, "status", "booked_at"),  # the ended runs not booked yet, without a scan
    # The top tool, written once when the run has ended ("sealed" by the daemon's leader), so
    # listing ended runs never aggregates their events. NULL while active or not sealed yet;
    # top_tool_calls = 0 (top_tool NULL) for a run without tool calls.
    Column("top_tool", String(128)),
    Column("top_tool_calls", Integer),
    Column("top_tool_errors", Integer),
    # Each daemon scans the active runs of its own host (and the leader those of hosts
    # without a live daemon): status first, so status-only queries use it too.
    Index(None, "status", "host"),
    Index(None, "agent", "started_at"),
    # Listing pages newest first, from an index (`runs --all --before ID`).
    Index(None, "started_at", "id"),
    # Retention: ended runs older than keep_days.
    Index(None, "ended_at"),
    # Ended runs whose top tool is not sealed yet: a partial index stays as small as the backlog.
    Index("ix_runs_unsealed", "ended_at", postgresql_where=text("ended_at IS NOT NULL AND top_tool_calls IS NULL"),
          sqlite_where=text("ended_at IS NOT NULL AND top_tool_calls IS NULL")),
    Index(None, "parent_id"),
    # The number of the run's latest change (an update of the row, or a new event of the run),
    # from one store-wide counter, written by the database's triggers, never by a writer
    # (migration 0012): "which runs changed since N" is one range read (watchdog.store.changes).
    Column("change_seq", BigInteger, nullable=False, server_default="0"),
    Index(None, "change_seq"),
)

# A whole-row read of `runs` takes this much of the writer's free text (stop_detail, progress,
# partial: no length check holds them). A writer that stored two 540 MB texts made every read of
# its whole row fail on PostgreSQL (a result row is at most 1 GB: "out of memory", an outage to
# the tick, every tick) and fill the reader's memory on SQLite. What is shown or alerted of them
# is far shorter (watchdog.core.messages).
RUN_TEXT_READ_MAX_CHARS = 20_000


def _whole_run() -> tuple[Any, ...]:
    from sqlalchemy import func

    return tuple(func.substr(c, 1, RUN_TEXT_READ_MAX_CHARS).label(c.name) if isinstance(c.type, Text) else c
                 for c in runs.c)


WHOLE_RUN = _whole_run()  # select(*WHOLE_RUN): every column of `runs`, its free text bounded

events = Table(
    "events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("run_id", String(32), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("kind", String(16), nullable=False),  # step | tool | heartbeat
    Column("tool", String(128)),
    Column("args_hash", String(64)),
    Column("args", JSON),  # only when [store] record_args = true: arguments carry secrets
    Column("ok", Boolean),
    Column("error_class", String(128)),
    Column("error_msg", String(500)),
    Column("duration_s", Float),
    Column("model", String(128)),
    Column("tokens_in", Integer),
    Column("tokens_out", Integer),
    Column("cached_tokens_in", Integer),  # of tokens_in
    Column("reasoning_tokens", Integer),  # of tokens_out
    Column("cost_eur", Float),  # NULL on a step = not priced (yet): the daemon prices it or reports the model
    Column("progress", Text),
    Column("attempt", Integer),  # a tool call's retry number (2, 3, ...); NULL for a first attempt
    # Which witness saw it (NULL: the run's own writer) and the id the witnesses share for one
    # call (OTel tool call id, MCP request id): a call several witnesses saw counts once.
    Column("source", String(16)),
    Column("call_id", String(128)),
    # The run's attested process's MAC over (run id, seq, payload) with its per-run key: only
    # such records can justify a signal where rows cannot prove their writer (SQLite).
    Column("mac", String(64)),
    UniqueConstraint("run_id", "seq"),
    # The circuit breaker's rolling window: a tool's recent calls across runs.
    Index(None, "tool", "at"),
)

interventions = Table(
    "interventions",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("run_id", String(32), ForeignKey("runs.id", ondelete="CASCADE")),
    Column("tool", String(128)),
    # stop_requested | sigterm | sigkill | signal_refused | not_signalled | lost
    # | rate_alarm | circuit_open | circuit_half_open | circuit_closed | ended
    # | budget_warning | budget_closed | drift_alarm (these three with no run)
    Column("action", String(32), nullable=False),
    Column("reason", String(32)),
    Column("detail", Text),
    Column("outcome", String(255)),
    Column("actor", String(255)),  # daemon@host:pid, cli@host, sdk
    Index(None, "run_id"),
    Index(None, "at"),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    # At most one alert per key, ever: the database enforces "alert exactly once".
    Column("dedupe_key", String(255), nullable=False, unique=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("run_id", String(32), ForeignKey("runs.id", ondelete="CASCADE")),
    Column("intervention_id", BigId, ForeignKey("interventions.id", ondelete="SET NULL")),
    Column("title", String(500), nullable=False),
    Column("body", Text, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", UTCDateTime),
    # Ids of the URLs that already got it; `at:<id>:<time>` says when (`alerts --all`) and
    # `dead:<id>` that a send to it hung past the hard limit (watchdog.daemon.alerts.lanes).
    Column("delivered_targets", JSON),
    Column("delivered_at", UTCDateTime),
    Column("last_error", Text),
    # HMAC of (dedupe_key, title, body) under the key of the daemon of `sealed_by`:
    # the outbox delivers only what a daemon composed, never a row someone inserted.
    Column("sealed_by", String(255)),
    Column("mac", String(64)),
    # A delivery pass claims its rows before sending (watchdog.store.outbox): two
    # deliverers on one store never send one alert twice; a crashed one's claims expire.
    Column("claimed_by", String(255)),
    Column("claimed_until", UTCDateTime),
    # Dead letter: not delivered within alert_expire_s, or a row that cannot be read or
    # handled; kept (`agent-watchdog alerts --dead`), never retried.
    Column("dead_at", UTCDateTime),
    Index(None, "delivered_at", "next_attempt_at"),
    Index(None, "dead_at"),
    # Deleting runs and interventions (retention) looks up the alerts that reference them.
    Index(None, "run_id"),
    Index(None, "intervention_id"),
)

tool_circuits = Table(
    "tool_circuits",
    metadata,
    Column("tool", String(128), primary_key=True),
    Column("state", String(16), nullable=False),  # closed | open | half_open
    Column("opened_at", UTCDateTime),
    Column("open_until", UTCDateTime),
    Column("errors_in_window", Integer, nullable=False, server_default="0"),
    Column("window_s", Float),
    Column("last_error", String(500)),  # scrubbed; for operators (`circuits`), never shown to a model
    Column("last_error_class", String(128)),  # what other runs' models are told: the class, never the text
    Column("probe_run_id", String(32)),
    Column("probe_at", UTCDateTime),
    Column("updated_at", UTCDateTime, nullable=False),
)

# What the daemon publishes so the SDK, the daemon and the CLI agree
# (price table, agent profiles). Key -> JSON.
settings = Table(
    "settings",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", JSON, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

# One live daemon per (store, host). The row names the last holder of the host's lease; the
# lease itself is a PostgreSQL advisory lock held by the daemon's session (SQLite: this row,
# written under the database's write lock). Other daemons read `expires_at` (the database's
# clock) to tell a host whose daemon is gone; `leader_since` marks the daemon doing the
# cluster duties.
daemons = Table(
    "daemons",
    metadata,
    Column("host", String(255), primary_key=True),
    Column("pid", Integer, nullable=False),
    Column("pid_create_time", Float, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("last_tick_at", UTCDateTime),
    Column("last_event_id", BigInteger),
    Column("expires_at", UTCDateTime),
    Column("leader_since", UTCDateTime),
)

# The half-open probe of an open circuit, claimed by the SDK with one INSERT: the first
# run to insert (tool, opened_at) is the probe. Agents may insert here; they may not
# write tool_circuits, whose state only the daemon changes.
circuit_probes = Table(
    "circuit_probes",
    metadata,
    Column("tool", String(128), primary_key=True),
    Column("opened_at", UTCDateTime, primary_key=True),  # the open period this probe is for
    Column("run_id", String(32), nullable=False),
    Column("claimed_at", UTCDateTime, nullable=False),
    # Set by the probing run when its call succeeded: the SDK then treats the circuit as
    # closed at once; the daemon closes the row (and audits, and alerts) on its next tick.
    Column("ok", Boolean),
)

# Process identities the daemon of `host` attested over its Unix socket (SO_PEERCRED),
# sealed with its key: the only identities it will ever signal. Written by the daemon only.
attestations = Table(
    "attestations",
    metadata,
    Column("run_id", String(32), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("pid_create_time", Float, nullable=False),
    Column("uid", Integer, nullable=False),
    Column("kill_mode", String(16), nullable=False),
    Column("attested_at", UTCDateTime, nullable=False),
    Column("mac", String(64), nullable=False),
    # The cgroup `agent-watchdog exec` made for the run (kill_mode cgroup / tree), from its
    # attestation: the only cgroup the daemon will ever kill.
    Column("cgroup", Text),
    # What the daemon recorded at attestation for the run's evidence key (JSON: the key's nonce,
    # when, the budgets registered), sealed: see watchdog.store.attestations (migration 0011).
    Column("evidence", Text),
)

# The spend ledger: per scope ("agent:NAME" or "labels:{json}") and calendar period
# ("day" "2025-01-31", "month" "2025-01" in [pricing] budget_tz), the ended runs' cost.
# Written only by the daemon's booking (watchdog.store.ledger); increments, never overwrites.
spend_ledger = Table(
    "spend_ledger",
    metadata,
    Column("scope", String(255), primary_key=True),
    Column("period", String(8), primary_key=True),
    Column("period_key", String(10), primary_key=True),
    Column("cost_eur", Float, nullable=False, server_default="0"),
    Column("runs", Integer, nullable=False, server_default="0"),
    Column("tokens", BigInteger, nullable=False, server_default="0"),
    Column("unpriced_tokens", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", UTCDateTime, nullable=False),
)

# Per agent and 5-minute bucket (UTC) of the runs' end: their totals, for the drift alarms.
agent_rollups = Table(
    "agent_rollups",
    metadata,
    Column("agent", String(128), primary_key=True),
    Column("bucket_at", UTCDateTime, primary_key=True),
    Column("runs", Integer, nullable=False, server_default="0"),
    Column("stopped", Integer, nullable=False, server_default="0"),  # killed or lost
    Column("steps", Integer, nullable=False, server_default="0"),
    Column("tool_calls", Integer, nullable=False, server_default="0"),
    Column("tool_errors", Integer, nullable=False, server_default="0"),
    Column("cost_eur", Float, nullable=False, server_default="0"),
    Column("tokens", BigInteger, nullable=False, server_default="0"),
    Column("unpriced_tokens", BigInteger, nullable=False, server_default="0"),
    Index(None, "bucket_at"),
)

agent_rollup_tools = Table(
    "agent_rollup_tools",
    metadata,
    Column("agent", String(128), primary_key=True),
    Column("bucket_at", UTCDateTime, primary_key=True),
    Column("tool", String(128), primary_key=True),
    Column("calls", Integer, nullable=False, server_default="0"),
    Column("errors", Integer, nullable=False, server_default="0"),
    Index(None, "bucket_at"),
)

# SQLite's change counter (migration 0012): one row (id 1), the number the last change of a run
# took and that run's id; written only by the triggers. PostgreSQL numbers changes with the
# sequence aw_change_seq instead and leaves this table empty (a row as counter would make every
# writer wait for the others' commits).
change_counter = Table(
    "change_counter",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("seq", BigInteger, nullable=False),
    Column("run_id", String(32)),
)
