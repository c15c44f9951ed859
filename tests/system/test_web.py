"""The read-only web view (`agent-watchdog web`) over a store real agents and the daemon's Ticker made:
a healthy run, a runaway stopped for max_tool_calls, a guard stop, a paused run, a parent with a child,
and a run whose agent and tool names are hostile HTML. Served by the real command on a real port;
the hostile names are checked inert in a real headless Chromium (tests/cdp_client.py)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from daemon_support import config, later, ticker
from watchdog import RunKilled, Watchdog
from watchdog.core import lifecycle as lc
from watchdog.store import access
from watchdog.store.engine import make_engine
from watchdog.store.schema import utcnow

CLI = shutil.which("agent-watchdog", path=str(Path(sys.executable).parent)) or "agent-watchdog"
HOSTILE_AGENT = "<img src=x onerror=alert(1)>"
HOSTILE_TOOL = '"><script>alert(1)</script>'
SECRET = "s3cr3t-token"
SCREENSHOTS = os.environ.get("AW_WEB_SCREENSHOTS")  # a folder: keep the pages' screenshots (docs/img/)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_store(url: str) -> dict[str, str]:
    engine = make_engine(url)
    access.upgrade(engine)
    cfg = config(agents={"pauser": {"on_breach": "pause"}, "billing-bot": {"max_cost_eur_per_day": 0.5}})
    wd = Watchdog(url)
    ids: dict[str, str] = {}
    tk = ticker(engine, cfg)
    with wd.run(agent="support-bot", labels={"team": "support"}, max_steps=10) as run:
        run.step(model="gpt-x", tokens_in=200, tokens_out=20, cost_eur=0.004)
        run.tool_call("search", {"q": "refund"}, lambda q: ["policy"], read_only=True)
        run.step(model="gpt-x", tokens_in=300, tokens_out=40, cost_eur=0.006)
    ids["healthy"] = run.id
    # The runaway: the daemon stops it for max_tool_calls; its next call finds the stop.
    with pytest.raises(RunKilled):
        with wd.run(agent="billing-bot", labels={"team": "billing"}, guards=False, max_tool_calls=8) as run:
            ids["runaway"] = run.id
            for i in range(11):
                ok = i % 4 != 3
                run.record_tool("verify_iban", {"iban": f"IT{i // 2}"}, ok=ok, error=None if ok else "502 bad gateway")
                run.step(model="gpt-x", tokens_in=50, tokens_out=5, cost_eur=0.003)
                time.sleep(0.02)  # spread the calls over time: the chart has a time axis
            run.record_tool("lookup_account", {"id": 1})
            rep = tk.tick(utcnow())
            assert (run.id, lc.MAX_TOOL_CALLS) in rep.stops
            run.record_tool("verify_iban", {"iban": "IT9"})
    # An in-process guard stop.
    with pytest.raises(RunKilled):
        with wd.run(agent="guarded-bot", max_steps=2) as run:
            ids["guard"] = run.id
            for _ in range(3):
                run.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=0.001)
    # Paused at its max_steps (on_breach = "pause"): held for a human.
    paused = wd.run(agent="pauser", guards=False, max_steps=2).start()
    for _ in range(3):
        paused.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=0.001)
    ids["paused"] = paused.id
    # A parent with a child.
    with wd.run(agent="planner") as parent:
        with parent.child(agent="researcher") as kid:
            kid.tool_call("fetch", {"url": "https://example.org"}, lambda url: "page")
            kid.step(model="gpt-x", tokens_in=20, tokens_out=2, cost_eur=0.002)
        parent.step(model="gpt-x", tokens_in=20, tokens_out=2, cost_eur=0.001)
    ids["parent"], ids["child"] = parent.id, kid.id
    # Hostile names: an agent and a tool named as HTML.
    with wd.run(agent=HOSTILE_AGENT, labels={"x": HOSTILE_TOOL}) as run:
        run.tool_call(HOSTILE_TOOL, {"a": 1}, lambda a: "ok")
        run.record_tool(HOSTILE_TOOL, {"a": 2}, ok=False, error="<b>boom</b>")
        run.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=0.001)
        run.heartbeat(f"fetching https://bob:{SECRET}@api.example.com/v1")  # a writer's text with a secret
    ids["hostile"] = run.id
    now = utcnow()
    rep = tk.tick(later(now, 0.5))
    assert (ids["paused"], lc.MAX_STEPS) in rep.pauses or any(r == ids["paused"] for r, _ in rep.pauses)
    tk.tick(later(now, 1.0))
    # The agents and the daemon are done: nothing writes the store any more.
    wd.close()
    engine.dispose()
    return ids


def _fingerprint(path: Path) -> tuple[str, list]:
    """The database file's bytes and every table's rows (read through a read-only URI)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        rows = [(t, conn.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall()) for t in tables]
    finally:
        conn.close()
    return digest, rows


