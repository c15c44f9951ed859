"""The README, read top to bottom by a test: every code block runs as written, or says why not.

A block is a fenced code block. An HTML comment on the line before its fence,
`<!-- readme-test: ... -->`, says how it is checked; without one a block must be
runnable (sh, bash, python, sql), and any other unmarked block fails
test_every_block_is_runnable_or_marked. The markers:

- (none): run in order by test_a_newcomer_runs_the_readme_top_to_bottom, in a scratch
  copy of the checkout (what a clone has), as one reader at one shell would: the first
  command creates and activates `.venv`, which stays active for the later shell blocks
  (each runs with `bash -euo pipefail`). Python blocks run with that venv's python in
  the scratch folder (so `sqlite:///runs.db` is the store the `db upgrade` block made); a
  block with top-level `await` runs as `python -m asyncio` would run it. SQL blocks run
  against that store and against a migrated PostgreSQL database.
- `given <something>`: a Python block that uses the reader's own object (an agent): it runs
  after the prelude GIVEN[<something>], which builds one with the real framework and a
  scripted model (no API key); the frameworks are the ones the README's extras install.
- `operator`: the systemd steps, run as root by test_the_systemd_steps_run_in_a_scratch_root
  in a scratch root (tests/scratch_root.py); `operator, after setting [alerts] urls` runs
  after the test made that edit, as the prose asks the reader to.
- `file PATH`: the block is that file of the checkout, byte for byte.
- `ci (...)`: the test command. A test cannot run its own suite: the check is that .ci/run
  runs that very command in a fresh, activated venv (and CI runs .ci/run).
- `output ...` / `figure`: a transcript or a drawing, not run; the demo's transcript is
  compared with a real run's (the lines that do not vary: intro, table header, verdict).
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
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import text

import scratch_root
from watchdog.store.engine import make_engine

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RUNNABLE = {"sh", "bash", "python", "sql"}
KINDS = {"run", "given", "operator", "file", "ci", "output", "figure"}
BLOCK_TIMEOUT_S = 300  # one block: an install or the demo, on a loaded 2-core box

_FENCE = re.compile(r"^```([\w-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None

    @property
    def kind(self) -> str:
        if self.marker is None:
            return "run"
        return re.split(r"[\s,;(:]", self.marker, maxsplit=1)[0]

    @property
    def argument(self) -> str:
        return self.marker[len(self.kind):].strip(" ,;") if self.marker else ""

    def where(self) -> str:
        return f"README.md:{self.line} ({self.lang or 'plain'}{', ' + self.marker if self.marker else ''})"


def blocks(source: str | None = None) -> list[Block]:
    lines = (README.read_text(encoding="utf-8") if source is None else source).splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"README.md:{start + 1}: unclosed code block"
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(before)
        out.append(Block(start + 1, m.group(1), "\n".join(body) + "\n", marker.group(1) if marker else None))
        i += 1
    return out


def copy_checkout(dest: Path) -> Path:
    """What a clone of the checkout has: the tracked files, as they are in the working tree."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


# --- what the reader brings: preludes of the `given` blocks ---------------------------------------------

_LANGGRAPH = '''
import itertools
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain.agents import create_agent
from watchdog import Watchdog

@tool
def search(q: str) -> str:
    """Search the help center."""
    return f"3 articles about {q}"

class ScriptedChatModel(GenericFakeChatModel):
    """Answers from a script, no API key; create_agent binds the tools to it."""
    def bind_tools(self, tools, **kwargs):
        return self

_ids = itertools.count()

def ask_search():
    return AIMessage(content="", tool_calls=[{"name": "search", "args": {"q": "refund"}, "id": f"call_{next(_ids)}"}],
                     usage_metadata={"input_tokens": 300, "output_tokens": 20, "total_tokens": 320})

# A bound on the failure, not on the loop: a guard that does not act ends in GraphRecursionError
# after 60 steps instead of LangGraph's default 10,000 (minutes on this box).
agent = create_agent(ScriptedChatModel(messages=SCRIPT), [search]).with_config(recursion_limit=60)
inputs = {"messages": [("user", "refund order 42")]}
wd = Watchdog("sqlite:///runs.db")
'''

