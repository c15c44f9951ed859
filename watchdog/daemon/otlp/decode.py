"""OTLP/HTTP trace request bodies → plain spans: protobuf (opentelemetry-proto) or JSON, gzip bounded.

The daemon reads only what the mapping needs (watchdog.daemon.otlp.mapping); nothing of
the OTel SDK is loaded. Every limit is checked while reading, never after: a gzip bomb
is cut at `max_bytes` of output, a chunked body at `max_bytes` of input. What cannot be
read is a `BadRequest` (400) or `TooLarge` (413), answered with the OTLP error body.

JSON: the OTLP/JSON encoding (lowerCamelCase field names, trace and span ids as hex,
64-bit integers as strings or numbers, enums as integers).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # protobuf messages (not followed by mypy: Any)
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
STATUS_ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR
MAX_ATTR_VALUE_CHARS = 4096  # one attribute's text kept for the mapping (arguments are hashed, not stored)
MAX_DEPTH = 8  # nested arrays / kvlists in one attribute value


class BadRequest(Exception):
    """400: the body is not an ExportTraceServiceRequest in the encoding it claims."""


class TooLarge(Exception):
    """413: the body is larger than [otlp] max_request_bytes (after decompression)."""


class Unsupported(Exception):
    """415: a Content-Type or Content-Encoding this receiver does not read."""


@dataclass(slots=True)  # not frozen: a frozen dataclass costs several times more to build, per span
class Span:
    trace_id: str  # hex
    span_id: str  # hex
    parent_id: str  # hex, "" for a root span
    name: str
    start_ns: int
    end_ns: int
    attrs: Mapping[str, Any]
    error: bool  # status code ERROR
    status_message: str = ""


@dataclass(frozen=True)
class ResourceSpans:
    resource: Mapping[str, Any]
    spans: tuple[Span, ...] = field(default_factory=tuple)


# -- bodies ------------------------------------------------------------------------------


def gunzip(body: bytes, max_bytes: int) -> bytes:
    """Decompress a gzip body, never producing more than `max_bytes` (a bomb is cut, TooLarge)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, max_bytes + 1)
        if len(out) > max_bytes or d.unconsumed_tail:
            raise TooLarge(f"more than {max_bytes} bytes after decompression")
        out += d.flush(max_bytes + 1 - len(out))
    except zlib.error:
        raise BadRequest("Content-Encoding gzip: the body is not valid gzip") from None
    if len(out) > max_bytes:
        raise TooLarge(f"more than {max_bytes} bytes after decompression")
    if not d.eof:
        raise BadRequest("Content-Encoding gzip: the body is truncated")
    return out


def media_type(content_type: str | None) -> str:
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind in (PROTOBUF, "application/protobuf"):
        return PROTOBUF
    if kind == JSON:
        return JSON
    raise Unsupported(f"Content-Type {kind or '(none)'!r}: expected {PROTOBUF} or {JSON}")


def decode(body: bytes, kind: str, max_spans: int) -> tuple[list[ResourceSpans], int]:
    """(the resource spans, the spans dropped beyond `max_spans`)."""
    if kind == PROTOBUF:
        return _from_protobuf(body, max_spans)
    return _from_json(body, max_spans)


# -- protobuf ------------------------------------------------------------------------------


def storable(s: str) -> str:
    """`s` as every store keeps it: NUL (which PostgreSQL's text refuses) and lone surrogates
    (JSON's `"\\ud800"`, no UTF-8) become U+FFFD, so an odd string fails no request (503s its
    sender's exporter retries) and gets its sender's events dropped no more."""
    if s.isascii():
        return s.replace("\x00", "\ufffd") if "\x00" in s else s
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return s.replace("\x00", "\ufffd")


def _pb_value(v: AnyValue, depth: int = 0) -> Any:
    which = v.WhichOneof("value")
    if which is None or depth > MAX_DEPTH:
        return None
    if which == "string_value":
        return storable(v.string_value[:MAX_ATTR_VALUE_CHARS])
    if which == "array_value":
        return [_pb_value(x, depth + 1) for x in v.array_value.values[:64]]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value, depth + 1) for kv in v.kvlist_value.values[:64]}
    if which == "bytes_value":
        return v.bytes_value.hex()[:MAX_ATTR_VALUE_CHARS]
    return getattr(v, which)


def _pb_attrs(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key[:256]: _pb_value(kv.value) for kv in kvs}


def _from_protobuf(body: bytes, max_spans: int) -> tuple[list[ResourceSpans], int]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"not an ExportTraceServiceRequest in protobuf ({type(exc).__name__})") from None
    out: list[ResourceSpans] = []
    kept = dropped = 0
    for rs in req.resource_spans:
        spans = []
        for ss in rs.scope_spans:
            for s in ss.spans:
                if kept >= max_spans:
                    dropped += 1
                    continue
                kept += 1
                spans.append(Span(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name[:256],
                                  s.start_time_unix_nano, s.end_time_unix_nano, _pb_attrs(s.attributes),
                                  s.status.code == STATUS_ERROR, s.status.message[:500]))
        out.append(ResourceSpans(_pb_attrs(rs.resource.attributes), tuple(spans)))
    return out, dropped


