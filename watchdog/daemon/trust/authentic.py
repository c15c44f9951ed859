"""SQLite: a signal is justified only by the run's own evidence.

On SQLite every writer of the store shares one file: any of them can inflate another run's
counters or append events to it, and no row can prove who wrote it. So before its first
signal the ladder asks `OwnEvidence.justifies`: is the breach shown by what only the run's
attested process could have written?

- its records whose MAC verifies with the run's key (watchdog.core.evidence_mac): the daemon
  derives that key from its own, the run id and the nonce it sealed at attestation, so a
  restarted daemon verifies as the first did; each sequence number counts once;
- the wall clock from the attestation (the daemon's own sealed time), the silence from the
  newest of the run's own records (their time is under the MAC);
- the budgets the run registered with (sealed at attestation), or laxer ones if the row has
  them (an operator's resume): a writer lowering them cannot make the run's own records a breach.

A breach seen only in unauthenticated rows leaves the run stopped cooperatively, recorded and
alerted once as "not signalled: the evidence is not the run's own". An operator's `kill`,
sealed with the daemon's key, needs no evidence. On PostgreSQL rows belong to their writer
(row-level security): the ladder does not ask.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.interventions import Action
from watchdog.core import budgets as bud, lifecycle as lc
from watchdog.core.config import Config
from watchdog.core.evidence_mac import RecordMac
from watchdog.core.messages import ACK_MARK, RunFacts
from watchdog.core.policies import RunSnapshot, Verdict, evaluate
from watchdog.core.seal import Sealer
from watchdog.store import attestations as store
from watchdog.store.alerts import Audit, announce, by_key as sealed_alert
from watchdog.store.engine import Connection

NOT_OWN = "not signalled: the evidence is not the run's own"
NONCE_BYTES = 16
_MEMO_MAX = 10_000  # runs whose newest own record this daemon remembers (stopping runs only)


@dataclass(frozen=True)
class Sealed:
    """What the daemon recorded at attestation for the run's evidence (its seal verified)."""

    nonce: str
    attested_at: dt.datetime
    budgets: dict[str, float]


def _budgets_json(budgets: Mapping[str, Any]) -> str:
    return json.dumps({k: budgets[k] for k in sorted(budgets) if budgets[k] is not None}, sort_keys=True)


def new_evidence(sealer: Sealer, run_id: str, registered: Mapping[str, Any], now: dt.datetime) -> str:
    """The sealed evidence record of a new attestation (JSON for attestations.evidence)."""
    nonce = os.urandom(NONCE_BYTES).hex()
    at = now.astimezone(dt.timezone.utc).isoformat(timespec="microseconds")
    budgets = _budgets_json(registered)
    return json.dumps({"v": 1, "nonce": nonce, "at": at, "budgets": budgets,
                       "mac": sealer.evidence(run_id, nonce, at, budgets)})


def parse_evidence(sealer: Sealer | None, run_id: str, text: object) -> Sealed | None:
    """The evidence record if it is this daemon's (seal verifies), else None."""
    if sealer is None or not isinstance(text, str):
        return None
    try:
        d = json.loads(text)
        nonce, at, budgets, mac = d["nonce"], d["at"], d["budgets"], d["mac"]
        if not (isinstance(nonce, str) and isinstance(at, str) and isinstance(budgets, str)):
            return None
        if not sealer.evidence_ok(mac, run_id, nonce, at, budgets):
            return None
        when = dt.datetime.fromisoformat(at)
        asked = json.loads(budgets)
        return Sealed(nonce, when, {k: v for k, v in asked.items() if k in bud.RUN_BUDGET_KEYS})
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def run_key(sealer: Sealer, run_id: str, sealed: Sealed) -> bytes:
    return sealer.run_key(run_id, sealed.nonce)


@dataclass
class OwnCounts:
    """What the run's own (authenticated) records add up to, folded so far."""

    nonce: str = ""  # the key they were verified with
    last_id: int = 0  # the newest event id read
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tokens: int = 0
    cost_eur: float = 0.0
    newest_seq: int = 0
    newest_at: dt.datetime | None = None  # the newest time the run's own records carry
    records: int = 0
    seqs: set[int] = dataclasses.field(default_factory=set)
    signatures: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)


