"""`agent-watchdog web`: the read-only web view (watchdog.web), on 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import click

from watchdog.cli.app import fail_cleanly, main, pass_app, shared_options


@main.command("web")
@click.option("--listen", default="127.0.0.1:8765", show_default=True, metavar="HOST:PORT",
              help="Where to serve (loopback by default: put a reverse proxy with authentication in front, docs/howto/web.md).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A Host header to accept besides the listen address (the reverse proxy's name); repeatable.")
@shared_options
@pass_app
@fail_cleanly
def web_cmd(app, listen, allowed_hosts):
    """Read-only web view: runs, one run with its timeline, period budgets, postmortems, JSON under /api/."""
    import logging
    import signal

    from watchdog.web.server import make

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = make(app.db_url, app.config, config_from_file=bool(app.config_path), listen=listen,
                  allowed_hosts=tuple(allowed_hosts))
    host, port = server.bound()
    click.echo(f"agent-watchdog web: serving http://{host}:{port}/ (read-only; ctrl-c to stop)", err=True)

    def stop(_signum, _frame):  # SIGTERM (systemd, a supervisor): leave as on ctrl-c, exit 0
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
