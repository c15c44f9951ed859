"""The docs pages, run: each page's runnable blocks in order by a reader at one shell, the systemd
steps as root in a scratch root, and the syntax of every shell and JavaScript block.

Which block is run how, and why some are not: tests/docblocks.py (the pure checks are in
tests/unit/test_docs_blocks.py; the README's newcomer in test_readme.py). A docs page's reader
has installed the package already: the suite's own venv (every extra a page installs is in the
`test` extra) is first on the PATH, in a scratch copy of the checkout, with no store or config preset.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import text

import docblocks as d
import scratch_root
from docreader import Reader, copy_checkout
from watchdog.store.engine import make_engine

VENV_BIN = Path(sys.executable).parent
SYSTEMD_PAGE = d.DOCS / "howto" / "systemd.md"


def _runnable_pages() -> list[Path]:
    return [p for p in d.pages()[1:] if any(b.kind in ("run", "given") for b in d.blocks(p))]


def _json(reader: Reader, *args: str):
    return json.loads(reader.cli("--db", "sqlite:///runs.db", *args))


def _by_agent(reader: Reader) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in _json(reader, "runs", "--all", "--json"):
        out.setdefault(r["agent"], []).append(r)
    return out


# What each page's blocks must have left behind, read back as its reader would (through the CLI).

def _after_instrument(reader: Reader, ran: list[d.Block], pg_url: str) -> None:
    (run,) = _by_agent(reader)["support-bot"]
    assert (run["status"], run["steps"], run["tool_calls"]) == ("completed", 1, 2), run


def _after_langchain(reader: Reader, ran: list[d.Block], pg_url: str) -> None:
    (loop_block,) = [b for b in ran if b.argument == "a LangGraph agent that loops"]
    printed = reader.stdouts[loop_block.line].strip().splitlines()
    assert printed and printed[-1] in ("loop_detected", "max_tool_calls", "max_steps"), printed[-5:]
    statuses = sorted(r["status"] for r in _by_agent(reader)["support-bot"])
    assert statuses == ["completed", "killed"], statuses


def _after_openai_agents(reader: Reader, ran: list[d.Block], pg_url: str) -> None:
    runs = _by_agent(reader)["support-bot"]
    assert len(runs) == 2 and all(r["status"] == "completed" and r["tool_calls"] == 1 for r in runs), runs


def _after_table_contract(reader: Reader, ran: list[d.Block], pg_url: str) -> None:
    run = _json(reader, "show", "3f2a1b0c", "--json")
    assert (run["status"], run["tool_calls"], run["tool_errors"], run["source"]) == ("killed", 1, 1, "sql"), run
    with make_engine(pg_url).connect() as conn:  # the same rows, written on PostgreSQL
        assert conn.execute(text("SELECT status, tool_errors FROM runs WHERE id LIKE '3f2a1b0c%'")).one() == ("killed", 1)


def _after_otlp(reader: Reader, ran: list[d.Block], pg_url: str) -> None:
    assert all(b.text.startswith("export ") for b in ran)  # only the exporter's variables run here


def _after_claude_code(reader: Reader, ran: list[d.Block], pg_url: str) -> None:
    (run,) = _by_agent(reader)["claude-code"]
    assert (run["source"], run["status"], run["tool_calls"]) == ("hook", "running", 1), run
    settings = json.loads((reader.checkout / "my-project" / ".claude" / "settings.json").read_text())
    assert "agent-watchdog hook claude-code" in json.dumps(settings["hooks"]["PreToolUse"])


def _after_codex(reader: Reader, ran: list[d.Block], pg_url: str) -> None:
    (block,) = ran[-1:]
    assert "nothing to change (already installed)" in reader.stdouts[block.line]
    text = (reader.checkout / "codex-home" / "config.toml").read_text()
    assert text.count("[[hooks.PreToolUse]]") == 1 and "agent-watchdog hook codex" in text


def _after_gemini(reader: Reader, ran: list[d.Block], pg_url: str) -> None:
    settings = json.loads((reader.checkout / "my-project" / ".gemini" / "settings.json").read_text())
    assert len(settings["hooks"]["BeforeTool"]) == 1 and "agent-watchdog hook gemini" in json.dumps(settings)


AFTER = {
    "docs/howto/claude-code.md": _after_claude_code,
    "docs/howto/codex.md": _after_codex,
    "docs/howto/gemini.md": _after_gemini,
    "docs/howto/instrument.md": _after_instrument,
    "docs/howto/langchain.md": _after_langchain,
    "docs/howto/openai-agents.md": _after_openai_agents,
    "docs/reference/table-contract.md": _after_table_contract,
    "docs/howto/otlp.md": _after_otlp,
}


def test_every_runnable_page_has_its_after_check():
    assert sorted(d.rel(p) for p in _runnable_pages()) == sorted(AFTER)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", _runnable_pages(), ids=d.rel)
def test_a_reader_runs_the_page_top_to_bottom(page, tmp_path, pg_migrated):
    checkout = copy_checkout(tmp_path / "agent-watchdog")
    reader = Reader(checkout, tmp_path, pg_migrated, venv_bin=VENV_BIN)
    ran = []
    for b in d.blocks(page):
        if b.kind in ("run", "given"):
            reader.run(b)
            ran.append(b)
    assert ran
    AFTER[d.rel(page)](reader, ran, pg_migrated)
    assert list(reader.tmp.iterdir()) == [], "something was left in the reader's TMPDIR"


def _shell_blocks() -> list[d.Block]:
    return [b for b in d.blocks() if b.lang in ("sh", "bash") and b.kind in
            ("run", "operator", "install", "readme", "ci", "run-by", "covered-by")]


def test_every_shell_block_is_valid_bash():
    problems = []
    for b in _shell_blocks():
        done = subprocess.run(["bash", "-n"], input=b.text, capture_output=True, text=True, timeout=30)
        if done.returncode:
            problems.append(f"{b.where()}: {done.stderr.strip()}")
    assert problems == [] and len(_shell_blocks()) > 20, "\n".join(problems)


def test_javascript_blocks_and_the_files_they_quote_parse_with_node():
    node = shutil.which("node")
    assert node, "node is needed (.ci/run installs nodejs)"
    js = [b for b in d.blocks() if b.lang in ("javascript", "typescript")]
    assert js, "no JavaScript block found"
    for b in js:
        if b.kind == "excerpt":
            done = subprocess.run([node, "--check", str(d.REPO / b.target)], capture_output=True, text=True, timeout=60)
        else:
            done = subprocess.run([node, "--check", "-"], input=b.text, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{b.where()}: {done.stderr}"


# --- the systemd steps --------------------------------------------------------------------------------


def _operator_blocks() -> tuple[d.Block, d.Block]:
    ops = [b for b in d.blocks(SYSTEMD_PAGE) if b.kind == "operator"]
    assert [b.argument for b in ops] == ["", "after setting [alerts] urls"], [b.marker for b in ops]
    return ops[0], ops[1]


def test_the_units_install_comment_is_the_systemd_pages_steps():
    """The unit's header lists the same steps (without sudo): one of them must not drift from the other."""
    first, second = _operator_blocks()
    steps = [re.sub(r"^sudo (?!-u)", "", line.split("   #")[0].strip())
             for line in (first.text + second.text).splitlines() if line.startswith("sudo ")]
    steps = [s.replace("sudo systemctl", "systemctl") for s in steps if "check-config" not in s and "test-alert" not in s]
    header = (d.REPO / "systemd" / "agent-watchdog.service").read_text(encoding="utf-8").split("[Unit]")[0]
    commented = [line[1:].strip() for line in header.splitlines() if line.startswith("#   ")]
    assert commented == steps