def own_counts(conn: Connection, sealer: Sealer, run_id: str, sealed: Sealed,
               so_far: OwnCounts | None = None) -> OwnCounts:
    """Fold the run's records whose MAC verifies into `so_far` (from scratch without it, or when
    the key changed); each sequence number counts once. Reads only what is new since the last
    fold, a bounded chunk at a time: a record a writer deletes afterwards still counts, a flood of
    appended rows costs each check a bounded time."""
    out = so_far if so_far is not None and so_far.nonce == sealed.nonce else OwnCounts(nonce=sealed.nonce)
    mac = RecordMac(run_key(sealer, run_id, sealed))
    for e in store.macd_events(conn, run_id, out.last_id):
        out.last_id = e.id
        if e.seq in out.seqs:
            continue
        fields = [e.kind, e.tool, e.args_hash, e.ok, e.model, e.tokens_in, e.tokens_out, e.cached_tokens_in,
                  e.reasoning_tokens, e.cost_eur, e.attempt, e.at_text]
        cost = e.cost_eur
        if not mac.ok(e.mac, run_id, e.seq, *fields):
            # A step the SDK recorded unpriced and the daemon priced since: its tokens are the
            # run's own, the cost was not (counted as 0 towards a signal; the row still stops it).
            fields[9] = None
            if e.cost_eur is None or not mac.ok(e.mac, run_id, e.seq, *fields):
                continue
            cost = None
        out.seqs.add(e.seq)
        out.records += 1
        out.newest_seq = max(out.newest_seq, e.seq)
        at = _instant(e.at_text)
        if at is not None and (out.newest_at is None or at > out.newest_at):
            out.newest_at = at
        if e.kind == lc.EV_STEP:
            out.steps += 1
        elif e.kind == lc.EV_TOOL:
            out.tool_calls += 1
            out.tool_errors += 0 if e.ok else 1
            out.signatures[(e.tool, e.args_hash)] += 1
        out.tokens += (e.tokens_in or 0) + (e.tokens_out or 0)
        out.cost_eur += cost or 0.0
    return out


