"""A writer's names cannot add Markdown to the postmortem file (hostile review, low).

`agent-watchdog postmortem RUN --output DIR` writes a Markdown file an operator opens in a viewer
that renders it (an IDE, a wiki, GitHub). The run's writer chooses its agent's name, its tools'
names, its host, its progress text, its stop reason and detail; a plain-SQL writer can store
anything there. None of it may add a heading, a link, an image, HTML or a code fence: parsed
here with markdown-it (CommonMark + tables), the file holds only the template's own.
"""

from __future__ import annotations

import re

from click.testing import CliRunner
from markdown_it import MarkdownIt
from sqlalchemy import update

from watchdog.cli import main
from watchdog.store.schema import events, runs

INJECT = ("x\n# Pwned heading\n\n[click me](https://evil-example.com/login) ![pixel](https://t.evil-example.com/p.png)"
          " <img src=x onerror=alert(1)> <a href='https://evil-example.com'>a</a> **bold** ~~gone~~\n"
          "```\nrm -rf /\n```\n| a | b |")
HEADINGS = ["Postmortem", "What happened", "Impact", "Probable cause", "What worked and what did not", "Actions",
            "Chaos test to add"]


def _blocks(md: str) -> list:
    tokens = MarkdownIt("commonmark").enable("table").enable("strikethrough").parse(md)
    return tokens + [child for t in tokens for child in (t.children or [])]


def test_hostile_names_add_no_heading_link_image_html_or_fence_to_the_postmortem(engine, db_url, wd, tmp_path):
    with wd.run("bot", kill_mode="cooperative") as run:
        run.record_tool("search", {"q": 1}, ok=False, error="boom")
        run.record_tool("search", {"q": 1}, ok=False, error="boom")
        run.heartbeat(progress="working")
    with engine.begin() as conn:  # what a plain-SQL writer can store as the run's names and texts
        conn.execute(update(runs).where(runs.c.id == run.id).values(
            agent=INJECT[:128], host=INJECT[:255], progress="in " + INJECT.replace(" ", "_") + " since 1",
            status="killed", stop_reason="](x)\n# h <b>![i](j) `", stop_detail=INJECT))  # (as long as PostgreSQL takes)
        conn.execute(update(events).where(events.c.run_id == run.id, events.c.tool == "search").values(
            tool=INJECT[:128]))
    out = CliRunner().invoke(main, ["--db", db_url, "postmortem", run.id, "--output", str(tmp_path / "pm")])
    assert out.exit_code == 0, out.output
    md = (tmp_path / "pm" / f"postmortem-{run.id}.md").read_text()

    tokens = _blocks(md)
    heads = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert [h.split(":")[0] for h in heads] == HEADINGS, heads
    assert not [t for t in tokens if t.type in ("link_open", "html_inline", "html_block", "s_open")]
    strong = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "strong_open"]
    assert "bold" not in strong  # the template's own bold only (status, defense, cost)
    images = [t.attrs.get("src") for t in tokens if t.type == "image"]
    assert images == [f"postmortem-{run.id}-timeline.svg"]
    assert [t.info for t in tokens if t.type in ("fence", "code_block")] == ["python"]  # the chaos case only
    tables = [t for t in tokens if t.type == "table_open"]
    assert len(tables) == 1  # the signature table only
    text = md.split("```python")[0]  # (the chaos case's code quotes the names as Python strings: literal)
    assert "evil-example.com" not in text and "https://" not in text  # defanged: hxxps[:]//…[.]com
    assert re.search(r"^# Postmortem: x # Pwned heading", md, re.M) is None