AGENT_RECORDS = r'''
# An agent of user `agents` records a run in the daemon's SQLite store (group agent-watchdog-store),
# and its run that owns its process is attested over the daemon's socket; it cannot read the config.
setpriv --reuid=agents --regid=agents --init-groups env -i PATH=/usr/bin:/bin HOME=/ \
    /opt/agent-watchdog/venv/bin/python - <<'PY'
from watchdog import Watchdog
try:
    open("/etc/agent-watchdog/config.toml")
    raise SystemExit("an agent can read the daemon's config")
except PermissionError:
    pass
wd = Watchdog("sqlite:////var/lib/agent-watchdog/store/runs.db")
with wd.run(agent="support-bot", kill_mode="process") as owned:
    assert owned.attested, "not attested"
with wd.run(agent="support-bot") as run:
    run.step(model="gpt-x", tokens_in=100, tokens_out=10)
print("agent run", run.id)
PY
sudo -u agent-watchdog /opt/agent-watchdog/venv/bin/agent-watchdog --config /etc/agent-watchdog/config.toml runs --all --json
systemctl stop agent-watchdog
systemctl status agent-watchdog || true
'''


HOST_INSTALL = ("/var/lib/agent-watchdog", "/opt/agent-watchdog", "/etc/agent-watchdog", "/run/agent-watchdog")


