"""`agent-watchdog alerts`: the alerts that did not go out (waiting for a retry, or dead letters)."""

from __future__ import annotations

import click

from watchdog.cli.app import emit_json, fail_cleanly, main, pass_app, shared_options
from watchdog.cli.render import cut
from watchdog.core.outcomes import alert_title


def _line(value) -> str:
    # Store text, shown on a terminal: one printable line (no escape sequence, no forged line).
    return alert_title(value) if value is not None else "-"


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if hasattr(value, "strftime") else _line(value)


def table(records: list[dict], more: int, dead_only: bool, targets: bool = True) -> str:
    if not records:
        if dead_only:
            return "no dead letters"
        return ("no alert is waiting: each was delivered to every target" if targets else
                "no alert is waiting, but no [alerts] urls are configured: alerts are only logged by the daemon")
    lines = [f"{'ID':>6} {'STATE':7} {'CREATED (UTC)':19} {'TRIES':>5} TITLE"]
    for r in records:
        tries = r["attempts"] if isinstance(r["attempts"], int) else "?"
        lines.append(f"{r['id']:>6} {r['state']:7} {_when(r['created_at']):19} {tries:>5} {cut(_line(r['title']), 38)}")
        if r["last_error"]:
            lines.append(f"{'':>6} {cut(_line(r['last_error']), 73)}")
    if more:
        lines.append(f"(and {more} more: --limit)")
    return "\n".join(lines)


def _json(r: dict) -> dict:
    out = dict(r)
    for k in ("title", "last_error", "dedupe_key"):
        if out[k] is not None:
            out[k] = _line(out[k])
    return out


def history_table(records: list[dict], more: int) -> str:
    """`alerts --all`: every alert, newest first, with each target's delivery time."""
    if not records:
        return "no alerts yet"
    lines = [f"{'ID':>6} {'STATE':10} {'CREATED (UTC)':19} TITLE"]
    for r in records:
        lines.append(f"{r['id']:>6} {r['state']:10} {_when(r['created_at']):19} {cut(_line(r['title']), 60)}")
        for tid, when in sorted(r.get("targets", {}).items()):
            shown = when.replace("T", " ")[:19] if when not in ("delivered", "dead") else when
            lines.append(f"{'':>6} → target {_line(tid)[:12]}: {shown}")
        if r["state"] in ("waiting", "dead", "summarised", "logged") and r["last_error"]:
            lines.append(f"{'':>6} {cut(_line(r['last_error']), 90)}")
    if more:
        lines.append(f"(and {more} older: --limit)")
    return "\n".join(lines)


@main.command("alerts")
@click.option("--all", "show_all", is_flag=True, help="Every alert, newest first, with each target's delivery time.")
@click.option("--dead", "dead_only", is_flag=True, help="Only the dead letters (never retried).")
@click.option("--limit", type=click.IntRange(1, 100000), default=200, show_default=True, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
@shared_options
@pass_app
@fail_cleanly
def alerts_cmd(app, show_all, dead_only, limit, as_json):
    """The alerts not delivered: waiting for a retry, or dead letters (undeliverable within
    [daemon] alert_expire_s, or rows that could not be read), oldest first; --all: every alert."""
    from watchdog.store.outbox import history, undelivered

    if show_all and dead_only:
        raise click.UsageError("--all and --dead: give one")
    with app.reader() as conn:
        records, more = history(conn, limit=limit) if show_all else undelivered(conn, dead_only=dead_only,
                                                                                  limit=limit)
    if as_json:
        emit_json([_json(r) for r in records])
    elif show_all:
        click.echo(history_table(records, more))
    else:
        configured = bool(app.config.alert_urls or app.config.alert_urls_file)
        click.echo(table(records, more, dead_only, targets=configured))
