#!/usr/bin/env python
"""How many of the project's files one tool call crosses, from the SDK to the delivered alert.

Issue 34 measures the daemon's shape by this walk: an agent records the same tool call until it
loops, one daemon tick stops the run, the agent hears the stop, and the outbox delivers the alert
through apprise to a local webhook. Every module is imported and the store made first, so what is
counted is code that runs for this walk (the functions executed, by their files), not what an
import happens to load. Printed: the files of `watchdog/` that ran, per phase and in all.

It runs on any version of the tree (module paths moved between versions), so the same script
measures before and after:  PYTHONPATH=<checkout> python benchmarks/walk_files.py [--list]
"""

from __future__ import annotations

import argparse
import http.server
import importlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(importlib.import_module("watchdog").__file__ or "").resolve().parent


def first(*names: str) -> Any:
    """The first of `module:attr` that this version has."""
    for name in names:
        mod, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError):
            continue
    raise ImportError(names)


class Hook(http.server.BaseHTTPRequestHandler):
    got: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.got.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def traced(files: set[str]) -> Callable[..., Any]:
    def tracer(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(str(ROOT)):
                files.add(str(Path(path).resolve().relative_to(ROOT.parent)))
        return None
    return tracer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="name the files")
    args = p.parse_args(argv)

    from watchdog import RunKilled, Watchdog
    from watchdog.core.seal import Sealer
    from watchdog.store import access
    from watchdog.store.engine import make_engine
    from watchdog.store.schema import utcnow

    Ticker = first("watchdog.daemon.tick.ticker:Ticker", "watchdog.daemon.ticker:Ticker")
    Killer = first("watchdog.daemon.stops.killer:Killer", "watchdog.daemon.killer:Killer")
    Notifier = first("watchdog.daemon.alerts.notify:Notifier", "watchdog.daemon.notify:Notifier")
    deliver_due = first("watchdog.daemon.alerts.outbox:deliver_due", "watchdog.daemon.outbox:deliver_due")
    from watchdog.core.config import Config

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"json://127.0.0.1:{server.server_address[1]}/"

    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/runs.db"
        engine = make_engine(db)
        access.upgrade(engine)
        os.environ.setdefault("AGENT_WATCHDOG_SOCKET", f"{tmp}/none.sock")
        cfg = Config()
        killer = Killer()
        sealer = Sealer(os.urandom(32), killer.host)
        ticker = Ticker(engine, cfg, killer, sealer=sealer)
        notifier = Notifier([url])
        wd = Watchdog(db)
        ticker.tick(utcnow())  # a first tick: the daemon's own start-up, not the walk

        phases: dict[str, set[str]] = {"sdk": set(), "tick": set(), "stop heard": set(), "alert": set()}
        run = wd.run("walk", kill_mode="cooperative", guards=False).__enter__()
        sys.settrace(traced(phases["sdk"]))
        threading.settrace(traced(phases["sdk"]))
        for _ in range(4):
            run.record_tool("search", {"q": "same"})
        sys.settrace(traced(phases["tick"]))
        report = ticker.tick(utcnow())
        sys.settrace(traced(phases["stop heard"]))
        heard = False
        try:
            run.record_tool("search", {"q": "same"})
        except RunKilled:
            heard = True
        sys.settrace(traced(phases["alert"]))
        deliver_due(engine, notifier, utcnow(), sealer=sealer)
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        try:
            run.__exit__(None, None, None)
        except RunKilled:
            pass
        wd.close()
        server.shutdown()

    every = set().union(*phases.values())
    print(f"stops {report.stops}; stop heard by the SDK: {heard}; alerts delivered: {len(Hook.got)}")
    print("| phase | files of watchdog/ that ran |\n|---|---:|")
    for name, files in phases.items():
        print(f"| {name} | {len(files)} |")
    print(f"| **the whole walk** | **{len(every)}** |")
    if args.list:
        for f in sorted(every):
            print(" ", f)
    return 0 if report.stops and Hook.got else 1


if __name__ == "__main__":
    sys.exit(main())
