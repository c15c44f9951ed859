"""The web view on both backends: it opens the store read-only (SQLite mode=ro, PostgreSQL read-only
transactions), serves the same JSON as the CLI, and leaves every row as it was."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from click.testing import CliRunner
from sqlalchemy import select, text

from daemon_support import config, ticker
from watchdog import RunKilled
from watchdog.cli import main
from watchdog.core import lifecycle as lc
from watchdog.core.config import parse
from watchdog.store.schema import metadata, utcnow
from watchdog.web.server import make, open_store


def _rows(engine) -> dict[str, list]:
    with engine.connect() as conn:
        return {t.name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key.columns or t.columns))]
                for t in metadata.sorted_tables}


@pytest.fixture
def served(db_url, engine, wd):
    with pytest.raises(RunKilled):
        with wd.run(agent="billing-bot", labels={"team": "billing"}, guards=False, max_tool_calls=3) as run:
            for i in range(4):
                run.record_tool("verify_iban", {"iban": f"IT{i}"}, ok=i != 1, error=None if i != 1 else "timeout")
                run.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=0.01)
            assert (run.id, lc.MAX_TOOL_CALLS) in ticker(engine, config()).tick(utcnow()).stops
            run.step(model="gpt-x", tokens_in=1, tokens_out=1)
    with wd.run(agent="support-bot") as ok:
        ok.tool_call("search", {"q": 1}, lambda q: "x")
    before = _rows(engine)
    server = make(db_url, parse({}), config_from_file=False, listen="127.0.0.1:0")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", run.id, before
    server.shutdown()
    server.server_close()


def test_pages_and_json_on_each_backend_and_no_row_changes(served, db_url, engine):
    base, rid, before = served
    page = urllib.request.urlopen(f"{base}/runs/{rid}", timeout=30).read().decode()
    assert "max_tool_calls" in page and "verify_iban ×4" in page and 'class="error"' in page
    api = json.loads(urllib.request.urlopen(f"{base}/api/runs", timeout=30).read())
    cli = json.loads(CliRunner().invoke(main, ["--db", db_url, "runs", "--all", "--json"]).stdout)
    assert api == cli and len(api) == 2
    team = json.loads(urllib.request.urlopen(f"{base}/api/runs?label=team%3Dbilling&status=killed", timeout=30).read())
    assert [r["id"] for r in team] == [rid]  # a label filter in SQL on either backend
    show = json.loads(CliRunner().invoke(main, ["--db", db_url, "show", rid, "--json"]).output)
    assert json.loads(urllib.request.urlopen(f"{base}/api/runs/{rid}", timeout=30).read()) == show
    for path in ("/", "/budgets", f"/runs/{rid}/postmortem", f"/runs/{rid}/postmortem.md", f"/runs/{rid}/timeline.svg"):
        assert urllib.request.urlopen(base + path, timeout=30).status == 200
    assert _rows(engine) == before


def test_the_views_store_cannot_write(db_url):
    engine = open_store(db_url)
    try:
        with pytest.raises(Exception) as caught:
            with engine.begin() as conn:
                conn.execute(text("UPDATE runs SET steps = steps + 1"))
                conn.execute(text("INSERT INTO settings (key, value, updated_at) VALUES ('x', '1', CURRENT_TIMESTAMP)"))
        assert "read-only" in str(caught.value) or "readonly" in str(caught.value)
    finally:
        engine.dispose()