class Web:
    def __init__(self, base: str, proc: subprocess.Popen, ids: dict[str, str], url: str, db: Path, before):
        self.base, self.proc, self.ids, self.url, self.db, self.before = base, proc, ids, url, db, before

    def get(self, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection(self.base.removeprefix("http://"), timeout=30)
        try:
            conn.request(method, path)
            res = conn.getresponse()
            return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
        finally:
            conn.close()

    def text(self, path: str) -> str:
        status, _, body = self.get(path)
        assert status == 200, (path, status, body[:500])
        return body.decode()


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    folder = tmp_path_factory.mktemp("web")
    db = folder / "runs.db"
    url = f"sqlite:///{db}"
    ids = _make_store(url)
    before = _fingerprint(db)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}
    log = open(folder / "web.log", "w")
    proc = subprocess.Popen([CLI, "--db", url, "web", "--no-auth", "--listen", f"127.0.0.1:{port}"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return urllib.request.urlopen(base + "/", timeout=5).status == 200
        except OSError:
            return False

    deadline = time.monotonic() + 60
    while not up():
        assert proc.poll() is None and time.monotonic() < deadline, (folder / "web.log").read_text()
        time.sleep(0.05)
    yield Web(base, proc, ids, url, db, before)
    proc.terminate()
    code = proc.wait(timeout=30)
    log.close()
    assert code == 0, (folder / "web.log").read_text()  # SIGTERM: a clean exit, as under systemd


def test_the_runs_page_serves_every_run_active_first(web):
    page = web.text("/")
    for name, rid in web.ids.items():
        assert f'href="/runs/{rid}"' in page, name
        assert web.get(f"/runs/{rid}")[0] == 200, name
    active, recent = page.split("<h2>Recent</h2>")
    assert web.ids["paused"] in active and web.ids["healthy"] in recent and web.ids["runaway"] in recent
    assert "max_steps" in web.text(f"/runs/{web.ids['guard']}")  # the in-process guard's stop
    paused = web.text(f"/runs/{web.ids['paused']}")
    assert 'status-paused" data-k="status">paused<' in paused and "<strong>paused</strong>" not in paused
    status, headers, body = web.get("/", "HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 1000


def test_the_runaways_page_shows_its_reason_top_tool_ladder_and_chart(web):
    page = web.text(f"/runs/{web.ids['runaway']}")
    assert "max_tool_calls" in page
    assert "verify_iban ×" in page  # the top tool and its count
    assert "<strong>stop_requested</strong>" in page and "daemon@" in page  # the ladder: who decided
    svg = page[page.index("<svg xmlns"):page.index("</svg>", page.index("<svg xmlns")) + 6]
    chart = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(chart.findall(f".//{ns}circle[@class='call']")) >= 8
    assert len(chart.findall(f".//{ns}path[@class='error']")) == 2  # calls 4 and 8 failed
    assert chart.findall(f".//{ns}rect[@class='repeat']")  # identical calls in a row
    assert chart.findall(f".//{ns}polyline[@class='cost']")
    assert page.count('class="bar"') >= 5  # counters against budgets
    kid = web.text(f"/runs/{web.ids['parent']}")
    assert f'href="/runs/{web.ids["child"]}"' in kid and "researcher" in kid


def test_filters_by_agent_status_label_host(web):
    only = web.text("/?agent=billing-bot")
    assert web.ids["runaway"] in only and web.ids["healthy"] not in only
    assert web.ids["paused"] in web.text("/?status=paused") and web.ids["healthy"] not in web.text("/?status=paused")
    team = web.text("/?label=team%3Dsupport")
    assert web.ids["healthy"] in team and web.ids["runaway"] not in team
    assert all(rid not in web.text("/?host=no-such-host") for rid in web.ids.values())
    assert web.get("/?label=nokey")[0] == 400


def _cli_json(web, *args) -> object:
    out = subprocess.run([CLI, "--db", web.url, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _steady(record: dict) -> dict:
    """An active run's duration grows between two reads: compare the rest."""
    return {k: v for k, v in record.items() if not (k == "duration_s" and record["ended_at"] is None)}


def test_the_json_api_matches_the_cli_and_pages(web):
    cli = _cli_json(web, "runs", "--all", "--json")
    api = json.loads(web.text("/api/runs"))
    assert [_steady(r) for r in api] == [_steady(r) for r in cli]
    assert {r["id"] for r in api} == set(web.ids.values())
    paged, path = [], "/api/runs?limit=2"
    while path:
        status, headers, body = web.get(path)
        assert status == 200
        paged += json.loads(body)
        link = headers.get("link")
        path = re.match(r"<([^>]+)>", link).group(1) if link else None
    assert [r["id"] for r in paged] == [r["id"] for r in cli]
    active = json.loads(web.text("/api/runs?all=0"))
    assert [_steady(r) for r in active] == [_steady(r) for r in _cli_json(web, "runs", "--json")]
    show = _cli_json(web, "show", web.ids["runaway"], "--json")
    assert json.loads(web.text(f"/api/runs/{web.ids['runaway']}")) == show
    assert json.loads(web.text(f"/api/runs/{web.ids['runaway'][:8]}"))["id"] == web.ids["runaway"]
    budgets = json.loads(web.text("/api/budgets"))
    assert any(b["name"] == "billing-bot" and b["spent_eur"] > 0 for b in budgets), budgets
    assert "billing-bot" in web.text("/budgets")


def test_unknown_ids_are_404_pages_and_writes_are_405(web):
    for path in ("/runs/ffffffffffff", "/runs/%3Cscript%3E", "/runs/ffffffff/postmortem", "/nope",
                 "/static/../app.py", "/runs/ffffffff/timeline.svg"):
        status, headers, body = web.get(path)
        assert status == 404, path
        assert headers["content-type"].startswith("text/html") and b"404" in body and b"<script>" not in body
    status, headers, body = web.get("/api/runs/ffffffffffff")
    assert status == 404 and "error" in json.loads(body)
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in ("/", f"/runs/{web.ids['runaway']}", "/api/runs"):
            status, headers, _ = web.get(path, method)
            assert status == 405 and headers["allow"] == "GET, HEAD", (method, path)


def _tags(html: str) -> list[tuple[str, list]]:
    """Every element and its attributes as a browser's tokenizer sees them."""
    from html.parser import HTMLParser

    found: list[tuple[str, list]] = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, attrs))

    P().feed(html)
    return found


def test_every_page_escapes_store_text_and_sends_a_strict_csp(web):
    rid = web.ids["hostile"]
    for path in ("/", f"/runs/{rid}", f"/runs/{rid}/postmortem", "/budgets", "/?agent=" + HOSTILE_AGENT.replace(" ", "+")):
        status, headers, body = web.get(path.replace("<", "%3C").replace(">", "%3E"))
        assert status == 200, path
        html = body.decode()
        assert HOSTILE_AGENT not in html and HOSTILE_TOOL not in html and "<b>boom" not in html, path
        assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/refresh.js" defer>'], path
        tags = _tags(html)
        assert not [a for _, attrs in tags for a, _ in attrs if a.startswith("on")], path  # no event handler
        assert "img" not in {t for t, _ in tags} or path.endswith("postmortem"), path  # only the timeline <img>
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert headers["x-content-type-options"] == "nosniff"
    page = web.text(f"/runs/{rid}")
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "&quot;&gt;&lt;script&gt;" in page
    assert "api.example.com" in page and SECRET not in page  # writer texts are scrubbed on the page
    svg = web.text(f"/runs/{rid}/timeline.svg")
    ET.fromstring(svg)  # well-formed: every name escaped
    assert HOSTILE_TOOL not in svg and "&lt;script&gt;" in svg
    md = web.text(f"/runs/{rid}/postmortem.md")
    assert HOSTILE_AGENT in md  # Markdown is served as text/markdown, never as HTML
    assert web.get(f"/runs/{rid}/postmortem.md")[1]["content-type"].startswith("text/markdown")


def test_a_host_header_not_naming_the_view_is_refused(web):
    conn = http.client.HTTPConnection(web.base.removeprefix("http://"), timeout=30)
    conn.request("GET", "/api/runs", headers={"Host": "evil.example:80"})
    res = conn.getresponse()
    assert res.status == 421 and web.ids["runaway"] not in res.read().decode()
    conn.close()


def test_a_stalled_or_garbage_client_does_not_block_the_view(web):
    host, port = web.base.removeprefix("http://").split(":")
    stalled = socket.create_connection((host, int(port)), timeout=10)
    stalled.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1")  # never finishes its request
    garbage = socket.create_connection((host, int(port)), timeout=10)
    garbage.sendall(b"\x00\xff NOT HTTP AT ALL\r\n\r\n")
    try:
        assert web.get("/api/runs")[0] == 200  # served while the others hang or fail
        assert b"Error response" in garbage.recv(4096)  # the stdlib's 400 page, nothing of the store
    finally:
        stalled.close()
        garbage.close()
    assert web.proc.poll() is None and web.get("/")[0] == 200


def test_postmortem_output_dir_writes_markdown_and_the_same_timeline(web, tmp_path):
    rid = web.ids["runaway"]
    out = subprocess.run([CLI, "--db", web.url, "postmortem", rid[:8], "--output", str(tmp_path / "pm")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "pm" / f"postmortem-{rid}.md").read_text()
    svg = (tmp_path / "pm" / f"postmortem-{rid}-timeline.svg").read_text()
    assert f"![Tool calls over time](postmortem-{rid}-timeline.svg)" in md and "max_tool_calls" in md
    assert svg == web.text(f"/runs/{rid}/timeline.svg")  # one renderer: the page shows the same chart
    page = web.text(f"/runs/{rid}/postmortem")
    assert "<h3>Probable cause</h3>" in page and f'href="/runs/{rid}/postmortem.md"' in page
    assert web.text(f"/runs/{rid}/postmortem.md").startswith("# Postmortem: billing-bot")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from cdp_client import Chromium

    b = Chromium(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


def test_in_chromium_hostile_names_are_inert_and_the_page_refreshes(web, browser):
    from cdp_client import png_colours

    rid = web.ids["hostile"]
    for path in ("/", f"/runs/{rid}", f"/runs/{rid}/postmortem", "/budgets"):
        browser.open(web.base + path)
        assert browser.js("document.querySelectorAll('img[src=\"x\"]').length") == 0, path
        assert browser.js("Array.from(document.scripts).map(s => s.getAttribute('src'))") == ["/static/refresh.js"]
        assert HOSTILE_AGENT in browser.js("document.body.innerText"), path
    browser.open(web.base + f"/runs/{rid}")
    assert browser.js("document.title").startswith(HOSTILE_AGENT)
    assert HOSTILE_TOOL in browser.js("document.querySelector('svg text title') ? document.body.innerText : ''")
    browser.settle(7)  # the refresh script polls every 5 s: it ran, under the CSP, and set text only
    assert browser.js("document.getElementById('refreshed').textContent").startswith("updated")
    assert browser.js("document.querySelectorAll('img[src=\"x\"]').length") == 0
    assert browser.dialogs == []
    assert not [c for c in browser.console if "Content Security Policy" in c], browser.console
    shot = browser.screenshot()
    assert len(shot) > 20_000 and png_colours(shot) > 64  # not a blank page


def test_screenshots_of_the_three_main_pages_are_not_blank(web, browser):
    from cdp_client import png_colours

    pages = {"runs": "/", "run": f"/runs/{web.ids['runaway']}", "budgets": "/budgets"}
    for name, path in pages.items():
        browser.open(web.base + path)
        shot = browser.screenshot()
        assert png_colours(shot) > 64, name
        if SCREENSHOTS:
            Path(SCREENSHOTS, f"web-{name}.png").write_bytes(shot)
    assert browser.dialogs == []


def test_the_store_is_unchanged_after_every_page_was_loaded(web):
    rid = web.ids["runaway"]
    for path in ("/", "/budgets", "/api/runs", "/api/budgets", f"/runs/{rid}", f"/runs/{rid}/timeline.svg",
                 f"/runs/{rid}/postmortem", f"/runs/{rid}/postmortem.md", f"/api/runs/{rid}"):
        assert web.get(path)[0] == 200
    for rid in web.ids.values():
        web.text(f"/runs/{rid}")
    assert _fingerprint(web.db) == web.before
