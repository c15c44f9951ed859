"""The tick's read: one snapshot, full or incremental (issue 25).

A full read is the tick as it always was: every active run's light row, the new events, the
pre-filter over all of them. An incremental read (watchdog.daemon.tick.activeset) looks only at the
runs that changed, came due, lost their process or were due last time; the light rows of the
others are the ones the ActiveSet kept. Both end the same way: the whole rows of the runs the
pre-filter says may need something, which the Ticker judges exactly as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from watchdog.core.deadlines import Deadline
from watchdog.daemon.tick.activeset import Scope
from watchdog.daemon.leases.cluster import Role
from watchdog.daemon.trust.lightrow import host_of, run_id
from watchdog.daemon.trust.scan import NewEvent
from watchdog.daemon.tick.tickstate import ThisTick
from watchdog.daemon.tick.toolwatch import ToolCall, ToolWatch
from watchdog.store.engine import Connection
from watchdog.store.shards import Reach

if TYPE_CHECKING:
    from watchdog.daemon.context import TickContext


class TickRead(NamedTuple):
    """What the tick's read found in its one snapshot."""

    light: list[Any]  # every active run's light row (watchdog.store.scan.LIGHT) this daemon reads
    mine: int  # how many of them are on the hosts it judges
    new: list[NewEvent]  # the tool events folded this tick
    due: list[str]  # the runs the pre-filter says may need something
    rows: list[Any]  # their whole rows
    looked: list[str]  # the runs the pre-filter looked at (every active run in a full read)
    wake: dict[str, Deadline]  # their next clock deadlines, from the pre-filter
    full: bool
    # A sharded leader's every-run tool calls (watchdog.daemon.tick.toolwatch), for the circuits and
    # the all-runs tool rate; None: `new` holds every host's (an unsharded leader) or nobody needs them.
    calls: list[ToolCall] | None = None


def scope_of(tk: TickContext, this: ThisTick, role: Role) -> Scope:
    """The leader reads every host's runs (the period budgets sum them all, and their counts per host
    spare the membership a count over every active run); the others their own. A sharded judge
    (watchdog.daemon.leases.shards) reads its Reach: its hosts' runs and its shards' on any host
    (the leader still every host's rows, but folds the events of fewer: _folded), and keeps as
    its own the runs of its Reach."""
    shards = tk.shards
    if shards is not None and shards.active:
        reach = shards.reach(role.hosts)
        return Scope(None if role.leader else reach, reach, tk.prefilter)
    return Scope(None if role.leader else role.hosts, role.hosts, tk.prefilter)


def _folded(scope: Scope, role: Role) -> frozenset[str] | None:
    """Whose events the Scanner folds: those it reads, but a sharded judge's only those of its
    shards and its own host. It reads every run's row (the leader: the period budgets, whose live
    spend of another judge's run is its row's, counters PostgreSQL keeps monotonic; the circuits
    and the tool rate read every run's tool calls narrow, ToolWatch), and the runs of the hosts it
    adopted (no daemon: their stops are cooperative, no signal, so no first signal to confirm by
    its own evidence) are carried out from their rows: a stopping or paused run of another judge's
    shard there is judged on its row's counters, which are the larger on PostgreSQL."""
    judged = scope.judged
    if not isinstance(judged, Reach):
        return scope.hosts
    if role.adopted:
        return Reach(frozenset(judged) - role.adopted.keys(), judged.buckets)
    return judged if scope.hosts is None else scope.hosts


def _watch(tk: TickContext, role: Role, scope: Scope) -> ToolWatch | None:
    """The ToolWatch of a sharded leader (kept while it stays one), else None (and dropped)."""
    if role.leader and scope.hosts is None and isinstance(scope.judged, Reach):
        if tk.toolwatch is None:
            tk.toolwatch = ToolWatch()
    else:
        tk.toolwatch = None
    return tk.toolwatch


def _mine(light: list[Any], scope: Scope) -> list[Any]:
    """The runs read that are this daemon's own (those of the hosts, or the Reach, it judges)."""
    judged = scope.judged
    if scope.hosts is not None or judged is None:
        return light  # (it read only its own)
    if isinstance(judged, Reach):
        return [r for r in light if judged.covers(run_id(r), host_of(r))]
    return [r for r in light if host_of(r) in judged]


def read(tk: TickContext, this: ThisTick, role: Role) -> TickRead:
    """One read snapshot: incremental when the ActiveSet allows it, else full."""
    act, scope = tk.active, scope_of(tk, this, role)
    now_s = this.now.timestamp()
    with tk.read_snapshot() as conn:
        reason = act.full_reason(now_s, scope, this.skip_clock)
        act.valid = False  # until this tick went through (Ticker.tick)
        changed = act.changes(conn, scope) if reason is None else None
        watch = _watch(tk, role, scope)
        if changed is None:
            return _full(tk, conn, this, role, scope, watch)
        return _incremental(tk, conn, this, scope, changed, watch, _folded(scope, role))