GIVEN = {
    "a LangGraph agent": _LANGGRAPH.replace(
        "SCRIPT", 'iter([ask_search(), AIMessage(content="Order 42: refund sent.")])'),
    # The same loop the issue met: the model asks for the same search for ever.
    "a LangGraph agent that loops": _LANGGRAPH.replace("SCRIPT", "(ask_search() for _ in itertools.count())"),
    "an Agents SDK agent": '''
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from watchdog import Watchdog

set_tracing_disabled(True)

@function_tool
def get_order(order_id: int) -> str:
    """Look an order up."""
    return f"order {order_id}: paid, 49.90 EUR"

agent = Agent(name="support-bot", instructions="Help the customer.", tools=[get_order],
              model=ScriptedModel([ModelStep(output=[function_call("get_order", {"order_id": 42}, call_id="c1")]),
                                   ModelStep(output=[assistant_message("Order 42: refund sent.")])]))
wd = Watchdog("sqlite:///runs.db")
''',
}

# `python -m asyncio` semantics for a block with a top-level await.
_ASYNC_RUNNER = '''
import ast, asyncio, sys
path = sys.argv[1]
code = compile(open(path, encoding="utf-8").read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, {"__name__": "__main__", "__file__": path})
if asyncio.iscoroutine(result):
    asyncio.run(result)
'''

_SQLITE_SCRIPT = '''
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.executescript(open(sys.argv[2], encoding="utf-8").read())
'''


def _reader_env(tmp: Path) -> dict[str, str]:
    """A fresh shell's environment: no test venv on the PATH, no store or config preset."""
    ours = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours)
    env["TMPDIR"] = str(tmp)
    return env


