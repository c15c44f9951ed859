#!/usr/bin/env python
"""OTLP receiver benchmark: spans/s into the store against a raw-driver baseline, and span end → counted.

Throughput. `--requests` ExportTraceServiceRequests of `--spans` spans each (half `chat` steps
with tokens, half `execute_tool` calls; one conversation per request), made by the real OTel
SDK's encoder, are measured three ways in the same run, part by part (`--rounds`) in rotating order:

  receiver  POSTed over loopback HTTP by `--clients` client threads of a separate process to the
            daemon's own OtlpServer (decode, mapping, the kernel's sender lookup, the store's
            witness verbs: a run per request, its events and counters in one transaction), with
            no token ([otlp] allow_anonymous = true).
  auth      the same, each request with `Authorization: Bearer <token>` of `[otlp] tokens_file`
            (the default: allow_anonymous = false); the token is checked against 100 tokens.
  raw       the same bodies decoded by opentelemetry-proto and the same rows (the run, one event
            per step / tool span, the counters) inserted with the bare driver (sqlite3, BEGIN
            IMMEDIATE, one transaction per request), in one thread: no HTTP, no mapping.

Latency. An agent process with the OTel SDK's SimpleSpanProcessor ends an `execute_tool` span
every `--pause-ms`; the benchmark notes when each call's row is committed (stored) and when the
daemon's tick (`--tick-s`) folded it (counted), against the span's end (the agent's clock, the
same host's). Reported as p50 / p99, without a token and with one (OTEL_EXPORTER_OTLP_HEADERS).

Run:  python benchmarks/bench_otlp.py [--requests 400] [--spans 50] [--clients 4] [--tick-s 1.0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CLIENT = r"""
import http.client, json, sys, threading, time
host, port, n_clients, path, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
headers = {"Content-Type": "application/x-protobuf"}
if token != "-":
    headers["Authorization"] = "Bearer " + token
bodies = [bytes.fromhex(line) for line in open(path)]
parts = [bodies[i::n_clients] for i in range(n_clients)]
bad = []
def send(mine):
    c = http.client.HTTPConnection(host, port, timeout=60)
    for b in mine:
        c.request("POST", "/v1/traces", body=b, headers=headers)
        r = c.getresponse(); r.read()
        if r.status != 200: bad.append(r.status)
    c.close()
t0 = time.perf_counter()
ts = [threading.Thread(target=send, args=(p,)) for p in parts]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps({"s": time.perf_counter() - t0, "bad": len(bad)}))
"""

LATENCY_AGENT = r"""
import json, os, sys, time
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
p = TracerProvider(resource=Resource({"service.name": "latency-bot"}))
p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1])))
tracer = p.get_tracer("bench")
n, pause = int(sys.argv[2]), float(sys.argv[3])
with tracer.start_as_current_span("invoke_agent latency-bot", attributes={"gen_ai.operation.name": "invoke_agent"}):
    for i in range(n):
        with tracer.start_as_current_span("execute_tool search", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                "gen_ai.tool.call.id": f"call_{i}", "gen_ai.tool.call.arguments": json.dumps({"q": i})}):
            ended = time.time()  # the span ends as the block exits, and is exported right then
        print(f"{i} {ended}", flush=True)
        time.sleep(pause)
