"""What `agent-watchdog hook` (watchdog.gateways.hooks) reads and writes for a coding CLI's session.

The hook is a new process for every tool call, so nothing lives in memory between calls: each
call reads its session's run (status, counters, own budgets, the profiles the daemon
published), how often this very call (tool + args hash) was made before and the last calls'
signatures (loops), then counts the call before it runs (witness.append: the event and the
run's counters in one transaction). The run is the hook's own (`source = 'hook'`): on
PostgreSQL its row belongs to the login the hook connects as, and only that login moves it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from watchdog.core import lifecycle as lc
from watchdog.core.config import Config
from watchdog.store import run_rows, witness
from watchdog.store.joined import RunState, run_state
from watchdog.store.schema import events, runs
from watchdog.store.views import published_profiles

RECENT_CALLS = 3  # the last signatures the oscillation check (A-B-A-B) needs besides this call


def session_run(engine: Engine, run_id: str) -> RunState | None:
    """The session's run, or None before its first tool call."""
    return run_state(engine, run_id)


def judged_by(engine: Engine, config: Config) -> Config:
    """`config` with the profiles the daemon published in the store (what it enforces)."""
    with engine.connect() as conn:
        return published_profiles(conn, config)


def open_session(engine: Engine, run_id: str, *, agent: str, host: str, labels: dict[str, Any], uid: int,
                 parent_id: str | None = None) -> bool:
    """Create the session's run (running, source hook); False if the id is taken: by another hook
    call of the same session (two tools called at once), or by a row this login cannot see.
    Owned by its writer: on PostgreSQL the database books the login; on SQLite the run is booked
    `uid N` (the hook's Unix user), which the logs receiver matches with its sender's uid."""
    owner = sqlite_owner(uid) if engine.dialect.name == "sqlite" else None
    labels = {**labels, "uid": uid}
    dbapi_integrity = getattr(engine.dialect.dbapi, "IntegrityError", IntegrityError)
    try:
        with engine.begin() as conn:
            witness.create_run(conn, run_id=run_id, agent=agent, source=lc.Source.HOOK, host=host,
                               kill_mode=lc.KillMode.COOPERATIVE, labels=labels, now=witness.store_now(conn),
                               owner=owner, parent_id=parent_id)
        return True
    except (IntegrityError, dbapi_integrity):  # create_run speaks the driver's own cursor: its errors are raw
        return False


def sqlite_owner(uid: int) -> str:
    return f"uid {uid}"


STOPPED_SEEN_S = 3600  # a session's stopped run still refuses its log events this long after it ended


@dataclass(frozen=True)
class HookRun:
    id: str
    agent: str
    active: bool


SessionKey = tuple[str, str, str, int]  # (cli, session id, owner, Unix uid) of a log events' sender
CLAIMS_KEPT = 2  # enough to tell one run from several
SESSIONS_A_QUERY = 200  # held sessions looked up by one statement


