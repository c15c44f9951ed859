"""The README, read top to bottom by a newcomer: every code block runs as written, or says why not.

The blocks and their `<!-- docs-test: ... -->` markers are those of every page (tests/docblocks.py);
the docs pages' own blocks are run by tests/system/test_docs.py and checked by
tests/unit/test_docs_blocks.py. What is the README's alone: its reader starts from nothing, so its
first command makes and activates `.venv` in a scratch copy of the checkout (what a clone has), and
the later blocks run in that venv, as one reader at one shell would (each shell block with
`bash -euo pipefail`; Python blocks with that venv's python in the scratch folder, so
`sqlite:///runs.db` is the store the `db upgrade` block made). The demo that command runs is
compared with the transcript docs/quickstart.md shows (the lines that do not vary: intro, table
header, verdict). The test command (`ci` marker) cannot run its own suite: the check is that .ci/run
runs that very command in a fresh, activated venv (and CI runs .ci/run).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from docblocks import README, REPO, Block, blocks, parse
from docreader import Reader, copy_checkout

QUICKSTART = REPO / "docs" / "quickstart.md"
TRANSCRIPT_MARKER = "<!-- docs-test: output of `agent-watchdog demo --keep /tmp/demo-cap` -->\n```\n"


def readme_blocks() -> list[Block]:
    return blocks(README)


def test_every_block_is_runnable_or_marked():
    found = readme_blocks()
    assert len(found) >= 5, "the README parser found too few blocks"
    problems = [f"{b.where()}: neither runnable nor marked `docs-test: ...`" for b in found
                if b.kind in ("unmarked", "parse")]
    problems += [f"{b.where()}: the README's reader runs every block it can" for b in found
                 if b.kind not in ("run", "ci", "figure", "output")]
    assert problems == [], "\n".join(problems)


def test_the_parser_sees_markers_and_refuses_unmarked_text():
    sample = ("intro\n\n<!-- docs-test: output -->\n```\nhello\n```\n\n```text\nno marker\n```\n\n```sh\necho hi\n```\n"
              "\n- a list item\n\n  <!-- docs-test: covered-by test_x (why) -->\n  ```sql\n  SELECT 1;\n  ```\n"
              "\n```{toctree}\nindex\n```\n\nindented:\n\n    rm -rf /\n")
    got, indented = parse(sample)
    assert [(b.kind, b.lang, b.text) for b in got] == [
        ("output", "", "hello\n"), ("unmarked", "text", "no marker\n"), ("run", "sh", "echo hi\n"),
        ("covered-by", "sql", "SELECT 1;\n")]
    assert got[0].line == 4 and (got[3].target, got[3].reason) == ("test_x", "why")
    assert indented == [29]  # an indented code block is found, to be refused


def test_the_test_command_is_what_ci_runs():
    (ci,) = [b for b in readme_blocks() if b.kind == "ci"]
    command = [line for line in ci.text.splitlines() if line and not line.startswith("#")]
    assert len(command) == 1, ci.where()
    prefix = "python3 -m venv .venv && . .venv/bin/activate && "
    assert command[0].startswith(prefix), ci.where()
    verbatim = command[0][len(prefix):]
    ci_run = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert verbatim in ci_run, f".ci/run does not run the README's test command verbatim: {verbatim}"
    before = "\n".join(ci_run[:ci_run.index(verbatim)])
    assert 'python3 -m venv "$VENV"' in before and 'source "$VENV/bin/activate"' in before  # a fresh, active venv


def _demo_fixed_lines(output: str) -> list[str]:
    """The transcript's lines that do not vary between runs: the intro's budgets and stories, the table's
    header, the verdict. Pids, run ids, times and paths are replaced."""
    keep = []
    for line in output.splitlines():
        if line.startswith(("  budgets", "  circuit", "  alerts", "AGENT ", "TO STOP:", "OK:")) or \
                re.match(r"  (plan|recover|runaway|broken-tool|hung|stubborn) {2,}\S", line):
            keep.append(line)
    return keep


def trimmed_transcript(output: str) -> str:
    """The demo's output as the quickstart shows it: each alert box reduced to its title."""
    out, in_box = [], False
    for line in output.rstrip("\n").splitlines():
        stripped = line.strip()
        if stripped.startswith("┌ ALERT"):
            in_box = True
            out += [line, line[:line.index("┌")] + "│ (… body trimmed here; the demo prints it in full …)"]
            continue
        if in_box:
            if stripped == "└":
                in_box = False
                out.append(line)
            elif stripped.startswith("│") and len(stripped) > 1 and not out[-1].strip().startswith("│ (…"):
                continue
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def regenerate_demo_transcript(demo_output: str) -> None:
    """AGENT_WATCHDOG_REGENERATE_README=1: the test writes the demo's transcript into the quickstart."""
    text = QUICKSTART.read_text(encoding="utf-8")
    start = text.index(TRANSCRIPT_MARKER) + len(TRANSCRIPT_MARKER)
    end = text.index("```\n", start)
    QUICKSTART.write_text(text[:start] + trimmed_transcript(demo_output) + text[end:], encoding="utf-8")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_newcomer_runs_the_readme_top_to_bottom(tmp_path, pg_migrated):
    checkout = copy_checkout(tmp_path / "agent-watchdog")
    reader = Reader(checkout, tmp_path, pg_migrated)
    ran = []
    for b in readme_blocks():
        if b.kind == "run":
            reader.run(b)
            ran.append(b)
    assert {b.lang for b in ran} >= {"sh", "python"}

    # The first command ran the demo, which deleted its temporary store.
    demo = next(out for out in reader.outputs.values() if "agent-watchdog demo —" in out)
    assert "OK: every agent ended as expected" in demo
    assert list(reader.tmp.iterdir()) == [], "something was left in the reader's TMPDIR"
    (transcript,) = [b for b in blocks(QUICKSTART) if b.kind == "output" and "agent-watchdog demo" in b.argument]
    if _demo_fixed_lines(transcript.text) != _demo_fixed_lines(demo) and os.environ.get(
            "AGENT_WATCHDOG_REGENERATE_README") == "1":
        regenerate_demo_transcript(demo)  # then review and commit docs/quickstart.md
    assert _demo_fixed_lines(transcript.text) == _demo_fixed_lines(demo), (
        "the quickstart's demo transcript is stale: rerun this test with AGENT_WATCHDOG_REGENERATE_README=1")
    assert max(len(line) for line in transcript.text.splitlines()) <= 100, "transcript over 100 columns"

    # What the blocks recorded, read back through the CLI as the reader would.
    by_agent: dict[str, list] = {}
    for r in json.loads(reader.cli("--db", "sqlite:///runs.db", "runs", "--all", "--json")):
        by_agent.setdefault(r["agent"], []).append(r)
    # The SDK block: one completed run with its step and its tool call.
    (sdk_run,) = by_agent["support-bot"]
    assert (sdk_run["status"], sdk_run["steps"], sdk_run["tool_calls"], sdk_run["source"]) == ("completed", 1, 1, "sdk")
    # The exec block: the command ran as one completed run of its own.
    (exec_run,) = by_agent["nightly-report"]
    assert (exec_run["status"], exec_run["source"]) == ("completed", "exec")
    assert any("any command, in any language" in reader.outputs[b.line] for b in ran if "exec" in b.text)
