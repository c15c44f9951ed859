"""`agent-watchdog mcp-proxy`: options checked loudly at start, then one of the two transports."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import warnings

from watchdog.core.config import ENV_CONFIG
from watchdog.core.lifecycle import AGENT_MAX_CHARS, RUN_ID_MAX_CHARS, validate_name
from watchdog.errors import ConfigError

ENV_RUN = "AGENT_WATCHDOG_RUN"
EXIT_USAGE = 2
EXIT_NOT_FOUND = 127  # as a shell (and exec) says of a command it cannot find


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen: expected HOST:PORT such as 127.0.0.1:8931, got {value!r}")
    return host.strip("[]"), int(port)


def _first(group: BaseExceptionGroup) -> BaseException:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    return leaf


def _require_run(wd, run_id: str, db_url: str) -> None:
    """A --run that names no run, or a login that may not witness it (PostgreSQL: not in the
    gateway's role), is a mistake to say at start (every call would be refused, or recorded
    nowhere); a store that cannot answer now is an outage: the proxy starts and fails open."""
    from watchdog.store import joined
    from watchdog.store.access import missing_gateway_grants
    from watchdog.store.engine import gateway_misconfiguration

    missing = missing_gateway_grants(wd.engine)
    if missing is not None:  # every call of the run would pass unrecorded: the operator's to fix now
        wd.close()
        raise ConfigError(f"--run: {missing}")
    try:
        state = joined.run_status(wd.engine, run_id)
    except Exception as exc:  # noqa: BLE001
        wrong = gateway_misconfiguration(exc, db_url)
        if wrong is not None:
            wd.close()
            raise ConfigError(f"--run: {wrong}") from None
        logging.getLogger("watchdog.gateways.mcp").warning(
            "agent-watchdog mcp-proxy: cannot check run %s now (%s); starting anyway", run_id[:8], type(exc).__name__)
        return
    if state is None:
        wd.close()
        raise ConfigError(f"--run: the store has no run {run_id!r} (start it first, or leave --run and "
                          f"$AGENT_WATCHDOG_RUN unset for the proxy's own runs)")


def run_proxy(*, db_url: str, config_path: str | None, agent: str | None, run_id: str | None,
              upstream: str | None, listen: str | None, command: list[str]) -> int:
    """Serve until the client (stdio) or a signal ends it; the exit status."""
    try:
        import anyio
        import mcp  # noqa: F401 — only: is the extra installed?
    except ImportError:
        raise ConfigError("mcp-proxy needs the `mcp` extra: pip install 'agent-watchdog-daemon[mcp]'") from None
    from watchdog.gateways.mcp.serve import serve_http, serve_stdio
    from watchdog.gateways.mcp.witness import ToolWitness
    from watchdog.sdk.client import Watchdog
    from watchdog.store.engine import GATEWAY_LOCK_TIMEOUT_MS, GATEWAY_ROLE

    if upstream and command:
        raise ConfigError("mcp-proxy: give either --upstream URL or -- SERVER_COMMAND, not both")
    if not upstream and not command:
        raise ConfigError("mcp-proxy: give the server to wrap: -- SERVER_COMMAND [ARGS...] (stdio) or --upstream URL")
    if listen and not upstream:
        raise ConfigError("mcp-proxy: --listen goes with --upstream URL (streamable HTTP)")
    if upstream and not upstream.startswith(("http://", "https://")):
        raise ConfigError(f"--upstream: expected an http(s) URL such as http://127.0.0.1:8000/mcp, got {upstream!r}")
    host, port = parse_listen(listen or "127.0.0.1:8931")
    if command and shutil.which(command[0]) is None:
        print(f"agent-watchdog: error: mcp-proxy: the server command {command[0]!r} is not found or not executable",
              file=sys.stderr)
        return EXIT_NOT_FOUND
    if agent is not None:
        validate_name("--agent", agent, AGENT_MAX_CHARS)
    run_id = run_id or os.environ.get(ENV_RUN) or None
    if run_id is not None:
        validate_name("--run", run_id, RUN_ID_MAX_CHARS)
    if config_path:
        os.environ[ENV_CONFIG] = config_path  # the SDK reads its config from there
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    # The SDK says an outage both in its log and as a Python warning (for an agent's developer);
    # in the proxy's own process the log line is enough.
    warnings.simplefilter("ignore", RuntimeWarning)
    # A witness outside the agent's process: never attested; it never waits long on a row another
    # login holds (GATEWAY_LOCK_TIMEOUT_MS: such a call is refused, see ToolWitness.admit).
    wd = Watchdog(db_url, attest_socket="", lock_timeout_ms=GATEWAY_LOCK_TIMEOUT_MS)
    wd.store_role = GATEWAY_ROLE
    if run_id is not None:
        _require_run(wd, run_id, db_url)
    try:
        def witnesses(tag: str | None) -> ToolWitness:
            return ToolWitness(wd, agent=agent, run_id=run_id, tag=tag)

        try:
            if upstream:
                print(f"agent-watchdog mcp-proxy: http://{host}:{port}/mcp -> {upstream}", file=sys.stderr,
                      flush=True)
                anyio.run(serve_http, witnesses, upstream, host, port)
            else:
                anyio.run(serve_stdio, witnesses, command[0], list(command[1:]))
        except BaseExceptionGroup as group:  # anyio's task groups wrap the one error that ended them
            raise _first(group) from None
    finally:
        wd.close()
    return 0
