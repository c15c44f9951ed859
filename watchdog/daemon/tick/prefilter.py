"""Which active runs may need the tick's full evaluation: the pre-filter over light rows.

At 10,000 active runs most are healthy and must cost almost nothing: this pass reads
only the light row (watchdog.daemon.trust.scan.LIGHT) and compares it with the run's effective
budgets, memoised per (agent, own budgets). It returns a superset of the runs the tick
acts on, never fewer; the policies still decide, on the whole row. A light row that is
malformed becomes a Defect (this run only; quarantine.py reports it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import BUDGETS, RUN_BUDGET_KEYS, effective
from watchdog.core.config import Config
from watchdog.core.deadlines import Deadline, Why
from watchdog.daemon.trust.scan import Defect, L, MEASURES, OWN_BUDGETS, RATE_WINDOW_S, RunStats
from watchdog.daemon.trust.quarantine import FUTURE_S, MAX_AGE_S, light_defect

if TYPE_CHECKING:
    from watchdog.daemon.money.moneytick import LiveSpend

# The pre-filter's clock checks fire this much early: the database's epoch seconds are
# floats, the policies compare datetimes; early only costs one full evaluation.
SLACK_S = 1.0


class PreFilter:
    def __init__(self, config: Config):
        self.config = config
        self._budget_memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def limits_of(self, r: Sequence[Any], raised: bool = False, defaults: bool = False) -> tuple[Any, ...]:
        """(budgets, [(light index, limit) of each counter budget], age limit, silence limit,
        identical-calls limit, rate limit), memoised per (agent, own budgets). `raised`: a sealed
        operator resume raised them (the row's `resumes` alone is a claim, issue 20)."""
        key = (None if defaults else r[L["agent"]], bool(raised), *r[OWN_BUDGETS])
        memo = self._budget_memo.get(key)
        if memo is None:
            prof = self.config.defaults if defaults else self.config.profile(key[0])
            b = effective(prof, dict(zip(RUN_BUDGET_KEYS, key[2:])), raised=key[1])
            counters = [(L[x.measure], getattr(b, x.key)) for x in BUDGETS if x.measure in MEASURES]
            limit = {x.measure: getattr(b, x.key) for x in BUDGETS}
            memo = (b, counters, limit["age_s"] - SLACK_S, limit["silent_s"] - SLACK_S, limit["identical_calls"],
                    limit["calls_last_min"], bool(getattr(prof, "owners", ())))
            if len(self._budget_memo) > 10_000:
                self._budget_memo.clear()
            self._budget_memo[key] = memo
        return memo

    def due(self, light: Sequence[Any], now: dt.datetime, live: set[int] | None, spend: LiveSpend | None = None, *,
            stats: Mapping[str, RunStats], host: str, judged: Collection[str] | None,
            resume_seen: Collection[tuple[str, int]], skip_clock: bool, defects: list[Defect],
            evidence: Mapping[str, Any] | None = None, first: Mapping[str, float] | None = None,
            new_seen: list[tuple[str, float, Any]] | None = None,
            raised: Callable[[str, int, tuple[Any, ...]], bool] | None = None,
            owner_ok: Callable[[str], bool | None] | None = None,
            wake: dict[str, Deadline] | None = None, costs: dict[str, float] | None = None,
            spend_as: Callable[[str, str], str | None] | None = None) -> list[str]:
        """Ids of the runs `_one` might act on: a superset of them, never fewer.

        A healthy running run is skipped without building a row, a snapshot or facts:
        the checks below are the budgets' own comparisons (the clock ones SLACK_S early)
        and `_gone`'s conditions. The policies still decide, on the whole row.
        `spend` (watchdog.daemon.money.moneytick.LiveSpend): this same pass over every active run sums
        their live cost per agent and label budget, for the period budgets.
        issue 20: `evidence` (run id -> the daemon's own counters, watchdog.daemon.trust.scan) and
        `first` (run id -> first sight, epoch s; runs seen now are appended to `new_seen`): a run
        is judged by the larger counters and its age from its first sight at the latest.
        `raised`: (run id, resumes, own budgets) -> a sealed operator resume raised its budgets;
        `owner_ok`: run id -> its owner may use its profile (None: not checked yet: due);
        `spend_as` (None: no profile names `owners`): the name a run's spend counts under
        (watchdog.daemon.trust.trust; another than its agent's: no label budget either).
        issue 25, for the incremental tick (watchdog.daemon.tick.activeset): `wake` gets each judged
        running run's next clock deadline (when its wall clock or its silence will make it due:
        the same comparisons, solved for the time), `costs` each run's live cost as summed here.

        One loop, its locals bound once: at 10,000 active runs every attribute lookup and
        call per run shows in the tick; the rare paths (a run first seen, a profile with
        `owners`) are the helpers below.
        """
        now_s = now.timestamp()
        horizon = now - dt.timedelta(seconds=RATE_WINDOW_S)
        recheck_s = 2 * self.config.daemon.tick_s - SLACK_S
        my_host = host
        i_id, i_status, i_host, i_pid, i_ctime = L["id"], L["status"], L["host"], L["pid"], L["pid_create_time"]
        i_started, i_seen, i_agent = L["started_s"], L["seen_s"], L["agent"]
        i_cost, i_resumes = L["cost_eur"], L["resumes"]
        i_steps, i_calls, i_tokens = L["steps"], L["tool_calls"], L["tokens"]
        per_agent, labelled, new, covered_get, unknown = _spend_sinks(spend, light)
        first_get = (first if first is not None else _NOTHING).get
        due: list[str] = []
        tallies = evidence if evidence is not None else _NOTHING
        for r in light:
            rid = r[i_id]
            seen_first = first_get(rid)
            if seen_first is None:  # first seen now (rare): remembered from now
                seen_first = _first_sight(r, now_s, first, new_seen)
            try:
                # What the comparisons below cannot see by themselves: a NaN or negative counter,
                # a non-finite or absurd timestamp all compare as "under budget" (fail closed).
                # Text or NULL where a number belongs raises: the except below, for this run only.
                cost, seen_s = r[i_cost], r[i_seen]
                age_s, silent_s = now_s - r[i_started], now_s - seen_s
                if not (cost >= 0 and r[i_steps] >= 0 and r[i_calls] >= 0 and r[i_tokens] >= 0
                        and -FUTURE_S < age_s < MAX_AGE_S and -FUTURE_S < silent_s < MAX_AGE_S
                        and rid.__class__ is str and "\ufffd" not in r[i_agent]):  # see store.engine
                    raise ValueError("malformed")
                if seen_first is not None and now_s - seen_first > age_s:
                    age_s = now_s - seen_first  # the wall clock runs from first sight at the latest
                tally = tallies.get(rid)
                if tally is not None and tally.values[4] > cost:
                    cost = tally.values[4]  # the period budgets count what its events show it spent
                if costs is not None:
                    costs[rid] = cost
                if per_agent is not None and spend_as is not None and (
                        key := spend_as(rid, r[i_agent])) != r[i_agent]:
                    if key is not None:  # (None: its owner not checked: counted once it is)
                        per_agent[key] += cost  # booked under its own owner: no agent's, no label budget
                elif per_agent is not None:
                    per_agent[r[i_agent]] += cost
                    scopes = covered_get(rid, unknown)
                    if scopes is None:  # first seen: its labels are read once (LiveSpend.new)
                        new.append((rid, cost))
                    else:
                        for scope in scopes:
                            labelled[scope] += cost
                if judged is not None and r[i_host] not in judged:
                    continue  # another host's run: its own daemon judges it (only its spend counted here)
                if r[i_status] != lc.RUNNING or (r[i_resumes] and (rid, r[i_resumes]) not in resume_seen):
                    due.append(rid)  # not running, or resumed and its resume not alerted yet
                    continue
                if tally is not None:
                    v = tally.values
                    # (cost: a float summed in another order may differ in its last digits)
                    if (v[0] > r[i_steps] or v[1] > r[i_calls] or v[3] > r[i_tokens]
                            or v[4] > r[i_cost] * (1 + 1e-9) + 1e-9):
                        due.append(rid)  # its row shows less than its events: judged whole, by the larger
                        continue
                up = raised(rid, r[i_resumes], r[OWN_BUDGETS]) if (raised is not None and r[i_resumes]) else False
                limits = self.limits_of(r, up)
                # A profile with `owners` (rare), or a run whose owner was found not to bind it
                # (an anonymous OTLP sender's: [defaults], whatever its profile says).
                if owner_ok is not None and (limits[6] or owner_ok(rid) is False):
                    owned = self._owner_limits(r, up, owner_ok(rid))
                    if owned is None:  # not checked yet: checked on the whole row once
                        due.append(rid)
                        continue
                    limits = owned
                _b, counters, age_limit, silence_limit, identical_limit, rate_limit, _bound = limits
                if wake is not None:  # due once age_s > age_limit or silent_s > silence_limit
                    wall_s, quiet_s = now_s + age_limit - age_s, now_s + silence_limit - silent_s
                    wake[rid] = (Deadline(wall_s, Why.WALL_CLOCK) if wall_s <= quiet_s
                                 else Deadline(quiet_s, Why.SILENCE))
                over = not skip_clock and (age_s > age_limit or silent_s > silence_limit)
                for i, limit in counters:  # a plain loop: any(generator) costs twice as much per run
                    if over or r[i] > limit:
                        over = True
                        break
                st = stats.get(rid)
                if over or (st is not None and (st.max_signature >= identical_limit
                                                or st.recent_upper_bound(horizon) > rate_limit)):
                    due.append(rid)
                    continue
                host, pid, ctime = r[i_host], r[i_pid], r[i_ctime]
                if (live is not None and host == my_host and pid and ctime is not None
                        and (pid not in live or now_s - seen_s >= recheck_s)):
                    due.append(rid)
            except Exception:  # noqa: BLE001 — a malformed row costs only itself (quarantine.py)
                defects.append(Defect(rid if isinstance(rid, str) else None, light_defect(r, now_s)))
        return due

    def _owner_limits(self, r: Sequence[Any], up: bool, ok: bool | None) -> tuple[Any, ...] | None:
        """A run whose profile names its `owners`: None while its owner is not checked yet (due);
        the [defaults]' limits when its owner may not use the profile, else the profile's."""
        if ok is None:
            return None
        return self.limits_of(r, up) if ok else self.limits_of(r, up, defaults=True)


_NOTHING: dict[Any, Any] = {}  # stands in for a map not given: every lookup misses


def _first_sight(r: Sequence[Any], now_s: float, first: Mapping[str, float] | None,
                 new_seen: list[tuple[str, float, Any]] | None) -> float | None:
    """A run the daemon sees for the first time: its first sight is now (None: not tracked)."""
    rid = r[L["id"]]
    if first is None or new_seen is None or rid.__class__ is not str:
        return None
    new_seen.append((rid, now_s, r[L["parent_id"]]))
    return now_s


def _spend_sinks(spend: LiveSpend | None, light: Sequence[Any]) -> tuple[Any, Any, Any, Any, Any]:
    """Where the pass adds each run's live cost: (per agent, per label budget, runs first seen,
    the lookup of a run's label budgets, what it returns for a run whose labels are unknown).
    Without [[budgets]] every run is covered by none: the lookup always answers ()."""
    if spend is None:
        return None, None, None, _NOTHING.get, ()
    spend.light = light
    if spend.covered is None:
        return spend.per_agent, spend.labelled, spend.new, _NOTHING.get, ()
    return spend.per_agent, spend.labelled, spend.new, spend.covered.get, None
