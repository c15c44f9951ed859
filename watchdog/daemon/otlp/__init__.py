"""The daemon's OTLP/HTTP receiver (`[otlp] listen`): spans from any runtime as runs, steps, tool calls.

decode (bodies → spans) → mapping (spans → runs, steps, tool calls; pure) → ingest (who may
count for which run; the store's witness verbs) ← server (HTTP, bounded). sender asks the
kernel who is on the other end of a loopback socket; silence ends span-only runs.
Needs the optional extra `otlp` (opentelemetry-proto) for protobuf bodies.
"""
