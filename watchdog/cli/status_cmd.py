"""`agent-watchdog status`: which daemons watch this store, and whether any is alive (issue 36).

Per host: its pid, when it started, its last tick, whether it leads, its lease, its receivers'
addresses (the attestation socket, OTLP, metrics) and whom it can signal. Exit 1 when no live
daemon watches the store: scripts and monitoring can ask.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

import click

from watchdog.cli.app import emit_json, fail_cleanly, main, pass_app, shared_options


def _ago(t: dt.datetime | None, now: dt.datetime) -> str:
    if t is None:
        return "never"
    s = (now - t).total_seconds()
    when = t.strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{when} ({s:.0f} s ago)" if s >= 0 else f"{when} (in {-s:.0f} s)"


def _record(d: Any, now: dt.datetime) -> dict[str, Any]:
    p = d.published
    signals = p.get("signals") if isinstance(p.get("signals"), dict) else None
    return {
        "host": d.host, "pid": d.pid, "live": d.live, "leader": d.live and d.leader_since is not None,
        "started_at": d.started_at.isoformat(), "last_tick_at": d.last_tick_at.isoformat() if d.last_tick_at else None,
        "lease_expires_at": d.expires_at.isoformat() if d.expires_at else None,
        "leader_since": d.leader_since.isoformat() if d.leader_since else None,
        "socket": p.get("socket"), "otlp": p.get("otlp"), "metrics": p.get("metrics"),
        "allowed_users": p.get("allowed_users"), "signals": signals,
    }


def _signals_text(signals: Any) -> str:
    if not isinstance(signals, dict):
        return "unknown (not published)"
    can, cannot = list(signals.get("can") or []), list(signals.get("cannot") or [])
    if not can and not cannot:
        return "nobody (allowed_users is empty)"
    parts = []
    if can:
        parts.append(f"can signal {', '.join(map(str, can))}")
    if cannot:
        parts.append(f"CANNOT signal {', '.join(map(str, cannot))} (no CAP_KILL)")
    return "; ".join(parts)


def _text(d: Any, rec: dict[str, Any], now: dt.datetime) -> list[str]:
    state = "live" if d.live else "gone"
    role = ", leader" if rec["leader"] else ""
    lines = [f"{d.host}  pid {d.pid}  {state}{role}",
             f"  started    {_ago(d.started_at, now)}",
             f"  last tick  {_ago(d.last_tick_at, now)}",
             f"  lease      {'expires' if d.live else 'expired'} {_ago(d.expires_at, now)}"]
    if d.live:
        lines += [f"  socket     {rec['socket'] or 'unknown'}",
                  f"  otlp       {rec['otlp'] or 'off'}",
                  f"  metrics    {rec['metrics'] or 'off'}",
                  f"  signals    {_signals_text(rec['signals'])}"]
    return lines


@main.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable object.")
@shared_options
@pass_app
@fail_cleanly
def status_cmd(app, as_json):
    """Which daemons watch the store: last tick, leader, lease, receivers; exit 1 if none is alive."""
    from watchdog.store.settings import watchers

    with app.reader() as conn:
        w = watchers(conn)
    records = [_record(d, w.now) for d in w.daemons]
    live = [r for r in records if r["live"]]
    seen = w.last_seen()
    if as_json:
        emit_json({"now": w.now.isoformat(), "live": len(live), "last_seen_at": seen.isoformat() if seen else None,
                   "daemons": records})
    else:
        for d, rec in zip(w.daemons, records):
            click.echo("\n".join(_text(d, rec, w.now)))
        if live:
            click.echo(f"{len(live)} live daemon{'s watch' if len(live) != 1 else ' watches'} this store")
        else:
            since = f"since {_ago(seen, w.now)}" if seen else "ever"
            click.echo(f"no live daemon {since}: nothing judges or stops the runs of this store "
                       "(start one: `agent-watchdog run`, or `systemctl start agent-watchdog`)")
    if not live:
        sys.exit(1)
