"""The OTLP/HTTP receiver: `POST /v1/traces` (and `/v1/logs`, watchdog.daemon.otlp.logs) on
`[otlp] listen`, threads of the daemon's process.

A small stdlib HTTP server, apart from the tick: it never blocks nor kills it (its store
writes are short transactions of their own; its failures are answered and logged, never
raised into the daemon). One gate in front of every route (`_Handler._admit`): the sender's
identity (watchdog.daemon.otlp.auth; 401 without a known bearer token unless `[otlp]
allow_anonymous`), then the route reads its body.

Bounded, so that one user's misbehaviour never keeps another's exports out: at most
MAX_CONCURRENT connections in all and PER_SENDER_MAX per sender (the socket's owner uid as
the kernel lists it, else the peer's address) are served at once (others get 503 with
Retry-After, as OTLP clients expect); a request's line and headers must arrive within
HEADERS_DEADLINE_S and its body within REQUEST_DEADLINE_S (a peer trickling bytes is cut off
when its deadline passes, whatever its pace), each socket operation times out after
IO_TIMEOUT_S; bodies are read up to `[otlp] max_request_bytes` (Content-Length or chunked;
gzip counted after decompression) and answered 413 above it. Bad bodies get 400 with the OTLP
error body, a sender starting more runs than `[otlp] max_new_runs_per_min` gets 429.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from watchdog.core.config import Config
from watchdog.core.seal import Sealer
from watchdog.daemon.otlp import decode, logruns, logs, mapping, sender
from watchdog.daemon.otlp.auth import Authenticator, Identity
from watchdog.daemon.otlp.bodies import REQUEST_DEADLINE_S, BadFraming as _BadFraming, BodyReader, TooSlow as _TooSlow
from watchdog.daemon.otlp.connections import HEADERS_DEADLINE_S, Server
from watchdog.daemon.otlp.ingest import Receiver
from watchdog.errors import ConfigError
from watchdog.store.engine import Engine, row_locked, store_unavailable

log = logging.getLogger("watchdog.otlp")

PATH = "/v1/traces"
ROUTES = {PATH: "_traces", logs.PATH: "_logs"}  # path -> the handler's method, each behind the same gate (_admit)
IO_TIMEOUT_S = 10.0
IDLE_EVERY_S = 0.5  # held log events are looked at this often
REFUSED_LOG_EVERY_S = 60.0  # one receiver log line per refused sender this often
MAX_SPANS_PER_REQUEST = 10_000
LISTEN_KEY = "[otlp] listen"


class _Handler(BodyReader, BaseHTTPRequestHandler):
    server_version = "agent-watchdog-otlp"
    protocol_version = "HTTP/1.1"
    timeout = IO_TIMEOUT_S  # per socket operation: a silent peer is dropped

    def log_message(self, fmt: str, *args: object) -> None:  # the daemon's log, not stderr; quiet when healthy
        log.debug("otlp %s: " + fmt, self.address_string(), *args)

    def _peer(self) -> sender.Peer:
        """The kernel's view of this connection's peer (looked up once, when it was accepted)."""
        cached = getattr(self, "_kernel_peer", None)
        if cached is None:
            cached = self.server.peer_of(self.connection)  # type: ignore[attr-defined]
            if cached is None:
                cached = sender.peer(self.client_address, self.connection.getsockname()[:2])
            self._kernel_peer = cached
        return cached

    def handle_one_request(self) -> None:
        srv: Server = self.server  # type: ignore[assignment]
        srv.deadlines.set(self.connection, time.monotonic() + HEADERS_DEADLINE_S)
        try:
            super().handle_one_request()
        finally:
            srv.deadlines.clear(self.connection)

    def do_POST(self) -> None:  # noqa: N802 — http.server's name
        srv: OtlpServer = self.server.owner  # type: ignore[attr-defined]
        self.server.deadlines.set(self.connection, time.monotonic() + REQUEST_DEADLINE_S)  # type: ignore[attr-defined]
        kind = decode.PROTOBUF
        try:
            route = ROUTES.get(self.path.split("?", 1)[0])
            if route is None:
                self._answer(404, kind, decode.error_body(kind, 5, f"not found: POST {PATH} or {logs.PATH}"))
                return
            kind = decode.media_type(self.headers.get("Content-Type"))
            ident = self._admit(srv, kind)
            if ident is not None:
                getattr(self, route)(srv, kind, ident)
        except decode.TooLarge as exc:
            self.close_connection = True
            self._answer(413, kind, decode.error_body(kind, 8, str(exc)))
        except decode.Unsupported as exc:
            self.close_connection = True
            self._answer(415, kind, decode.error_body(kind, 3, str(exc)))
        except (decode.BadRequest, _BadFraming) as exc:
            self.close_connection = True
            self._answer(400, kind, decode.error_body(kind, 3, str(exc)))
        except (_TooSlow, socket.timeout, TimeoutError, ConnectionError):
            self.close_connection = True  # the peer is too slow or gone: no answer is owed
        except Exception as exc:  # noqa: BLE001 — never into the daemon; the client retries on 503
            self.close_connection = True
            if row_locked(exc):  # a run's row held by another session: this request only (bounded wait)
                log.warning("otlp: a run's row is locked by another session; the exporter will retry")
            elif not store_unavailable(exc):
                log.exception("otlp: request failed")
            else:
                log.warning("otlp: the store is unavailable (%s); the exporter will retry", type(exc).__name__)
            try:
                self._answer(503, kind, decode.error_body(kind, 14, "the store is unavailable; retry later"),
                             retry_after=True)
            except OSError:
                pass

    def _admit(self, srv: "OtlpServer", kind: str) -> Identity | None:
        """The gate of every route: the sender's identity, or None once it was answered 401."""
        peer = self._peer()
        ident, why = srv.auth.identify(self.headers.get("Authorization"), peer.uid, peer.address[0])
        if ident is not None:
            return ident
        try:
            self._body(srv.max_bytes)  # read and dropped: the exporter reads our answer, not a reset
        except (decode.TooLarge, decode.BadRequest, _BadFraming, _TooSlow):
            pass
        srv.refused(peer, why)
        self.close_connection = True
        self._answer(401, kind, decode.error_body(kind, 16, f"unauthenticated: {why}; send Authorization: Bearer "
                                                              "<token> (OTEL_EXPORTER_OTLP_HEADERS)"),
                     extra=(("WWW-Authenticate", 'Bearer realm="agent-watchdog"'),))
        return None

    def _logs(self, srv: "OtlpServer", kind: str, ident: Identity) -> None:
        self._traces(srv, kind, ident, logs_route=True)

    def _traces(self, srv: "OtlpServer", kind: str, ident: Identity, logs_route: bool = False) -> None:
        body = self._body(srv.max_bytes)
        self.server.deadlines.clear(self.connection)  # type: ignore[attr-defined]  # ours is the time from here
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding == "gzip":
            body = decode.gunzip(body, srv.max_bytes)
        elif encoding not in ("identity", ""):
            raise decode.Unsupported(f"Content-Encoding {encoding!r}: expected gzip or none")
        if logs_route:  # the coding CLIs' log events: the traces' rules, and the sender's hook run (logruns)
            records, dropped = logs.decode_logs(body, kind, MAX_SPANS_PER_REQUEST)
            outcome = srv.logs.ingest(logs.sessions(records), self._peer(), ident)
        else:
            resources, dropped = decode.decode(body, kind, MAX_SPANS_PER_REQUEST)
            outcome = srv.receiver.ingest(mapping.groups(resources), self._peer(), ident)
        if dropped:
            outcome.refuse(dropped, f"more than {MAX_SPANS_PER_REQUEST} spans in one request")
        srv.count(outcome.accepted, outcome.rejected)
        if outcome.throttled:  # the exporter backs off and sends again; what was counted is not counted twice
            self._answer(429, kind, decode.error_body(kind, 8, outcome.message), retry_after=True)
            return
        self._answer(200, kind, decode.response(kind, outcome.rejected, outcome.message))

    def _answer(self, code: int, kind: str, body: bytes, retry_after: bool = False,
                extra: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        for name, value in extra:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if retry_after:
            self.send_header("Retry-After", "2")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        body = decode.error_body(decode.JSON, 12, f"use POST {PATH}")
        self.send_response(405)
        self.send_header("Allow", "POST")
        self.send_header("Content-Type", decode.JSON)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class OtlpServer:
    """`[otlp] listen` served in a thread of the daemon; `start()` binds (a ConfigError names the key)."""

    def __init__(self, engine: Engine, config: Config, sealer: Sealer | None, host: str) -> None:
        self.config = config
        self.max_bytes = config.otlp.max_request_bytes
        self.sealer = sealer
        self.auth = Authenticator(config, sealer)  # a bad tokens file: ConfigError (one line, the key)
        self.receiver = Receiver(engine, config, sealer, host)
        self.logs = logruns.LogsReceiver(engine, self.receiver)
        self._refused_at: dict[object, float] = {}
        self._idle_at = 0.0
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self.accepted_spans = 0
        self.rejected_spans = 0
        self.unauthenticated = 0  # requests answered 401
        self._count_lock = threading.Lock()

    def count(self, accepted: int, rejected: int) -> None:
        with self._count_lock:
            self.accepted_spans += accepted
            self.rejected_spans += rejected

    def reload_tokens(self) -> None:
        """Read `[otlp] tokens_file` again (SIGHUP); ConfigError leaves the tokens as they were."""
        self.auth = Authenticator(self.config, self.sealer)
        log.info("otlp: %d bearer token(s) from [otlp] tokens_file", self.auth.tokens)

    def refused(self, peer: sender.Peer, why: str) -> None:
        """One receiver log line per refused sender and minute (a flood of 401s is not a flood of lines)."""
        key = peer.uid if peer.uid is not None else peer.address[0]
        now = time.monotonic()
        with self._count_lock:
            self.unauthenticated += 1
            if now - self._refused_at.get(key, -REFUSED_LOG_EVERY_S) < REFUSED_LOG_EVERY_S:
                return
            if len(self._refused_at) > 10_000:
                self._refused_at.clear()
            self._refused_at[key] = now
        who = f"uid {peer.uid}" if peer.uid is not None else "a non-local peer"
        log.warning("otlp: refused spans from %s:%s (%s): %s (401); give the exporter a token of [otlp] "
                    "tokens_file with OTEL_EXPORTER_OTLP_HEADERS=\"Authorization=Bearer <token>\", or set [otlp] "
                    "allow_anonymous = true", peer.address[0], peer.address[1], who, why)

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.server_address[:2]  # IPv6 adds (flowinfo, scope_id)
        assert isinstance(host, str)  # an AF_INET/AF_INET6 name is text (the stub allows bytes too)
        return host, port

    @property
    def url(self) -> str:
        """The traces URL a local exporter reaches (a wildcard address on loopback)."""
        host, port = self.address
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        return f"http://[{host}]:{port}{PATH}" if ":" in host else f"http://{host}:{port}{PATH}"

    def start(self) -> "OtlpServer":
        listen = self.config.otlp.listen
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._server = Server((host, int(port)), self, family, _Handler)
        except OSError as exc:
            raise ConfigError(f"{LISTEN_KEY} = {listen!r}: cannot listen there ({exc.strerror or exc}); "
                              "choose a free port or set listen = \"\" to turn the receiver off") from None
        self._server.on_idle = self._idle
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="otlp", daemon=True)
        self._thread.start()
        log.info("receiving OTLP/HTTP spans on http://%s:%d%s", *self.address, PATH)
        return self

    def _idle(self) -> None:
        """Between requests (every poll interval): held log events whose hook run appeared or whose
        hold is over are counted (never raised into the serving loop)."""
        now = time.monotonic()
        if now - self._idle_at < IDLE_EVERY_S:
            return
        self._idle_at = now
        try:
            self.logs.flush()
        except Exception as exc:  # noqa: BLE001 — retried at the next poll
            if not store_unavailable(exc):
                log.exception("otlp: held log events")

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "OtlpServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