def _full(tk: TickContext, conn: Connection, this: ThisTick, role: Role, scope: Scope,
          watch: ToolWatch | None) -> TickRead:
    mt, act = this.money, tk.active
    light = tk.scanner.load_active(conn, scope.hosts)
    # the feed starts from this snapshot: what commits after it is a change
    act.feed.mark(conn, scope.hosts if isinstance(scope.hosts, Reach) else None)
    mine = _mine(light, scope)  # (the leader read all)
    new = _fold_read(tk, conn, mine, scope.hosts, _folded(scope, role))
    calls = watch.read(conn, [rid for rid in map(run_id, light) if rid.__class__ is str]) if watch else None
    wake: dict[str, Deadline] = {}
    costs: dict[str, float] | None = {} if mt is not None else None
    if mt is not None:  # whose each run's spend is (issue 32), before the pass sums it
        tk.trust.check_spend(conn, light)
        act.spend.spend_as = tk.trust.spend_as if tk.trust.bound else None
    due = _prefilter(tk, this, light, this.live, wake, costs)
    if mt is not None:  # unreadable steps: reported with the rest
        tk.scanner.defects.extend(mt.read(conn, _mark(tk, watch), unpriced=_unpriced(tk, watch), ranged=True))
        _took_unpriced(tk, watch)
    rows = tk.scanner.load_rows(conn, due)
    act.rebuild(light, scope, this.now.timestamp(), wake=wake, due=due, costs=costs,
                covered=mt.spend.covered if mt is not None else None)
    tk.trust.flush(act.rows)  # first sights and parent links (issue 20)
    looked = [rid for rid in map(run_id, light) if rid.__class__ is str]
    return TickRead(light, len(mine), new, due, rows, looked, wake, True, calls)


def _fold_read(tk: TickContext, conn: Connection, mine: list[Any], read: frozenset[str] | None,
               folded: frozenset[str] | None) -> list[NewEvent]:
    """A full read's fold: of the runs it judges, those whose events it folds (`folded`, _folded)."""
    of = mine if folded is read or not isinstance(folded, Reach) else [
        r for r in mine if folded.covers(run_id(r), host_of(r))]
    return tk.scanner.fold(conn, list(map(run_id, of)), hosts=folded)


def _fold_changes(tk: TickContext, conn: Connection, folded: frozenset[str] | None) -> list[NewEvent]:
    """An incremental read's fold (an unsharded leader's: `folded` None, every host's events)."""
    act = tk.active
    if act.quiet:  # no run renumbered: no event was written since the last read (an event renumbers its run)
        tk.scanner.touched = set()
        return []
    mine: set[str] = act.mine
    if tk.scanner.high_water is None and isinstance(folded, Reach):  # a cold fold: of those it folds only
        mine = {rid for rid in mine if folded.covers(rid, host_of(act.rows[rid]))}
    return tk.scanner.fold(conn, mine, hosts=folded)


def _incremental(tk: TickContext, conn: Connection, this: ThisTick, scope: Scope, changed: set[str],
                 watch: ToolWatch | None, folded: frozenset[str] | None) -> TickRead:
    mt, act = this.money, tk.active
    new = _fold_changes(tk, conn, folded)
    calls = watch.read(conn, act.rows, quiet=act.quiet) if watch else None
    changed.update(tk.scanner.touched)  # a run with an event folded is looked at, whatever the feed said
    cand = act.candidates(this.now.timestamp(), changed)
    looked = list(map(run_id, cand))
    wake: dict[str, Deadline] = {}
    costs: dict[str, float] | None = {} if mt is not None else None
    if mt is not None:
        tk.trust.check_spend(conn, cand)
        act.spend.spend_as = tk.trust.spend_as if tk.trust.bound else None
    # The processes: their ends come from the ActiveSet's watches, not a check of every local run.
    # The live spend's sums come from the ActiveSet's index (below), not from this pass over a few.
    due = _prefilter(tk, this, cand, None, wake, costs, sums=False)
    listed = set(due)
    due.extend(rid for rid in sorted(act.dead) if rid in act.mine and rid not in listed)
    light = list(act.rows.values())
    if mt is not None:
        covered = mt.spend.covered
        mt.spend.new.extend(act.spend_looked(looked, costs or {}, covered))  # their labels: read below
        act.spend.learn(covered)
        act.spend.fill(mt.spend)  # every run's live cost, not only the few looked at
        mt.spend.light = light
        tk.scanner.defects.extend(mt.read(conn, _mark(tk, watch), quiet=act.quiet, none_ended=act.none_ended,
                                          unpriced=_unpriced(tk, watch)))
        _took_unpriced(tk, watch)
    rows = tk.scanner.load_rows(conn, due)
    tk.trust.flush(act.rows)
    return TickRead(light, len(act.mine), new, due, rows, looked, wake, False, calls)


def _unpriced(tk: TickContext, watch: ToolWatch | None) -> list[int]:
    """The unpriced steps (and unreadable events) the tick read: the fold's, and a sharded leader's
    ToolWatch's of every run (its fold saw only its Reach's)."""
    return tk.scanner.unpriced_ids if watch is None else tk.scanner.unpriced_ids + watch.unpriced_ids


def _took_unpriced(tk: TickContext, watch: ToolWatch | None) -> None:
    tk.scanner.took_unpriced()
    if watch is not None:
        watch.took_unpriced()


def _mark(tk: TickContext, watch: ToolWatch | None) -> int | None:
    """The largest event id the tick saw: every run's (the ToolWatch's) where the fold read a Reach."""
    return watch.high_water if watch is not None else tk.scanner.high_water


def _prefilter(tk: TickContext, this: ThisTick, light: list[Any], live: set[int] | None, wake: dict[str, Deadline],
               costs: dict[str, float] | None, *, sums: bool = True) -> list[str]:
    """`sums`: the pass sums the live spend (LiveSpend) of the runs it reads (a full read: all)."""
    mt, trust = this.money, tk.trust
    return tk.prefilter.due(light, this.now, live, mt.spend if mt is not None and sums else None,
                            stats=tk.scanner.stats, host=tk.killer.host, judged=this.judged,
                            resume_seen=tk.state.resume_seen, skip_clock=this.skip_clock,
                            defects=tk.scanner.defects, evidence=tk.scanner.evidence.tallies,
                            first=trust.first, new_seen=trust.new_seen, raised=trust.raised_key,
                            owner_ok=trust.owner_lookup(), wake=wake, costs=costs,
                            spend_as=trust.spend_as if trust.bound else None)
