"""The SQL of one run and its ancestors, for the SDK: its records' roll-up into its parents,
the status it obeys (its own and its ancestors'), the keep-alive and budget read-back of a
paused run, the pause a guard writes, a partial result, the in-flight status poll.

Rendered once per run (the lineage is fixed when the run opens); statuses come from the
lifecycle, never spelled here.
"""

from __future__ import annotations

from watchdog.core import budgets as bud
from watchdog.core import lifecycle as lc

_STOPPED = ", ".join(f"'{s}'" for s in (lc.STOPPING, lc.KILLED, lc.LOST))
# The status a child's records see first: a stop anywhere in its lineage, then a pause, then its own.
_RANK = f"CASE WHEN status IN ({_STOPPED}) THEN 0 WHEN status = '{lc.PAUSED}' THEN 1 ELSE 2 END"
_HELD = f"'{lc.RUNNING}', '{lc.PAUSED}'"


class Lineage:
    """The SQL of one run and its ancestors (none for a top-level run), rendered once."""

    def __init__(self, dialect, run_id: str, ancestors: tuple[str, ...] = ()):
        self.run_id = run_id
        self.ancestors = tuple(ancestors)
        ph, greatest = dialect.ph, dialect.greatest
        ids = (run_id, *self.ancestors)
        self.ids = ids
        in_ids = ", ".join([ph] * len(ids))
        self.status_sql = (f"SELECT status, stop_reason, stop_detail, id FROM runs WHERE id IN ({in_ids}) "
                           f"ORDER BY {_RANK}, CASE WHEN id = {ph} THEN 0 ELSE 1 END LIMIT 1")
        self.status_params = (*ids, run_id)
        # Keep-alive while held: the run and its ancestors (a parent waits on its paused child).
        clock = dialect.clock_ph  # the store's clock (watchdog.store.dialects)
        self.beat_sql = (f"UPDATE runs SET last_seen_at = {greatest}(last_seen_at, {clock}) "
                         f"WHERE id IN ({in_ids}) AND status IN ({_HELD})")
        if self.ancestors:
            up = ", ".join([ph] * len(self.ancestors))
            self.rollup_sql = (
                f"UPDATE runs SET steps = steps + {ph}, tool_calls = tool_calls + {ph}, "
                f"tool_errors = tool_errors + {ph}, tokens_in = tokens_in + {ph}, tokens_out = tokens_out + {ph}, "
                f"cost_eur = cost_eur + {ph}, last_seen_at = {greatest}(last_seen_at, {clock}) WHERE id IN ({up})")
            self.parent_sql = f"UPDATE runs SET parent_id = {ph} WHERE id = {ph}"
        self.budgets_sql = (f"SELECT {', '.join(bud.RUN_BUDGET_KEYS)}, resumes FROM runs WHERE id = {ph}")
        # The guard's pause: running → paused (the daemon records and alerts it); a pause nobody
        # answered, with no daemon to stop it: paused → stopping; a partial result.
        self.pause_sql = (f"UPDATE runs SET status = '{lc.PAUSED}', stop_reason = {ph}, stop_detail = {ph}, "
                          f"paused_at = {clock} WHERE id = {ph} AND status = '{lc.RUNNING}'")
        self.give_up_sql = (f"UPDATE runs SET status = '{lc.STOPPING}', stop_requested_at = {clock} "
                            f"WHERE id = {ph} AND status = '{lc.PAUSED}'")
        self.partial_sql = f"UPDATE runs SET partial = {ph} WHERE id = {ph}"

    def record_statements(self, counts: tuple, at) -> list:
        """What a record adds to the ancestors' rows, then the status the run obeys (`at`:
        Dialect.seen, the store's clock)."""
        out = []
        if self.ancestors:
            out.append((self.rollup_sql, (*counts, at, *self.ancestors)))
        out.append((self.status_sql, self.status_params))
        return out


def poll_sql(dialect, n: int) -> str:
    """The in-flight poll: the status of `n` runs (and ancestors) with a tool running."""
    ph = dialect.ph
    return f"SELECT status, stop_reason, stop_detail, id FROM runs WHERE id IN ({', '.join([ph] * n)})"


PARENT_COLUMNS = ("id", "agent", "status", "parent_id", "steps", "tool_calls", "cost_eur", "tokens_in", "tokens_out",
                  "started_at", "resumes", *bud.RUN_BUDGET_KEYS)


def parent_sql(dialect) -> tuple[tuple[str, ...], str]:
    """(columns, SELECT) of a parent run for a child opening in another process: its status,
    totals, budgets and own parent (the lineage is walked up with it)."""
    ph = dialect.ph
    return PARENT_COLUMNS, f"SELECT {', '.join(PARENT_COLUMNS)} FROM runs WHERE id = {ph}"