def held_runs(conn: Connection, keys: list[SessionKey]) -> dict[SessionKey, list[HookRun]]:
    """For each sender's session, the hook runs that claim it, the active first (newest first
    within each), at most CLAIMS_KEPT (enough to tell one from several:
    watchdog.daemon.otlp.logruns). Held by the sender: its owner is the sender (on PostgreSQL the
    hook's login, which the database wrote; on SQLite also `uid N` of the sender's Unix user, which
    the hook wrote) and its hook ran as the same Unix user. Active, or stopped within
    STOPPED_SEEN_S (its events are refused like its calls); a run ended by silence is none (the
    session's next call starts the next one). On SQLite any writer may add a row that looks the
    same: the caller never picks among two. Filtered in SQL on the CLI and the session."""
    sqlite = conn.dialect.name == "sqlite"
    got: dict[SessionKey, list[HookRun]] = {k: [] for k in keys}
    since = witness.store_now(conn) - dt.timedelta(seconds=STOPPED_SEEN_S)
    active = runs.c.status.in_(lc.ACTIVE_STATUSES)
    recent = or_(active, and_(runs.c.status != lc.Status.COMPLETED, runs.c.ended_at >= since))
    todo = list(got)
    for i in range(0, len(todo), SESSIONS_A_QUERY):
        chunk = todo[i:i + SESSIONS_A_QUERY]
        owners = {k[2] for k in chunk} | ({sqlite_owner(k[3]) for k in chunk} if sqlite else set())
        by_session: dict[tuple[str, str, int], list[SessionKey]] = {}
        for k in chunk:
            by_session.setdefault((k[0], k[1], k[3]), []).append(k)
        q = (select(runs.c.id, runs.c.agent, runs.c.status, runs.c.owner, runs.c.labels)
             .where(and_(runs.c.source == lc.Source.HOOK, runs.c.owner.in_(owners), recent,
                         runs.c.labels["session"].as_string().in_({k[1] for k in chunk}),
                         runs.c.labels["cli"].as_string().in_({k[0] for k in chunk})))
             .order_by(case((active, 0), else_=1), runs.c.started_at.desc()))
        for r in conn.execute(q):
            _claim(r, by_session, got, sqlite)
    return got


def _claim(r: Any, by_session: dict[tuple[str, str, int], list[SessionKey]], got: dict[SessionKey, list[HookRun]],
           sqlite: bool) -> None:
    """The row claims the sessions of its labels' (CLI, session, Unix uid) held by its owner."""
    labels = r.labels if isinstance(r.labels, dict) else {}
    uid = labels.get("uid")
    if not isinstance(uid, int):
        return
    for k in by_session.get((labels.get("cli"), labels.get("session"), uid), []):  # type: ignore[arg-type]
        if r.owner in (k[2], sqlite_owner(uid) if sqlite else k[2]) and len(got[k]) < CLAIMS_KEPT:
            got[k].append(HookRun(r.id, r.agent, r.status in lc.ACTIVE_STATUSES))


def signatures(engine: Engine, run_id: str, tool: str, args_hash: str) -> tuple[int, list[tuple[str, str]]]:
    """(how many tool calls of the run had this tool and args hash, the last RECENT_CALLS
    (tool, args hash) oldest first)."""
    with engine.connect() as conn:
        same = conn.execute(select(func.count()).select_from(events).where(and_(
            events.c.run_id == run_id, events.c.kind == lc.EventKind.TOOL, events.c.tool == tool,
            events.c.args_hash == args_hash))).scalar()
        recent = conn.execute(select(events.c.tool, events.c.args_hash).where(and_(
            events.c.run_id == run_id, events.c.kind == lc.EventKind.TOOL))
            .order_by(events.c.seq.desc()).limit(RECENT_CALLS)).all()
    return int(same or 0), [(r.tool or "", r.args_hash or "") for r in reversed(recent)]


def count_call(engine: Engine, run_id: str, *, tool: str, args_hash: str, call_id: str | None,
               parent_id: str | None = None) -> bool:
    """One tool call, counted before it runs (ok unknown yet); False if the run is not active.
    A sub-agent's call (`parent_id`: its session's run) is also added to the parent's tool calls
    in the same transaction, as the SDK rolls a child's records up: the session is judged on its
    totals. (The event is the child's: one call, one event.)"""
    call = witness.WitnessedCall(kind=lc.EventKind.TOOL, tool=tool, args_hash=args_hash, call_id=call_id)
    with engine.begin() as conn:
        if not witness.append(conn, run_id, [call], source=lc.Source.HOOK, now=witness.store_now(conn)):
            return False
        if parent_id is not None:
            conn.execute(update(runs).where(and_(runs.c.id == parent_id, runs.c.status.in_(lc.ACTIVE_STATUSES)))
                         .values(tool_calls=runs.c.tool_calls + 1))
        return True


