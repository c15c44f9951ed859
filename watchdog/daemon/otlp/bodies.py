"""Reading a request's body: Content-Length or chunked, bounded in size and in time.

A body over the limit is read and dropped (up to DRAIN_MAX_BYTES, within the deadline) so
the client reads our 413 instead of a connection reset; a body that does not arrive within
its deadline is given up on (TooSlow), malformed framing is BadFraming (400).
"""

from __future__ import annotations

import time
from typing import Any

from watchdog.daemon.otlp import decode

REQUEST_DEADLINE_S = 30.0  # the body, from its headers
DRAIN_MAX_BYTES = 64 * 1024 * 1024  # of a body refused for its size, read and dropped at most


class TooSlow(Exception):
    pass


class BadFraming(Exception):
    pass


class BodyReader:
    """For a BaseHTTPRequestHandler: its `rfile` and `headers`."""

    rfile: Any
    headers: Any

    def _body(self, max_bytes: int) -> bytes:
        deadline = time.monotonic() + REQUEST_DEADLINE_S
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked(max_bytes, deadline)
        length = self.headers.get("Content-Length")
        if length is None:
            raise BadFraming("a body needs Content-Length or Transfer-Encoding: chunked")
        if not length.strip().isdigit():
            raise BadFraming("Content-Length: expected a number")
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
                raise TooSlow()
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
                raise TooSlow()
            line = self.rfile.readline(1024)
            if not line.endswith(b"\n"):
                raise BadFraming("chunked body: a chunk size line is missing or too long")
            size_txt = line.split(b";", 1)[0].strip()
            try:
                size = int(size_txt, 16)
            except ValueError:
                raise BadFraming("chunked body: a chunk size is not hex") from None
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
                raise BadFraming("chunked body: a chunk does not end with CRLF")

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
