"""What the command is given: the run, the store and the socket, and OTLP when the daemon listens.

Pure: the parent's environment and the facts in, the child's environment out. The SDK inside
joins the run as its child through AGENT_WATCHDOG_RUN; OTel-instrumented code exports into the
daemon's receiver with the run id as a resource attribute.
"""

from __future__ import annotations

from collections.abc import Mapping

from watchdog.core.config import ENV_CONFIG, ENV_DB

ENV_RUN = "AGENT_WATCHDOG_RUN"
ENV_SOCKET = "AGENT_WATCHDOG_SOCKET"
OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
OTEL_RESOURCE = "OTEL_RESOURCE_ATTRIBUTES"
OTEL_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
OTEL_TRACES_HEADERS = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
OTEL_LOGS_ENDPOINT = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"
OTEL_LOGS_PROTOCOL = "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"
OTEL_LOGS_HEADERS = "OTEL_EXPORTER_OTLP_LOGS_HEADERS"
OTEL_GENERAL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
# process.pid in the resource: the Python SDK detects it only when asked (kill_mode = "process").
OTEL_DETECTORS = "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"
RUN_ATTRIBUTE = "agent_watchdog.run_id"
# Spans are exported when they end, by default in batches every 5 s; 200 ms keeps a runaway's
# tool calls counted within a tick or two (an environment variable: no code in the agent).
SCHEDULE_DELAY_MS = "200"


def otlp_endpoint(listen: str) -> str | None:
    """The traces URL for `[otlp] listen` ("host:port"); a wildcard host is reached on loopback."""
    listen = (listen or "").strip()
    if not listen:
        return None
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1/traces"


def otlp_listen(config) -> str:
    """`[otlp] listen` of a config (or of the raw config a daemon published in the store), read
    defensively: the table may not exist in this build."""
    otlp = config.get("otlp") if isinstance(config, Mapping) else getattr(config, "otlp", None)
    listen = getattr(otlp, "listen", None) if otlp is not None else None
    if listen is None and isinstance(otlp, Mapping):
        listen = otlp.get("listen")
    return listen if isinstance(listen, str) else ""


def command_env(parent: Mapping[str, str], *, run_id: str, db_url: str, socket: str, config_path: str | None,
                otlp_listen_at: str = "", otlp_token: str | None = None) -> dict[str, str]:
    env = dict(parent)
    env[ENV_RUN] = run_id
    env[ENV_DB] = db_url
    env[ENV_SOCKET] = socket
    if config_path:
        env[ENV_CONFIG] = config_path
    endpoint = otlp_endpoint(otlp_listen_at)
    if endpoint is not None:
        env.update(otlp_env(env, run_id=run_id, endpoint=endpoint, token=otlp_token))
    return env


def otlp_env(env: Mapping[str, str], *, run_id: str, endpoint: str, token: str | None) -> dict[str, str]:
    """The OTel variables that make the command's exporter send its spans to the daemon's
    receiver for run `run_id` (what to set over `env`): the traces endpoint and protocol, the
    run's id as a resource attribute, and the run's own bearer token in the traces headers
    (merged with the headers the command already has; the general headers are left alone, so
    it never goes to another collector the command's metrics are sent to), and in the logs
    headers when the command's logs go to the receiver (below)."""
    out = {OTEL_ENDPOINT: endpoint, OTEL_PROTOCOL: "http/protobuf"}
    if OTEL_DELAY not in env:
        out[OTEL_DELAY] = SCHEDULE_DELAY_MS
    if OTEL_DETECTORS not in env:
        out[OTEL_DETECTORS] = "process"
    # The run's id, whatever the agent's own attributes say (ours is appended last: the
    # OTel SDKs let a later key win). Anything claiming it is still checked by the kernel.
    attrs = [a for a in env.get(OTEL_RESOURCE, "").split(",")
             if a.strip() and a.split("=", 1)[0].strip() != RUN_ATTRIBUTE]
    out[OTEL_RESOURCE] = ",".join([*attrs, f"{RUN_ATTRIBUTE}={run_id}"])
    if token:
        out[OTEL_TRACES_HEADERS] = _with_token(env.get(OTEL_TRACES_HEADERS, env.get(OTEL_HEADERS, "")), token)
        # Log events (a coding CLI's, watchdog.daemon.otlp.logs) go to the receiver with the same
        # token when the command sends its logs nowhere else: no logs endpoint of its own (the
        # default is a local collector's port) or the receiver's own. A logs endpoint elsewhere
        # keeps its headers: the run's token never reaches another collector.
        logs_url = endpoint.rsplit("/v1/traces", 1)[0] + "/v1/logs"
        theirs = env.get(OTEL_LOGS_ENDPOINT) or (
            env[OTEL_GENERAL_ENDPOINT].rstrip("/") + "/v1/logs" if env.get(OTEL_GENERAL_ENDPOINT) else None)
        if theirs is None or theirs == logs_url:
            out[OTEL_LOGS_ENDPOINT] = logs_url
            if OTEL_LOGS_PROTOCOL not in env:
                out[OTEL_LOGS_PROTOCOL] = "http/protobuf"
            out[OTEL_LOGS_HEADERS] = _with_token(env.get(OTEL_LOGS_HEADERS, env.get(OTEL_HEADERS, "")), token)
    return out


def _with_token(have: str, token: str) -> str:
    """The command's headers (the signal's own win over the general ones in every SDK: start from
    whichever is set) with its Authorization replaced by the run's token."""
    kept = [h for h in have.split(",") if h.strip() and h.split("=", 1)[0].strip().lower() != "authorization"]
    return ",".join([*kept, f"Authorization=Bearer%20{token}"])
