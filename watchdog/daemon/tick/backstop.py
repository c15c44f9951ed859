"""The bounds a run keeps when its row cannot be judged: its wall clock from first sight, its process.

A quarantined row (one the tick cannot read or act on: a timestamp that does not parse, a
start 30 days ahead, text where a number belongs) is reported once (quarantine.py); before
issue 20 it was then never judged again, so writing one bad value escaped every budget. Here
it is still stopped once the daemon has watched it for its profile's max_wall_s (the
[defaults]' when its agent cannot be read), and marked lost when its process is gone. The
stop is cooperative: no row that cannot be read leads to a signal.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from watchdog.core import lifecycle as lc
from watchdog.daemon.tick.batch import Batch
from watchdog.daemon.trust.lightrow import Light, LightRow
from watchdog.daemon.trust.trust import first_sight_budget_s
from watchdog.daemon.stops import stopping
from watchdog.daemon.tick.tickstate import ThisTick

if TYPE_CHECKING:
    from watchdog.daemon.context import TickContext

log = logging.getLogger("watchdog.tick")


def backstop(tk: TickContext, this: ThisTick, light: Mapping[str, LightRow], batch: Batch) -> None:
    """For each run the tick could not judge this tick (this.rep.quarantined); `light`: the active
    runs' light rows by id (watchdog.daemon.tick.activeset), so the cost is that of the few bad ones."""
    now, live, rep = this.now, this.live, this.rep
    bad = {rid for rid in rep.quarantined if isinstance(rid, str)}
    if not bad:
        return
    now_s = now.timestamp()
    done = tk.state.backstopped
    for rid in sorted(bad):
        row = light.get(rid)
        if row is None or rid in done:
            continue
        r = Light(row)
        first = tk.trust.first.get(rid, now_s)
        pid, ctime = r.pid, r.pid_create_time
        gone = (live is not None and r.host == tk.killer.host and isinstance(pid, int) and pid > 0
                and isinstance(ctime, float) and pid not in live)
        short = rid[:8]
        if gone and isinstance(pid, int):  # (gone says it is: for the type)
            with batch.run() as conn:
                if stopping.lose_unreadable(
                        conn, rid, pid=pid, host=tk.killer.host, now=now, by=tk.by, sealer=tk.sealer):
                    rep.lost.append(rid)
            done.add(rid)
            continue
        limit_s = first_sight_budget_s(tk.config, r.agent)
        watched_s = now_s - first
        if watched_s <= limit_s or r.status not in lc.STOPPABLE_STATUSES:
            continue
        detail = f"watched {watched_s:.0f} s > max_wall_s {limit_s:g} s (from the daemon's first sight)"
        with batch.run() as conn:
            if stopping.stop_unreadable(
                    conn, rid, reason=lc.WALL_CLOCK, detail=detail, now=now, by=tk.by, sealer=tk.sealer,
                    outcome="cooperative stop requested (its row cannot be read: it will not be signalled)"):
                rep.stops.append((rid, lc.WALL_CLOCK))
                log.warning("stop requested: quarantined run %s — %s", short, detail)
        done.add(rid)
