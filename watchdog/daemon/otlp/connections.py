"""The receiver's connections: slots per sender and in all, and deadlines a trickling peer cannot stretch.

At most MAX_CONCURRENT connections are served at once, and PER_SENDER_MAX per sender (the
socket's owner uid as the kernel lists it in /proc/net, else the peer's address), as the
attestation socket limits each Unix user: one user holding its share never holds the slots
another user's exporter needs. Those beyond get 503 with Retry-After. A request's line and
headers must arrive within HEADERS_DEADLINE_S of the handler waiting for them, its body within
the route's deadline; one thread cuts off each connection past its deadline.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable
from typing import Any

from watchdog.daemon.otlp import sender

log = logging.getLogger("watchdog.otlp")

MAX_CONCURRENT = 64
PER_SENDER_MAX = 8  # connections one sender (uid, else address) may hold at once
HEADERS_DEADLINE_S = 10.0  # the request line and headers, from when the handler waits for them
REAP_EVERY_S = 0.25


_Request = socket.socket | tuple[bytes, socket.socket]  # socketserver's request: what a server hands a handler


class _Deadlines:
    """Connections with a deadline, and one thread that cuts off those past it (a blocked read
    returns at once): a peer cannot hold a slot longer by trickling bytes within each timeout."""

    def __init__(self) -> None:
        self._at: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.cut = 0  # connections cut off at their deadline (tests, metrics)
        self._thread = threading.Thread(target=self._loop, name="otlp-deadlines", daemon=True)
        self._thread.start()

    def set(self, conn: socket.socket, at: float) -> None:
        with self._lock:
            self._at[conn] = at

    def clear(self, conn: socket.socket) -> None:
        with self._lock:
            self._at.pop(conn, None)

    def _loop(self) -> None:
        while not self._stop.wait(REAP_EVERY_S):
            now = time.monotonic()
            with self._lock:
                late = [c for c, at in self._at.items() if at <= now]
                for c in late:
                    del self._at[c]
            for c in late:
                self.cut += 1
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], owner: Any, family: int,
                 handler: type[BaseHTTPRequestHandler]) -> None:
        self.address_family = family
        self.owner = owner
        self.on_idle: Callable[[], None] | None = None  # called by serve_forever between requests
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self._held: Counter[object] = Counter()  # per sender: connections being served
        self._peers: dict[socket.socket, sender.Peer] = {}
        self._held_lock = threading.Lock()
        super().__init__(address, handler)  # binds: a port in use raises here, before any thread
        self.deadlines = _Deadlines()

    def service_actions(self) -> None:
        super().service_actions()
        if self.on_idle is not None:
            self.on_idle()

    @staticmethod
    def _sender(p: sender.Peer) -> object:
        return ("uid", p.uid) if p.uid is not None else ("address", p.address[0])

    def peer_of(self, conn: socket.socket) -> sender.Peer | None:
        with self._held_lock:
            return self._peers.get(conn)

    def held(self, uid: int) -> int:
        """Connections user `uid` holds now (tests, metrics)."""
        with self._held_lock:
            return self._held.get(("uid", uid), 0)

    # The request is the connected socket (a stream server's; the tuple is a datagram server's).
    def process_request(self, request: _Request, client_address: tuple[Any, ...]) -> None:
        conn = request if isinstance(request, socket.socket) else request[1]
        try:
            p = sender.peer(client_address, conn.getsockname()[:2])
        except OSError:
            self.shutdown_request(request)
            return
        key = self._sender(p)
        with self._held_lock:
            admitted = self._held[key] < PER_SENDER_MAX and self._slots.acquire(blocking=False)
            if admitted:
                self._held[key] += 1
                self._peers[conn] = p
        if not admitted:
            try:  # busy (or this sender holds its share): the exporter retries after Retry-After
                conn.settimeout(1.0)
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # no thread to be had: drop this one, keep serving
            self._release(conn, key)
            self.shutdown_request(request)

    def _release(self, conn: socket.socket, key: object) -> None:
        with self._held_lock:
            self._peers.pop(conn, None)
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]
            self._slots.release()

    def process_request_thread(self, request: _Request, client_address: tuple[Any, ...]) -> None:
        conn = request if isinstance(request, socket.socket) else request[1]
        p = self.peer_of(conn)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.deadlines.clear(conn)
            if p is not None:
                self._release(conn, self._sender(p))

    def server_close(self) -> None:
        deadlines = getattr(self, "deadlines", None)  # (not there when the bind failed)
        if deadlines is not None:
            deadlines.stop()
        super().server_close()

    # A peer's misbehaviour is not the daemon's error.
    def handle_error(self, request: _Request, client_address: tuple[Any, ...]) -> None:
        log.debug("otlp: connection from %s ended badly", client_address, exc_info=True)
