"""The OTLP/HTTP receiver: `POST /v1/traces` (and `/v1/logs`, watchdog.daemon.otlp.logs) on
`[otlp] listen`, threads of the daemon's process.

A small stdlib HTTP server, apart from the tick: it never blocks nor kills it (its store
writes are short transactions of their own; its failures are answered and logged, never
raised into the daemon). Bounded: at most MAX_CONCURRENT requests are served at once (others
get 503 with Retry-After, as OTLP clients expect), each peer's socket times out after
IO_TIMEOUT_S of silence and each request must arrive within REQUEST_DEADLINE_S, bodies are
read up to `[otlp] max_request_bytes` (Content-Length or chunked; gzip counted after
decompression) and answered 413 above it. Bad bodies get 400 with the OTLP error body.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from watchdog.core.config import Config
from watchdog.core.seal import Sealer
from watchdog.daemon.otlp import decode, logs, mapping, sender
from watchdog.daemon.otlp.ingest import Receiver
from watchdog.errors import ConfigError
from watchdog.store.engine import Engine, store_unavailable

log = logging.getLogger("watchdog.otlp")

PATH = "/v1/traces"
MAX_CONCURRENT = 16
IO_TIMEOUT_S = 10.0
REQUEST_DEADLINE_S = 30.0
MAX_SPANS_PER_REQUEST = 10_000
DRAIN_MAX_BYTES = 64 * 1024 * 1024  # of a body refused for its size, read and dropped at most
LISTEN_KEY = "[otlp] listen"


class _TooSlow(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    server_version = "agent-watchdog-otlp"
    protocol_version = "HTTP/1.1"
    timeout = IO_TIMEOUT_S  # per socket operation: a silent peer is dropped

    def log_message(self, fmt: str, *args: object) -> None:  # the daemon's log, not stderr; quiet when healthy
        log.debug("otlp %s: " + fmt, self.address_string(), *args)

    def _peer(self) -> sender.Peer:
        cached = getattr(self, "_kernel_peer", None)
        if cached is None:
            cached = self._kernel_peer = sender.peer(self.client_address, self.connection.getsockname()[:2])
        return cached

    def do_POST(self) -> None:  # noqa: N802 — http.server's name
        srv: OtlpServer = self.server.owner  # type: ignore[attr-defined]
        kind = decode.PROTOBUF
        try:
            path = self.path.split("?", 1)[0]
            if path not in (PATH, logs.PATH):
                self._answer(404, kind, decode.error_body(kind, 5, f"not found: POST {PATH} or {logs.PATH}"))
                return
            kind = decode.media_type(self.headers.get("Content-Type"))
            body = self._body(srv.max_bytes)
            encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            if encoding == "gzip":
                body = decode.gunzip(body, srv.max_bytes)
            elif encoding not in ("identity", ""):
                raise decode.Unsupported(f"Content-Encoding {encoding!r}: expected gzip or none")
            if path == logs.PATH:  # the coding CLIs' log events (same limits, same sender rules)
                records, dropped = logs.decode_logs(body, kind, MAX_SPANS_PER_REQUEST)
                outcome = srv.logs.ingest(logs.sessions(records), self._peer())
            else:
                resources, dropped = decode.decode(body, kind, MAX_SPANS_PER_REQUEST)
                outcome = srv.receiver.ingest(mapping.groups(resources), self._peer())
            if dropped:
                outcome.refuse(dropped, f"more than {MAX_SPANS_PER_REQUEST} spans in one request")
            srv.count(outcome.accepted, outcome.rejected)
            self._answer(200, kind, decode.response(kind, outcome.rejected, outcome.message))
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
            if not store_unavailable(exc):
                log.exception("otlp: request failed")
            else:
                log.warning("otlp: the store is unavailable (%s); the exporter will retry", type(exc).__name__)
            try:
                self._answer(503, kind, decode.error_body(kind, 14, "the store is unavailable; retry later"),
                             retry_after=True)
            except OSError:
                pass

    def _answer(self, code: int, kind: str, body: bytes, retry_after: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        if retry_after:
            self.send_header("Retry-After", "2")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    # -- bodies ------------------------------------------------------------------------------

    def _body(self, max_bytes: int) -> bytes:
        deadline = time.monotonic() + REQUEST_DEADLINE_S
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked(max_bytes, deadline)
        length = self.headers.get("Content-Length")
        if length is None:
            raise _BadFraming("a body needs Content-Length or Transfer-Encoding: chunked")
        if not length.strip().isdigit():
            raise _BadFraming("Content-Length: expected a number")
        n = int(length)
        if n > max_bytes:
            self._drain(n, deadline)
            raise decode.TooLarge(f"Content-Length {n} is more than {max_bytes} bytes")
        return self._read(n, deadline)

    def _drain(self, n: int, deadline: float) -> None:
        """Read and drop a refused body (up to DRAIN_MAX_BYTES, within the deadline), so the
        client reads our 413 instead of a connection reset."""
        left = min(n, DRAIN_MAX_BYTES)
        try:
            while left > 0 and time.monotonic() < deadline:
                chunk = self.rfile.read1(min(left, 65536))
                if not chunk:
                    return
                left -= len(chunk)
        except OSError:
            return

    def _read(self, n: int, deadline: float) -> bytes:
        parts, left = [], n
        while left > 0:
            if time.monotonic() > deadline:
                raise _TooSlow()
            chunk = self.rfile.read1(min(left, 65536)) if hasattr(self.rfile, "read1") else self.rfile.read(left)
            if not chunk:
                raise decode.BadRequest(f"the body ended after {n - left} of {n} bytes (truncated)")
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def _chunked(self, max_bytes: int, deadline: float) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            if time.monotonic() > deadline:
                raise _TooSlow()
            line = self.rfile.readline(1024)
            if not line.endswith(b"\n"):
                raise _BadFraming("chunked body: a chunk size line is missing or too long")
            size_txt = line.split(b";", 1)[0].strip()
            try:
                size = int(size_txt, 16)
            except ValueError:
                raise _BadFraming("chunked body: a chunk size is not hex") from None
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = self.rfile.readline(1024)
                    if trailer in (b"\r\n", b"\n", b""):
                        return b"".join(parts)
            total += size
            if total > max_bytes:
                self._drain_chunks(size, deadline)
                raise decode.TooLarge(f"the chunked body is more than {max_bytes} bytes")
            parts.append(self._read(size, deadline))
            if self.rfile.readline(3) not in (b"\r\n", b"\n"):
                raise _BadFraming("chunked body: a chunk does not end with CRLF")

    def _drain_chunks(self, size: int, deadline: float) -> None:
        """Read and drop the rest of a refused chunked body (the current chunk's `size` bytes,
        then whole chunks, up to DRAIN_MAX_BYTES within the deadline), so that an exporter
        still sending (OTel JS sends chunks) reads our 413 instead of a broken pipe."""
        left = DRAIN_MAX_BYTES
        try:
            while left > 0 and time.monotonic() < deadline:
                take = min(size + 2, left)  # the chunk's data and its CRLF
                self._drain(take, deadline)
                left -= take
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    return
                if size == 0:
                    self.rfile.readline(1024)  # the empty line after the last chunk
                    return
        except OSError:
            return

    def do_GET(self) -> None:  # noqa: N802
        body = decode.error_body(decode.JSON, 12, f"use POST {PATH}")
        self.send_response(405)
        self.send_header("Allow", "POST")
        self.send_header("Content-Type", decode.JSON)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _BadFraming(Exception):
    pass


_Request = socket.socket | tuple[bytes, socket.socket]  # socketserver's request: what a server hands a handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], owner: "OtlpServer", family: int) -> None:
        self.address_family = family
        self.owner = owner
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        super().__init__(address, _Handler)

    # The request is the connected socket (a stream server's; the tuple is a datagram server's).
    def process_request(self, request: _Request, client_address: tuple[Any, ...]) -> None:
        if not self._slots.acquire(blocking=False):
            conn = request if isinstance(request, socket.socket) else request[1]
            try:  # busy: the exporter retries after Retry-After
                conn.settimeout(1.0)
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: _Request, client_address: tuple[Any, ...]) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    # A peer's misbehaviour is not the daemon's error.
    def handle_error(self, request: _Request, client_address: tuple[Any, ...]) -> None:
        log.debug("otlp: connection from %s ended badly", client_address, exc_info=True)


class OtlpServer:
    """`[otlp] listen` served in a thread of the daemon; `start()` binds (a ConfigError names the key)."""

    def __init__(self, engine: Engine, config: Config, sealer: Sealer | None, host: str) -> None:
        self.config = config
        self.max_bytes = config.otlp.max_request_bytes
        self.receiver = Receiver(engine, config, sealer, host)
        self.logs = logs.LogsReceiver(engine, host)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.accepted_spans = 0
        self.rejected_spans = 0
        self._count_lock = threading.Lock()

    def count(self, accepted: int, rejected: int) -> None:
        with self._count_lock:
            self.accepted_spans += accepted
            self.rejected_spans += rejected

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.server_address[:2]  # IPv6 adds (flowinfo, scope_id)
        assert isinstance(host, str)  # an AF_INET/AF_INET6 name is text (the stub allows bytes too)
        return host, port

    def start(self) -> "OtlpServer":
        listen = self.config.otlp.listen
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._server = _Server((host, int(port)), self, family)
        except OSError as exc:
            raise ConfigError(f"{LISTEN_KEY} = {listen!r}: cannot listen there ({exc.strerror or exc}); "
                              "choose a free port or set listen = \"\" to turn the receiver off") from None
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="otlp", daemon=True)
        self._thread.start()
        log.info("receiving OTLP/HTTP spans on http://%s:%d%s", *self.address, PATH)
        return self

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