class Reader:
    """One reader at one shell in a scratch checkout, running the README's blocks in order."""

    def __init__(self, checkout: Path, scratch: Path, pg_url: str):
        self.checkout, self.scratch, self.pg_url = checkout, scratch, pg_url
        self.tmp = scratch / "tmp"
        self.tmp.mkdir()
        self.env = _reader_env(self.tmp)
        self.outputs: dict[int, str] = {}  # stdout + stderr, by the block's line
        self.stdouts: dict[int, str] = {}

    @property
    def python(self) -> Path:
        return self.checkout / ".venv" / "bin" / "python"

    def _run(self, argv: list[str], block: Block) -> str:
        result = subprocess.run(argv, cwd=self.checkout, env=self.env, capture_output=True, text=True,
                                errors="replace", timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{block.where()} failed (exit {result.returncode}):\n{block.text}\n" \
                                       f"--- output (tail) ---\n{output[-4000:]}"
        self.outputs[block.line] = output
        self.stdouts[block.line] = result.stdout
        return output

    def _file(self, block: Block, suffix: str, body: str) -> Path:
        path = self.scratch / f"block-{block.line}{suffix}"
        path.write_text(body, encoding="utf-8")
        return path

    def run(self, block: Block) -> str:
        if block.lang in ("sh", "bash"):
            # The shell stays open between blocks: the venv the first command activated is still active.
            script = "if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi\n" + block.text
            return self._run(["bash", "-euo", "pipefail", str(self._file(block, ".sh", script))], block)
        if block.lang == "python":
            return self._python(block)
        if block.lang == "sql":
            return self._sql(block)
        raise AssertionError(f"{block.where()}: cannot run a {block.lang!r} block")

    def _python(self, block: Block) -> str:
        prelude = ""
        if block.kind == "given":
            assert block.argument in GIVEN, f"{block.where()}: no prelude for 'given {block.argument}'"
            prelude = GIVEN[block.argument]  # its frameworks come with the README's extras (langgraph too)
        script = self._file(block, ".py", prelude + "\n" + block.text)
        if re.search(r"^\S.*\bawait\b|^\s*(result\s*=\s*)?await\b", block.text, re.M):
            runner = self._file(block, "-runner.py", _ASYNC_RUNNER)
            return self._run([str(self.python), str(runner), str(script)], block)
        return self._run([str(self.python), str(script)], block)

    def _sql(self, block: Block) -> str:
        sql = self._file(block, ".sql", block.text)
        runner = self._file(block, "-sqlite.py", _SQLITE_SCRIPT)
        out = self._run([str(self.python), str(runner), str(self.checkout / "runs.db"), str(sql)], block)
        engine = make_engine(self.pg_url)  # the contract holds for both databases
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(block.text)
        finally:
            engine.dispose()
        return out

    def cli(self, *args: str) -> str:
        exe = self.checkout / ".venv" / "bin" / "agent-watchdog"
        result = subprocess.run([str(exe), *args], cwd=self.checkout, env=self.env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"agent-watchdog {' '.join(args)}:\n{result.stdout}{result.stderr}"
        return result.stdout


# --- the tests ----------------------------------------------------------------------------------------


def test_every_block_is_runnable_or_marked():
    found = blocks()
    assert len(found) > 20, "the README parser found too few blocks"
    problems = []
    for b in found:
        if b.kind not in KINDS:
            problems.append(f"{b.where()}: unknown marker kind {b.kind!r} (known: {sorted(KINDS)})")
        elif b.kind in ("run", "given") and b.lang not in RUNNABLE:
            problems.append(f"{b.where()}: neither runnable ({sorted(RUNNABLE)}) nor marked `readme-test: ...`")
        elif b.kind == "given" and b.argument not in GIVEN:
            problems.append(f"{b.where()}: no prelude for 'given {b.argument}'")
        elif b.kind == "operator" and b.lang not in ("sh", "bash"):
            problems.append(f"{b.where()}: operator blocks are shell")
    assert problems == [], "\n".join(problems)


def test_the_parser_sees_markers_and_refuses_unmarked_text():
    sample = "intro\n\n<!-- readme-test: output -->\n```\nhello\n```\n\n```text\nno marker\n```\n\n```sh\necho hi\n```\n"
    got = blocks(sample)
    assert [(b.kind, b.lang, b.text) for b in got] == [("output", "", "hello\n"), ("run", "text", "no marker\n"),
                                                        ("run", "sh", "echo hi\n")]
    assert got[0].line == 4


def test_file_blocks_are_the_files_they_name():
    checked = 0
    for b in blocks():
        if b.kind == "file":
            assert (REPO / b.argument).read_text(encoding="utf-8") == b.text, f"{b.where()} differs from {b.argument}"
            checked += 1
    assert checked >= 1


def test_the_test_command_is_what_ci_runs():
    (ci,) = [b for b in blocks() if b.kind == "ci"]
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
    """The demo's output as the README shows it: each alert box reduced to its title."""
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
    """AGENT_WATCHDOG_REGENERATE_README=1: the test writes the demo's transcript into the README."""
    text = README.read_text(encoding="utf-8")
    marker = "<!-- readme-test: output of `agent-watchdog demo --keep /tmp/demo-cap` -->\n```\n"
    start = text.index(marker) + len(marker)
    end = text.index("```\n", start)
    README.write_text(text[:start] + trimmed_transcript(demo_output) + text[end:], encoding="utf-8")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_newcomer_runs_the_readme_top_to_bottom(tmp_path, pg_migrated):
    checkout = copy_checkout(tmp_path / "agent-watchdog")
    reader = Reader(checkout, tmp_path, pg_migrated)
    ran = []
    for b in blocks():
        if b.kind in ("run", "given"):
            reader.run(b)
            ran.append(b)
    assert {b.lang for b in ran} >= {"sh", "python", "sql"}

    # The first command ran the demo, which deleted its temporary store.
    demo = next(out for line, out in reader.outputs.items() if "agent-watchdog demo —" in out)
    assert "OK: every agent ended as expected" in demo
    assert list(reader.tmp.iterdir()) == [], "something was left in the reader's TMPDIR"
    (transcript,) = [b for b in blocks() if b.kind == "output" and "agent-watchdog demo" in b.argument]
    if _demo_fixed_lines(transcript.text) != _demo_fixed_lines(demo) and os.environ.get(
            "AGENT_WATCHDOG_REGENERATE_README") == "1":
        regenerate_demo_transcript(demo)  # then review and commit README.md
    assert _demo_fixed_lines(transcript.text) == _demo_fixed_lines(demo), (
        "the README's demo transcript is stale: rerun this test with AGENT_WATCHDOG_REGENERATE_README=1")
    assert max(len(line) for line in transcript.text.splitlines()) <= 100, "README transcript over 100 columns"

    # What the blocks recorded, read back through the CLI as the reader would.
    sql_run = json.loads(reader.cli("--db", "sqlite:///runs.db", "show", "3f2a1b0c", "--json"))
    assert (sql_run["status"], sql_run["tool_calls"], sql_run["tool_errors"]) == ("killed", 1, 1)
    with make_engine(pg_migrated).connect() as conn:
        assert conn.execute(text("SELECT status, tool_errors FROM runs WHERE id LIKE '3f2a1b0c%'")).one() == ("killed", 1)
    sdk_runs = json.loads(reader.cli("--db", "sqlite:///runs.db", "runs", "--all", "--json"))
    by_agent: dict[str, list] = {}
    for r in sdk_runs:
        by_agent.setdefault(r["agent"], []).append(r)
    # The SDK block: one completed run with its step and two tool calls.
    assert any((r["status"], r["steps"], r["tool_calls"]) == ("completed", 1, 2) for r in by_agent["support-bot"])
    # The looping LangGraph agent was stopped by the guard, and the block printed why.
    (loop_block,) = [b for b in ran if b.argument == "a LangGraph agent that loops"]
    printed = reader.stdouts[loop_block.line].strip().splitlines()
    assert printed and printed[-1] in ("loop_detected", "max_tool_calls", "max_steps"), printed[-5:]
    assert any(r["status"] == "killed" for r in by_agent["support-bot"])


def _operator_blocks() -> tuple[Block, Block]:
    ops = [b for b in blocks() if b.kind == "operator"]
    assert [b.argument for b in ops] == ["", "after setting [alerts] urls"], [b.marker for b in ops]
    return ops[0], ops[1]


def test_the_units_install_comment_is_the_readmes_steps():
    """The unit's header lists the same steps (without sudo): one of them must not drift from the other."""
    first, second = _operator_blocks()
    steps = [re.sub(r"^sudo (?!-u)", "", line.split("   #")[0].strip())
             for line in (first.text + second.text).splitlines() if line.startswith("sudo ")]
    steps = [s.replace("sudo systemctl", "systemctl") for s in steps if "check-config" not in s and "test-alert" not in s]
    header = (REPO / "systemd" / "agent-watchdog.service").read_text(encoding="utf-8").split("[Unit]")[0]
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_systemd_steps_run_in_a_scratch_root(http):
    why = scratch_root.available()
    if why:
        pytest.skip(f"a scratch root {why}")
    first, second = _operator_blocks()
    base = Path(tempfile.mkdtemp(prefix="aw-readme-root-", dir="/tmp"))
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
        # And nothing of it on this machine.
        assert not Path("/var/lib/agent-watchdog").exists() and not Path("/opt/agent-watchdog").exists()
        assert "agent-watchdog:" not in Path("/etc/passwd").read_text()
    finally:
        shutil.rmtree(base, ignore_errors=True)