def _instant(text: object) -> dt.datetime | None:
    try:
        t = dt.datetime.fromisoformat(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t


def own_budgets(config: Config, row: Any, sealed: Sealed) -> bud.Budgets:
    """The registered budgets (sealed) over the profile, each raised to the row's if the row's is
    laxer (an operator's resume): a writer can lower none of them."""
    prof = config.profile(row.agent)
    registered = bud.effective(prof, sealed.budgets)
    current = bud.for_run(prof, row)
    changes: dict[str, Any] = {}
    for key in bud.RUN_BUDGET_KEYS:
        a, b = getattr(registered, key), getattr(current, key)
        changes[key] = None if a is None or b is None else max(a, b)  # None: no limit (the laxer)
    return dataclasses.replace(registered, **changes)


def operator_stop(conn: Connection, row: Any, sealer: Sealer | None) -> bool:
    """The stop is an operator's `agent-watchdog kill`: its stop alert is sealed with the daemon's
    key, is not an acknowledgement of a store request, and names the reason manual."""
    if sealer is None:
        return False
    a = sealed_alert(conn, AlertKind.STOP.key(row.id))
    if a is None or not isinstance(a.body, str) or not isinstance(a.title, str) or ACK_MARK in a.body:
        return False
    return a.title.endswith(f" — {lc.MANUAL}") and sealer.alert_ok(a.mac, a.dedupe_key, a.title, a.body, a.created_at)


class OwnEvidence:
    """The check the ladder makes before a first signal on SQLite (see the module docstring).

    Keeps, per stopping run, the fold of its own records so far (read incrementally)."""

    def __init__(self, config: Config, sealer: Sealer | None):
        self.config = config
        self.sealer = sealer
        self._folds: dict[str, OwnCounts] = {}

    def breach(self, conn: Connection, row: Any, now: dt.datetime, *, skip_clock: bool = False) -> Verdict | None:
        """The breach the run's own evidence shows, or None."""
        a = store.load_evidence(conn, row.id)
        if a is None or self.sealer is None:
            return None
        if not self.sealer.identity_ok(a.mac, a.run_id, a.host, a.pid, a.pid_create_time, a.uid, a.kill_mode,
                                       getattr(a, "cgroup", None)):
            return None
        sealed = parse_evidence(self.sealer, row.id, a.evidence)
        if sealed is None:
            return None
        if len(self._folds) >= _MEMO_MAX:  # stopping runs only: a bound, never reached in practice
            self._folds.clear()
        own = self._folds[row.id] = own_counts(conn, self.sealer, row.id, sealed, self._folds.get(row.id))
        # Silent since its newest own record (its time is under the MAC), or since attestation.
        last = max(own.newest_at or sealed.attested_at, sealed.attested_at)
        top = own.signatures.most_common(1)
        snap = RunSnapshot(
            id=row.id, agent=row.agent, started_at=sealed.attested_at, last_seen_at=last, steps=own.steps,
            tool_calls=own.tool_calls, tool_errors=own.tool_errors, cost_eur=own.cost_eur, tokens=own.tokens,
            top_signature=(top[0][0][0], top[0][1]) if top else None)
        verdicts = [v for v in evaluate(snap, own_budgets(self.config, row, sealed), now, skip_clock=skip_clock)
                    if v.reason != lc.TOOL_RATE]  # the rate rests on times a writer can rewrite
        return verdicts[0] if verdicts else None

    def justifies(self, conn: Connection, row: Any, now: dt.datetime, *, skip_clock: bool = False) -> bool:
        """May the ladder signal this run's process? An operator's sealed kill, or a breach shown
        by the run's own evidence, or the kernel's: an exec'd run whose attested supervisor is gone
        (its tree is orphaned; only exec ends an exec'd run, so a row cannot keep it alive).
        A span-only run whose sender the daemon pinned ([otlp] kill_mode = "process") has no
        exception: its own evidence is the events the daemon's receiver MAC'd as it received
        them from that process (watchdog.daemon.otlp.senders), never the row's counters."""
        return (operator_stop(conn, row, self.sealer) or self._exec_gone(conn, row)
                or self.breach(conn, row, now, skip_clock=skip_clock) is not None)

    def _exec_gone(self, conn: Connection, row: Any) -> bool:
        if getattr(row, "source", None) != lc.Source.EXEC or self.sealer is None:
            return False
        a = store.load_evidence(conn, row.id)
        if a is None or not self.sealer.identity_ok(a.mac, a.run_id, a.host, a.pid, a.pid_create_time, a.uid,
                                                    a.kill_mode, getattr(a, "cgroup", None)):
            return False
        import psutil  # the daemon's side only

        try:
            proc = psutil.Process(int(a.pid))
            return bool(abs(proc.create_time() - float(a.pid_create_time)) > 0.01
                        or proc.status() == psutil.STATUS_ZOMBIE)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return True
        except (psutil.Error, ValueError, OverflowError):
            return False

    def forget(self, run_id: str) -> None:
        self._folds.pop(run_id, None)


def hold_not_own(conn: Connection, row: Any, *, now: dt.datetime, by: str, facts: RunFacts, budgets: bud.Budgets,
                 sealer: Sealer | None = None, what: str = "") -> None:
    """No signal: the run stays stopped cooperatively (the ladder asks again each tick, and
    signals once the run's own records show a breach). Recorded and alerted once; `what`: what
    was refused, in the daemon's words (watchdog.core.whose)."""
    outcome = f"{NOT_OWN} ({what})" if what else NOT_OWN
    announce(conn, Outcome.of(Say.ESCALATION, AlertKind.NOT_OWN.key(row.id), row.id, f=facts, b=budgets,
                              reason=row.stop_reason, outcome=outcome, failed=True),
             now=now, sealer=sealer, once=True, audit=Audit(Action.SIGNAL_HELD, by, reason=row.stop_reason,
                                                            outcome=outcome))
