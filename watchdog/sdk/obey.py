"""What a run obeys on the SDK side: its parent's budgets and status, a stop, a pause held until a human answers.

Child runs on the SDK side: their budgets, their roll-up into the parent, the status they obey.

`run.child(agent="researcher", max_steps=5)` opens a run whose `parent_id` is the
parent's id. Its budgets are its own, never above what the parent has left when it
opens. Each of its records is still one transaction: it also adds the child's steps,
tool calls and spend to every ancestor's row (so the daemon judges a parent on its
totals without reading its children), and reads back the child's status *and* its
ancestors': a paused parent holds its children, a stopped one stops them.

A child in another process opens with `wd.run(..., parent_id=ID)`: its ancestors and
the parent's budgets left are read from the store once, at start.

Holding a paused run: the agent's thread waits at its record until a human answers.

The record that finds its run `paused` (the daemon paused it, or its own guard did)
does not return: its thread waits on a condition, waking once a second to re-read
the run's status (one short SELECT, no busy loop), and keeps the run's `last_seen_at`
fresh so the pause is never mistaken for a hang. `resume` → the run's raised budgets
are read back and the record returns; `kill` or the pause's timeout → RunKilled.

No model or tool call goes through while paused: every record of the run (and of its
child runs, which see their ancestors' status) waits here.

If no daemon answers at all, the SDK stops the run itself a little after
`approval_timeout_s`, with the reason it paused for: a pause never hangs an agent forever.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from watchdog.core import budgets as bud, lifecycle as lc
from watchdog.core.periods import utcnow
from watchdog.errors import RunKilled
from watchdog.store.lineage import parent_run

if TYPE_CHECKING:
    from watchdog.sdk.seams import RunLike, WatchdogLike
    from watchdog.store.lineage import Statement


MAX_DEPTH = 32  # a parent_id chain is never followed further (a cycle written by hand)
# The totals a child spends from its parent: the registry's measure → the Run attribute.
_SPENT = {"steps": "steps", "tool_calls": "tool_calls", "cost_eur": "cost_eur", "age_s": "elapsed_s"}


def obeyed_stop(row: Sequence[Any], run_id: str) -> RunKilled | None:
    """The stop a status row (own or an ancestor's) means for this run, or None."""
    status, reason, detail = row[0], row[1], row[2]
    if status not in (lc.STOPPING, lc.KILLED, lc.LOST):
        return None
    whose = row[3] if len(row) > 3 else run_id
    if whose != run_id:
        return RunKilled(reason or lc.MANUAL, f"its parent run {whose[:8]} was stopped: {detail or reason or ''}")
    return RunKilled(reason or lc.MANUAL, detail or "")


# --- budgets: never above what the parent has left ------------------------------


def left_of(parent_budgets: bud.Budgets, spent: Mapping[str, float]) -> dict[str, float]:
    """Per run budget, what the parent has left (limit - spent) or, for budgets a child does not
    spend from (identical calls, silence), the parent's own limit."""
    out = {}
    for b in bud.RUN_BUDGETS:
        limit = getattr(parent_budgets, b.key)
        out[b.key] = limit - spent[b.measure] if b.measure in spent else limit
    return out


def exhausted(left: Mapping[str, float]) -> tuple[bud.Budget, float] | None:
    for b in bud.RUN_BUDGETS:
        value = left[b.key]
        if (b.integer and value < 1) or value <= 0:
            return b, value
    return None


def clamp(asked: Mapping[str, float], child_profile: bud.Budgets, left: Mapping[str, float]) -> dict[str, float]:
    """The child's own budget columns: what it asked for (else its profile's), at most the parent's left."""
    out = {}
    for b in bud.RUN_BUDGETS:
        want = asked.get(b.key, getattr(child_profile, b.key))
        cap = int(left[b.key]) if b.integer else left[b.key]
        out[b.key] = min(want, cap)
    return out


def no_room(parent: RunLike, left: Mapping[str, float]) -> None:
    """RunKilled (the parent's breach) when the parent has nothing left to give a child."""
    hit = exhausted(left)
    if hit is not None:
        b, value = hit
        raise RunKilled(b.reason, f"no {b.label} left for a child run ({b.key} {b.fmt(getattr(parent.budgets, b.key))}, "
                                  f"left {b.fmt(max(value, 0))})")


def spent_in_process(parent: RunLike) -> dict[str, float]:
    spent = {m: getattr(parent, attr) for m, attr in _SPENT.items()}
    spent["tokens"] = parent.tokens_in + parent.tokens_out
    return spent


def from_store(wd: WatchdogLike, parent_id: str) -> tuple[tuple[str, ...], bud.Budgets, dict[str, float]]:
    """(ancestor ids nearest first, the parent's budgets left) for a child in another process."""
    parent = parent_run(wd.writer, parent_id)
    if parent is None:
        raise ValueError(f"parent_id: no run {parent_id!r} in the store")
    if parent.status not in lc.ACTIVE_STATUSES:
        raise ValueError(f"parent_id: run {parent_id[:8]} already ended ({parent.status}): a child needs a live parent")
    chain = [parent_id]
    up = parent.parent_id
    while up and up not in chain and len(chain) < MAX_DEPTH:
        chain.append(up)
        found = parent_run(wd.writer, up)
        up = found.parent_id if found else None
    budgets = bud.for_run(wd.config().profile(parent.agent), parent.budget_row())
    started = parent.started_at
    age_s = (dt.datetime.now(dt.timezone.utc) - started).total_seconds() if started else 0.0
    spent = {"steps": parent.steps, "tool_calls": parent.tool_calls, "cost_eur": parent.cost_eur, "age_s": age_s,
             "tokens": parent.tokens}
    return tuple(chain), budgets, left_of(budgets, spent)


# -- Holding a paused run: the agent's thread waits at its record until a human answers ----------------------------

log = logging.getLogger("watchdog.client")

POLL_S = 1.0  # how often a held thread re-reads the run's status
BEAT_MAX_S = 30.0  # at most this long between keep-alives (a quarter of heartbeat_timeout_s if shorter)
# Without a daemon the SDK stops a paused run itself this long after approval_timeout_s
# (in daemon ticks, plus a margin): the daemon, when there is one, always answers first.
FALLBACK_TICKS = 3
FALLBACK_MARGIN_S = 5.0


class Hold:
    """The pause gate of one run. Thread-safe: every thread recording on the run may wait here."""

    def __init__(self, run: RunLike) -> None:
        self.run = run
        self.cond = threading.Condition()
        self._beat_at = 0.0

    def wake(self) -> None:
        """Wake the held threads now (a stop seen in this process)."""
        with self.cond:
            self.cond.notify_all()

    def wait(self, row: Sequence[Any]) -> None:
        """Wait while `row` (the run's status, or its ancestor's) says paused. Returns when the
        run may go on, with its budgets re-read; raises RunKilled when it was stopped."""
        run = self.run
        t0 = time.monotonic()
        warned = False
        while True:
            stop = obeyed_stop(row, run.id) or run.stop_requested  # the latter: seen meanwhile by another thread
            if stop is not None:
                run.raise_stop(stop)
            if row[0] != lc.PAUSED:
                self._reload_budgets()
                return
            own = (row[3] if len(row) > 3 else run.id) == run.id
            with self.cond:
                self.cond.wait(POLL_S)
            if run.wd.closed:  # the agent closed its Watchdog: nobody is left to hold for
                row = (lc.STOPPING, row[1], f"{row[2] or ''} (the Watchdog was closed while the run was paused)")
                continue
            self._beat()
            if time.monotonic() - t0 > self._fallback_s():
                if own:
                    self._give_up(row)
                # Held by a paused ancestor nobody answered: this run stops (the ancestor's own
                # holder, or the daemon, stops the ancestor).
                row = (lc.STOPPING, row[1], f"{row[2] or ''} (its parent run {row[3][:8]} stayed paused past "
                                            f"approval_timeout_s)", row[3])
                continue
            try:
                rows = run.wd.writer.query(*run.lineage.status())
            except Exception as exc:  # noqa: BLE001 — the store is down: stay held, a pause is a pause
                if not warned:
                    log.warning("agent-watchdog: run %s is paused and the store is unreachable (%s); "
                                "holding until it answers", run.id[:8], type(exc).__name__)
                    warned = True
                continue
            if not rows:  # the row is gone (deleted by hand): nothing holds the run any more
                return
            row = rows[0]

    def _beat(self) -> None:
        every = min(BEAT_MAX_S, self.run.budgets.heartbeat_timeout_s / 4)
        now = time.monotonic()
        if now - self._beat_at < every:
            return
        self._beat_at = now
        try:
            self.run.wd.writer.transaction([self.run.lineage.beat(utcnow())])
        except Exception:  # noqa: BLE001 — a keep-alive: the next one may get through
            pass

    def _fallback_s(self) -> float:
        tick_s = self.run.wd.config().daemon.tick_s
        return self.run.budgets.approval_timeout_s + FALLBACK_TICKS * tick_s + FALLBACK_MARGIN_S

    def _give_up(self, row: Sequence[Any]) -> None:
        """No daemon answered: stop the run with the reason it paused for."""
        run = self.run
        try:
            run.wd.writer.transaction([run.lineage.give_up(utcnow())])
        except Exception:  # noqa: BLE001 — stopping locally is what matters; the end record is buffered
            pass
        stop = RunKilled(row[1] or lc.MANUAL, f"{row[2] or ''} (nobody answered the pause within "
                                               f"approval_timeout_s {run.budgets.approval_timeout_s:g} s)")
        run.raise_stop(stop)

    def _reload_budgets(self) -> None:
        """A resumed run's raised budgets, read back: the guards hold it to them from now on."""
        run = self.run
        try:
            found = run.lineage.read_budgets(run.wd.writer)
        except Exception:  # noqa: BLE001 — keep the old budgets: the daemon judges by the new ones
            return
        if found is None:
            return
        asked, resumes = found
        run.set_budgets(bud.effective(run.profile, asked, raised=bool(resumes)))


def pause_statements(run: RunLike, stop: RunKilled, now: dt.datetime) -> list[Statement]:
    """running → paused, written by the run's own guard: the status only (the daemon records and
    alerts a pause it did not request), then the status the run must obey."""
    return run.lineage.pause(stop.reason, stop.detail, now)