"""


def _requests(n: int, spans: int) -> list[bytes]:
    sys.path.insert(0, str(REPO / "tests"))
    from otlp_support import spans_request

    template = [spans_request(spans // 2, conversation=f"bench-{i}") for i in range(min(n, 20))]
    out = []
    for i in range(n):  # distinct conversations: a run per request, as many runs as requests
        req = template[i % len(template)]
        conv = f"bench-{uuid.uuid4().hex}"
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    for kv in s.attributes:
                        if kv.key == "gen_ai.conversation.id":
                            kv.value.string_value = conv
                    s.span_id = os.urandom(8)
        out.append(req.SerializeToString())
    return out


def _store(folder: str) -> str:
    from watchdog.store import access
    from watchdog.store.engine import make_engine

    url = f"sqlite:///{folder}/runs-{uuid.uuid4().hex[:6]}.db"
    e = make_engine(url)
    access.upgrade(e)
    e.dispose()
    return url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TOKEN = "bench-token-" + "7e" * 16
AGENTS = "json-bot,latency-bot"


def _config(tick_s: float = 5.0, auth: bool = False):
    from watchdog.core.config import parse

    folder = tempfile.mkdtemp(prefix="awb", dir="/tmp")
    tokens = f"{folder}/tokens"
    with open(tokens, "w") as f:  # the bench's token last of 100: every one is compared anyway
        f.writelines(f"other-token-{i:04d}-{uuid.uuid4().hex} agent=other owner=o{i}\n" for i in range(99))
        f.write(f"{TOKEN} agent={AGENTS} owner=bench\n")
    os.chmod(tokens, 0o600)
    return parse({"otlp": {"listen": f"127.0.0.1:{_free_port()}", "max_request_bytes": 16 << 20,
                           "tokens_file": tokens, "allow_anonymous": not auth, "max_new_runs_per_min": 10**9},
                  "daemon": {"tick_s": tick_s, "key_file": f"{folder}/k", "socket": f"{folder}/s",
                             "allowed_users": ["root"]},
                  "defaults": {"max_tool_calls": 10**6, "max_steps": 10**6, "max_cost_eur": 1e9,
                               "max_tokens": 10**12, "max_tool_calls_per_min": 10**6}})


def bench_receiver(url: str, bodies: list[bytes], clients: int, folder: str, auth: bool) -> tuple[float, int]:
    from watchdog.core.seal import Sealer
    from watchdog.daemon.otlp.server import OtlpServer
    from watchdog.store.engine import make_engine

    engine = make_engine(url)
    cfg = _config(auth=auth)
    with OtlpServer(engine, cfg, Sealer(os.urandom(32), "bench"), "bench") as srv:
        path = os.path.join(folder, f"bodies-{uuid.uuid4().hex[:6]}.hex")
        with open(path, "w") as f:
            f.writelines(b.hex() + "\n" for b in bodies)
        host, port = srv.address
        out = subprocess.run([sys.executable, "-c", CLIENT, host, str(port), str(clients), path,
                              TOKEN if auth else "-"],
                             capture_output=True, text=True, check=True)
        got = json.loads(out.stdout)
        spans = srv.accepted_spans
    engine.dispose()
    if got["bad"]:
        raise SystemExit(f"{got['bad']} requests were not answered 200")
    return spans / got["s"], spans


def bench_raw(url: str, bodies: list[bytes]) -> tuple[float, int]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    path = url.removeprefix("sqlite:///")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=30000")
    ins_ev = ("INSERT INTO events (run_id, seq, at, kind, tool, args_hash, ok, model, tokens_in, tokens_out, "
              "source, call_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'otlp', ?)")
    n = 0
    t0 = time.perf_counter()
    for body in bodies:
        req = ExportTraceServiceRequest.FromString(body)
        now = dt.datetime.now(dt.timezone.utc).isoformat(" ", "microseconds")[:26]
        run_id = uuid.uuid4().hex
        rows, steps, tools, tin, tout = [], 0, 0, 0, 0
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    n += 1
                    a = {kv.key: kv.value for kv in s.attributes}
                    if a["gen_ai.operation.name"].string_value == "chat":
                        steps += 1
                        i, o = a["gen_ai.usage.input_tokens"].int_value, a["gen_ai.usage.output_tokens"].int_value
                        tin, tout = tin + i, tout + o
                        rows.append((run_id, len(rows) + 1, now, "step", None, None, None,
                                     a["gen_ai.request.model"].string_value, i, o, None))
                    else:
                        tools += 1
                        rows.append((run_id, len(rows) + 1, now, "tool", a["gen_ai.tool.name"].string_value,
                                     s.span_id.hex(), 1, None, None, None, None))
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, source) "
                   "VALUES (?, 'json-bot', 'running', 'cooperative', 'bench', ?, ?, 'otlp')", (run_id, now, now))
        db.executemany(ins_ev, rows)
        db.execute("UPDATE runs SET steps = steps + ?, tool_calls = tool_calls + ?, tokens_in = tokens_in + ?, "
                   "tokens_out = tokens_out + ?, cost_unpriced_tokens = cost_unpriced_tokens + ?, last_seq = ? "
                   "WHERE id = ?", (steps, tools, tin, tout, tin + tout, len(rows), run_id))
        db.execute("COMMIT")
    s = time.perf_counter() - t0
    db.close()
    return n / s, n


def bench_latency(url: str, calls: int, pause_s: float, tick_s: float, auth: bool) -> tuple[list[float], list[float]]:
    from sqlalchemy import select

    from watchdog.daemon.process.service import Daemon
    from watchdog.store.engine import make_engine
    from watchdog.store.schema import events

    engine = make_engine(url)
    cfg = _config(tick_s, auth=auth)
    d = Daemon(engine, cfg)
    srv = d.start_otlp()
    stored: dict[str, float] = {}
    ingest = srv.receiver.ingest

    def timed(groups, peer, ident):
        out = ingest(groups, peer, ident)
        t = time.time()
        for g in groups:
            for c in g.calls:
                if c.call_id:
                    stored.setdefault(c.call_id, t)
        return out

    srv.receiver.ingest = timed
    folded: list[tuple[int, float]] = []
    stop = threading.Event()

    def tick():
        rep = d.tick_job()
        if rep is not None:
            t = time.time()
            folded.extend((e.id, t) for e in rep.events)

    from watchdog.daemon.process.loop import Periodic

    th = Periodic("tick", tick, tick_s, stop).start()  # the daemon's own schedule (monotonic, no drift)
    host, port = srv.address
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if auth:  # the exporter's own variable, as any agent sets it
        env["OTEL_EXPORTER_OTLP_HEADERS"] = f"Authorization=Bearer%20{TOKEN}"
    agent = subprocess.run([sys.executable, "-c", LATENCY_AGENT, f"http://{host}:{port}/v1/traces", str(calls),
                            str(pause_s)], capture_output=True, text=True, check=True, env=env)
    ends = {f"call_{i}": float(t) for i, t in (line.split() for line in agent.stdout.split("\n") if line)}
    time.sleep(2 * tick_s + 0.5)
    stop.set()
    th.join(10)
    d.stop_otlp()
    with engine.connect() as conn:
        ids = dict(conn.execute(select(events.c.id, events.c.call_id).where(events.c.call_id.is_not(None))).all())
    engine.dispose()
    counted = {ids[i]: t for i, t in folded if i in ids}
    to_store = [stored[k] - ends[k] for k in ends if k in stored]
    to_count = [counted[k] - ends[k] for k in ends if k in counted]
    return to_store, to_count


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--spans", type=int, default=50)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--pause-ms", type=float, default=20.0)
    ap.add_argument("--tick-s", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=6, help="parts of the requests, each measured by every path")
    a = ap.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="aw-bench-otlp-")
    bodies = _requests(a.requests, a.spans)
    # Parts, each measured by every path in rotating order (raw, receiver, auth; receiver, auth,
    # raw; ...): drift of a shared machine weighs on all alike.
    q = len(bodies) // a.rounds
    quarters = [bodies[i * q:(i + 1) * q] for i in range(a.rounds)]
    paths = ("raw", "receiver", "auth")
    res: dict[str, list[tuple[float, int]]] = {k: [] for k in paths}
    order = [(paths[(i + j) % 3], part) for i, part in enumerate(quarters) for j in range(3)]
    for name, part in order:
        url = _store(folder)
        res[name].append(bench_raw(url, part) if name == "raw" else
                         bench_receiver(url, part, a.clients, folder, auth=name == "auth"))
    rate = {k: sum(n for _r, n in v) / sum(n / r for r, n in v) for k, v in res.items()}
    lat = {name: bench_latency(_store(folder), a.calls, a.pause_ms / 1000, a.tick_s, auth=name == "auth")
           for name in ("receiver", "auth")}
    cores = os.cpu_count()
    print(f"\n## OTLP receiver, SQLite (WAL), {cores} cores, {a.requests} requests x {a.spans} spans, "
          f"{a.clients} HTTP clients\n")
    print("| path | spans/s | vs raw |")
    print("|---|---:|---:|")
    for k, shown in (("raw", "raw"), ("receiver", "receiver, no token"), ("auth", "receiver, bearer token")):
        print(f"| {shown} | {rate[k]:,.0f} | {rate[k] / rate['raw']:.2f}x |")
    print(f"\n## span end → tool call (SimpleSpanProcessor, {a.calls} calls, tick {a.tick_s:g} s)\n")
    print("| | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for k, shown in (("receiver", "no token"), ("auth", "bearer token")):
        to_store, to_count = lat[k]
        print(f"| stored, {shown} | {_pct(to_store, .5) * 1000:.1f} | {_pct(to_store, .99) * 1000:.1f} |")
        print(f"| counted, {shown} | {_pct(to_count, .5) * 1000:.1f} | {_pct(to_count, .99) * 1000:.1f} |")
    to_count = lat["auth"][1]
    slower = rate["receiver"] / rate["auth"]
    p50 = {k: _pct(lat[k][0], .5) for k in lat}
    print(f"\ngoals: receiver >= 0.5x raw ({rate['auth'] / rate['raw']:.2f}x with tokens); p99 counted <= tick + "
          f"50 ms ({_pct(to_count, .99) * 1000:.0f} <= {a.tick_s * 1000 + 50:.0f} ms); tokens cost within 1.1x "
          f"(throughput {slower:.2f}x, p50 stored {p50['auth'] / p50['receiver']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
