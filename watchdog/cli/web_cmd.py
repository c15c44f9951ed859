"""`agent-watchdog web`: the read-only web view (watchdog.web), on 127.0.0.1 unless told otherwise.

Private by default: beyond loopback it serves only with `--auth-file` (bearer tokens, PBKDF2
users). On loopback without `--auth-file` every local user can read every run (the boundary on a
shared host is the Unix user, and a loopback port has none): it starts, as DESIGN.md's
`agent-watchdog web [--listen 127.0.0.1:8765]` promises, and says so loudly unless `--no-auth`
makes that choice explicit.
"""

from __future__ import annotations

import sys

import click

from watchdog.cli.app import fail_cleanly, main, pass_app, shared_options


@main.command("web")
@click.option("--listen", default="127.0.0.1:8765", show_default=True, metavar="HOST:PORT",
              help="Where to serve; beyond loopback only with --auth-file.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A Host header to accept besides the listen address (the reverse proxy's name); repeatable.")
@click.option("--auth-file", type=click.Path(dir_okay=False), metavar="PATH",
              help="Bearer tokens and USER:$pbkdf2-sha256$… lines (not readable by other users); every request "
                   "must carry one (docs/howto/web.md).")
@click.option("--no-auth", is_flag=True,
              help="Serve on loopback without authentication, on purpose (the default on loopback, said as a "
                   "warning): every local user can read every run.")
@click.option("--owner", metavar="WHO",
              help="Show only the runs this owner (PostgreSQL login) wrote, and nothing of the others'.")
@click.option("--hash-password", is_flag=True,
              help="Read a password (prompt, or one line on stdin), print its $pbkdf2-sha256$ hash for "
                   "--auth-file, and exit.")
@shared_options
@pass_app
@fail_cleanly
def web_cmd(app, listen, allowed_hosts, auth_file, no_auth, owner, hash_password):
    """Read-only web view: runs, one run with its timeline, period budgets, postmortems, JSON under /api/."""
    if hash_password:
        _print_hash()
        return
    import logging
    import signal
    from pathlib import Path

    from watchdog.web import auth
    from watchdog.web.server import is_loopback, make, parse_listen

    if auth_file and no_auth:
        raise click.UsageError("give --auth-file or --no-auth, not both")
    if not auth_file and not no_auth and is_loopback(parse_listen(listen)[0]):  # beyond loopback: make() refuses
        click.echo("agent-watchdog web: WARNING: no --auth-file: every local user can read every run "
                   "(give --auth-file FILE, docs/howto/web.md; --no-auth silences this)", err=True)
    try:
        creds = auth.load(Path(auth_file)) if auth_file else None
    except auth.AuthFileError as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = make(app.db_url, app.config, config_from_file=bool(app.config_path), listen=listen,
                  allowed_hosts=tuple(allowed_hosts), auth=creds, owner=owner)
    host, port = server.bound()
    if owner is not None and app.db_url.startswith("sqlite"):
        click.echo(f"agent-watchdog web: --owner on SQLite shows the runs whose owner column is {owner!r}; "
                   "any writer of the file may set it: a filter, not a boundary", err=True)
    who = f"auth: {len(creds)} credential(s) of {auth_file}" if creds else "no auth: every local user can read it"
    scope = f"; owner {owner}" if owner is not None else ""
    click.echo(f"agent-watchdog web: serving http://{host}:{port}/ (read-only; {who}{scope}; ctrl-c to stop)", err=True)

    def stop(_signum, _frame):  # SIGTERM (systemd, a supervisor): leave as on ctrl-c, exit 0
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _print_hash() -> None:
    from watchdog.web.auth import hash_password

    if sys.stdin.isatty():
        password = click.prompt("password", hide_input=True, confirmation_prompt=True, err=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise click.ClickException("an empty password")
    click.echo(hash_password(password))
