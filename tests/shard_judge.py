"""One sharded judge as a process of its own, for tests/system/test_shards_pg.py.

    python tests/shard_judge.py URL FOLDER NAME N_SHARDS HANG_AT

Ticks a real Ticker over the store at URL every TICK_S, its judging confined to the shards its
ShardSet holds; after each tick it writes FOLDER/NAME.json (ticks, held shards, its pid). Once
FOLDER/arm exists and HANG_AT > 0, its HANG_AT-th stop decision after that never returns: the
decision is made in its open transaction, FOLDER/NAME.hung is written, and the process waits to
be killed (a judge dying in the middle of a tick).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_support import config, ticker  # noqa: E402
from watchdog.daemon.leases.shards import ShardSet  # noqa: E402
from watchdog.store import run_rows  # noqa: E402
from watchdog.store.engine import make_engine  # noqa: E402
from watchdog.store.schema import utcnow  # noqa: E402

TICK_S = 0.2


def main() -> None:
    url, folder, name, n_shards, hang_at = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    engine = make_engine(url)
    real = run_rows.request_stop
    armed = {"calls": 0}

    def request_stop(conn, run_id, **kw):
        iid = real(conn, run_id, **kw)
        if iid is not None and hang_at and (folder / "arm").exists():
            armed["calls"] += 1
            if armed["calls"] == hang_at:
                (folder / f"{name}.hung").write_text(run_id)
                while True:
                    time.sleep(60)
        return iid

    run_rows.request_stop = request_stop
    tk = ticker(engine, config(agents={"bot": {"max_steps": 3}}))
    shards = ShardSet(engine, n_shards)
    ticks = 0
    while True:
        shards.before_tick(tk)
        tk.tick(utcnow())
        ticks += 1
        state = {"ticks": ticks, "held": sorted(shards.held), "pid": os.getpid()}
        (folder / f"{name}.json.tmp").write_text(json.dumps(state))
        os.replace(folder / f"{name}.json.tmp", folder / f"{name}.json")
        time.sleep(TICK_S)


if __name__ == "__main__":
    main()
