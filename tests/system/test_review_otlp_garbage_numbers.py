"""Hostile review: numbers no float can hold in the coding CLIs' OTLP log events.

`input_tokens: "inf"` (or "1e400", or a doubleValue Infinity) in one `claude_code.api_request`
raised OverflowError in the receiver: the whole request got 503 "the store is unavailable; retry
later" and a traceback in the daemon's log, and an exporter retrying that batch had every honest
event in it refused with it, for ever. A garbage number is not a number: that record's tokens
count as none, the rest of the request is taken, 200.
"""

from __future__ import annotations

import json
import uuid

import pytest

from otlp_support import OtlpDaemon, post, wait_for
from watchdog.store.schema import runs

from sqlalchemy import select

JS = {"Content-Type": "application/json"}


def body(session: str, bad: dict) -> bytes:
    def rec(attrs: dict) -> dict:
        return {"body": {"stringValue": "claude_code.api_request"}, "attributes": [
            {"key": k, "value": v} for k, v in {"session.id": {"stringValue": session},
                                               "model": {"stringValue": "gpt-4o"}, **attrs}.items()]}
    honest = {"input_tokens": {"intValue": "1000"}, "output_tokens": {"intValue": "200"}}
    res = [{"key": "service.name", "value": {"stringValue": "claude-code"}},
           {"key": "agent_watchdog.agent", "value": {"stringValue": "json-bot"}}]
    return json.dumps({"resourceLogs": [{"resource": {"attributes": res}, "scopeLogs": [{"logRecords": [
        rec(honest), rec({"input_tokens": bad, "output_tokens": {"intValue": "5"}}), rec(honest)]}]}]}).encode()


@pytest.mark.parametrize("bad", [{"stringValue": "inf"}, {"stringValue": "1e400"}, {"doubleValue": "Infinity"},
                                 {"stringValue": "-inf"}])
def test_a_number_no_float_holds_drops_that_value_not_the_request(sqlite_url, bad):
    session = f"s-{uuid.uuid4().hex[:8]}"
    with OtlpDaemon(sqlite_url) as d:
        status, answer = post(d.address, body(session, bad), JS, path="/v1/logs")
        assert status == 200, answer

        def counted():
            with d.engine.connect() as conn:
                rows = [r for r in conn.execute(select(runs)).all() if (r.labels or {}).get("session") == session]
            return rows if rows and rows[0].steps == 3 else None

        (run,) = wait_for(counted)
        assert run.tokens_in == 2000  # the honest two; the garbage one counts none