FAILED_SUFFIX = "/failed"  # a failed result's call id: its call's, and this


def count_failed(engine: Engine, run_id: str, *, tool: str, args_hash: str, call_id: str | None,
                 cli: str) -> bool:
    """A counted call's tool failed. Its event is append-only (written before the call ran, ok
    unknown): a result is appended, a heartbeat naming the tool with ok false (the readers of a
    run's tools count it as that tool's error, never as a call: watchdog.store.run_rows.tool_events),
    and the run's error counter takes it, in one transaction. Once per call: the result's call id
    is the call's (`call_id`, the CLI's tool-call id) + FAILED_SUFFIX; a CLI that names no call id
    (Gemini) has its failure matched to the run's latest call of this tool and args hash that has
    no result yet (`hook:<cli>:@<seq>`). False when nothing was counted (a result already there, or
    the run not active)."""
    with engine.begin() as conn:
        if call_id is None:
            call_id = _unanswered_call(conn, run_id, tool, args_hash, cli)
        result_id = None if call_id is None else call_id[:128 - len(FAILED_SUFFIX)] + FAILED_SUFFIX
        if result_id is not None:
            if witness.known_call_ids(conn, run_id, [result_id]):
                return False  # this call's failure is counted (PostToolUse and PostToolUseFailure alike)
            result = witness.WitnessedCall(kind=lc.EventKind.HEARTBEAT, tool=tool, args_hash=args_hash, ok=False,
                                           call_id=result_id)
            if not witness.append(conn, run_id, [result], source=lc.Source.HOOK, now=witness.store_now(conn)):
                return False
        moved = conn.execute(update(runs).where(and_(runs.c.id == run_id, runs.c.status.in_(lc.ACTIVE_STATUSES)))
                             .values(tool_errors=runs.c.tool_errors + 1))
        return bool(moved.rowcount)


def _unanswered_call(conn: Connection, run_id: str, tool: str, args_hash: str, cli: str) -> str | None:
    """`hook:<cli>:@<seq>` of the run's latest call of (tool, args hash) without a failed result
    yet (None: there is none; the failure then counts on the run's errors alone)."""
    prefix = f"hook:{cli}:@"
    answered = select(events.c.call_id).where(and_(
        events.c.run_id == run_id, events.c.kind == lc.EventKind.HEARTBEAT, events.c.call_id.like(f"{prefix}%")))
    done = set(conn.execute(answered).scalars())
    seqs = conn.execute(select(events.c.seq).where(and_(
        events.c.run_id == run_id, events.c.kind == lc.EventKind.TOOL, events.c.tool == tool,
        events.c.args_hash == args_hash)).order_by(events.c.seq.desc()).limit(1000)).scalars()
    for seq in seqs:
        if f"{prefix}{seq}{FAILED_SUFFIX}" not in done:
            return f"{prefix}{seq}"
    return None


def end_stopped(engine: Engine, run_id: str, *, reason: str, detail: str) -> bool:
    """The hook's guard refused a call: the run ends killed with that reason (as the SDK's
    in-process guard ends its run), which the daemon alerts once. False if it was not running."""
    with engine.begin() as conn:
        now = witness.store_now(conn)
        return run_rows.move(conn, run_id, lc.Status.KILLED, was=lc.Status.RUNNING, stop_reason=reason,
                             stop_detail=detail[:500], ended_at=now)


def pause(engine: Engine, run_id: str, *, reason: str, detail: str) -> bool:
    """The hook's guard found a breach its profile pauses on (`on_breach = "pause"`): running →
    paused with that reason (the daemon records and alerts a pause it did not request; `resume`
    lets the run go on with more). False if it was not running."""
    with engine.begin() as conn:
        now = witness.store_now(conn)
        return run_rows.move(conn, run_id, lc.Status.PAUSED, was=lc.Status.RUNNING, stop_reason=reason,
                             stop_detail=detail[:500], paused_at=now)