def _host_install() -> tuple:
    """This machine's own agent-watchdog install, as far as the steps could change it: which of its
    directories exist and when they last changed (stat only: tests/hermetic.py forbids reading
    them), and its users' lines."""
    dirs = tuple((p, os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in HOST_INSTALL if os.path.exists(p))
    users = tuple(line for line in Path("/etc/passwd").read_text().splitlines()
                  if line.startswith(("agent-watchdog:", "agents:")))
    return dirs, users


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_systemd_steps_run_in_a_scratch_root(http):
    why = scratch_root.available()
    if why:
        pytest.skip(f"a scratch root {why}")
    first, second = _operator_blocks()
    host_before = _host_install()
    base = Path(tempfile.mkdtemp(prefix="aw-docs-root-", dir="/tmp"))
    try:
        checkout = copy_checkout(base / "agent-watchdog")
        root = scratch_root.ScratchRoot(base)
        done = root.run(checkout, ["set -x\n" + first.text])
        assert done.returncode == 0, f"{first.where()}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"

        # The prose between the blocks: put your alert targets in [alerts] urls.
        config = root.path("/etc/agent-watchdog/config.toml")
        before = config.read_text(encoding="utf-8")
        assert before.count("\nurls = []\n") == 1
        config.write_text(before.replace("\nurls = []\n", f'\nurls = ["{http.url()}"]\n'), encoding="utf-8")

        done = root.run(checkout, ["set -x\n" + second.text, AGENT_RECORDS])
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"{second.where()}:\n{out[-6000:]}"
        assert "Active: active (running)" in out and 'Status: "active runs' in out, out[-3000:]
        assert http.wait_for(1, timeout_s=5) and "test alert" in json.dumps(http.received), out[-3000:]
        # The agent's run reached the store the daemon reads, and the daemon stopped cleanly (exit 0).
        listed = out[out.index('[\n  {'):]
        assert '"agent": "support-bot"' in listed and '"status": "completed"' in listed, out[-3000:]
        assert "Active: inactive (dead) (exit status 0)" in out, out[-3000:]

        # What the steps left: the users, two groups (the config's holds no agent), the daemon's
        # state directory with its sealing key, and the store's files as the agents need them.
        passwd = root.path("/etc/passwd").read_text()
        assert re.search(r"^agent-watchdog:x:\d+:\d+::/var/lib/agent-watchdog:/usr/sbin/nologin$", passwd, re.M)
        group = root.path("/etc/group").read_text()
        assert re.search(r"^agent-watchdog:x:\d+:$", group, re.M), group[-500:]
        assert re.search(r"^agent-watchdog-store:x:\d+:agents$", group, re.M), group[-500:]
        state = root.path("/var/lib/agent-watchdog")
        assert oct(state.stat().st_mode & 0o7777) == "0o711"
        key = state / "attest.key"
        assert oct(key.stat().st_mode & 0o777) == "0o600" and key.stat().st_uid == state.stat().st_uid
        assert oct((state / "store").stat().st_mode & 0o7777) == "0o3770"  # setgid + sticky
        db = state / "store" / "runs.db"
        assert oct(db.stat().st_mode & 0o777) == "0o660"
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone() is not None
        # And nothing of it on this machine: whatever this machine had (a daemon once run here)
        # is as it was, used by nothing above.
        assert _host_install() == host_before
    finally:
        shutil.rmtree(base, ignore_errors=True)