# -- JSON ------------------------------------------------------------------------------------


def _j_value(v: object, depth: int = 0) -> Any:
    if not isinstance(v, dict) or depth > MAX_DEPTH:
        return None
    for key in ("stringValue", "string_value"):
        if key in v:
            return storable(str(v[key])[:MAX_ATTR_VALUE_CHARS])
    for key in ("intValue", "int_value"):
        if key in v:
            return _int(v[key], "intValue")
    for key in ("doubleValue", "double_value"):
        if key in v:
            x = v[key]
            if isinstance(x, bool) or not isinstance(x, (int, float, str)):
                raise BadRequest("doubleValue: expected a number")
            try:
                return float(x)
            except ValueError:
                raise BadRequest("doubleValue: expected a number") from None
    for key in ("boolValue", "bool_value"):
        if key in v:
            return bool(v[key])
    for key in ("arrayValue", "array_value"):
        if key in v and isinstance(v[key], dict):
            return [_j_value(x, depth + 1) for x in _list(v[key].get("values"))[:64]]
    for key in ("kvlistValue", "kvlist_value"):
        if key in v and isinstance(v[key], dict):
            return _j_attrs(v[key].get("values"), depth + 1)
    if "bytesValue" in v:
        return str(v["bytesValue"])[:MAX_ATTR_VALUE_CHARS]
    return None


def _list(v: object) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise BadRequest("expected a JSON array")
    return v


def _int(v: object, what: str) -> int:
    if isinstance(v, bool):
        raise BadRequest(f"{what}: expected an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v) < 24:
        return int(v)
    if v is None:
        return 0
    raise BadRequest(f"{what}: expected an integer (or its decimal string)")


def _hex(v: object, what: str) -> str:
    if v is None or v == "":
        return ""
    if not isinstance(v, str) or len(v) > 64:
        raise BadRequest(f"{what}: expected a hex string")
    try:
        bytes.fromhex(v)
    except ValueError:
        raise BadRequest(f"{what}: expected hex (OTLP/JSON spells ids in hex, not base64)") from None
    return v.lower()


def _j_attrs(kvs: object, depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in _list(kvs):
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            out[kv["key"][:256]] = _j_value(kv.get("value"), depth)
    return out


def _get(d: dict[str, Any], camel: str, snake: str) -> Any:
    return d.get(camel, d.get(snake))


def _from_json(body: bytes, max_spans: int) -> tuple[list[ResourceSpans], int]:
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest("not valid JSON") from None
    if not isinstance(req, dict):
        raise BadRequest("expected a JSON object (ExportTraceServiceRequest)")
    out: list[ResourceSpans] = []
    kept = dropped = 0
    for rs in _list(_get(req, "resourceSpans", "resource_spans")):
        if not isinstance(rs, dict):
            raise BadRequest("resourceSpans: expected objects")
        raw_resource = rs.get("resource")
        resource = raw_resource if isinstance(raw_resource, dict) else {}
        spans = []
        for ss in _list(_get(rs, "scopeSpans", "scope_spans")):
            if not isinstance(ss, dict):
                raise BadRequest("scopeSpans: expected objects")
            for s in _list(ss.get("spans")):
                if not isinstance(s, dict):
                    raise BadRequest("spans: expected objects")
                if kept >= max_spans:
                    dropped += 1
                    continue
                kept += 1
                raw_status = s.get("status")
                status = raw_status if isinstance(raw_status, dict) else {}
                code = status.get("code", 0)
                spans.append(Span(
                    _hex(_get(s, "traceId", "trace_id"), "traceId"), _hex(_get(s, "spanId", "span_id"), "spanId"),
                    _hex(_get(s, "parentSpanId", "parent_span_id"), "parentSpanId"), str(s.get("name", ""))[:256],
                    _int(_get(s, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano"),
                    _int(_get(s, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano"),
                    _j_attrs(s.get("attributes")), code in (STATUS_ERROR, "STATUS_CODE_ERROR"),
                    str(status.get("message", ""))[:500]))
        out.append(ResourceSpans(_j_attrs(resource.get("attributes")), tuple(spans)))
    return out, dropped


# -- answers -----------------------------------------------------------------------------------


def response(kind: str, rejected: int, message: str) -> bytes:
    """ExportTraceServiceResponse: empty on full success, else partial_success."""
    if kind == JSON:
        if not rejected and not message:
            return b"{}"
        return json.dumps({"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}}).encode()
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    resp = ExportTraceServiceResponse()
    if rejected or message:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    return bytes(resp.SerializeToString())  # protobuf is not followed: Any


def error_body(kind: str, code: int, message: str) -> bytes:
    """google.rpc.Status (code, message), as OTLP/HTTP answers a refused request. Encoded by
    hand: two fields, and opentelemetry-proto does not ship the googleapis Status message."""
    if kind == JSON:
        return json.dumps({"code": code, "message": message}).encode()
    text = message.encode("utf-8")[:1000]
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
