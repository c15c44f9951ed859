"""A reader of the documentation: runs a page's blocks in order, in a scratch copy of the checkout,
as one person at one shell would (test_readme.py for the README, tests/system/test_docs.py for
docs/). Which blocks run and why the others do not: tests/docblocks.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from docblocks import GIVEN, REPO, Block
from watchdog.store.engine import make_engine

BLOCK_TIMEOUT_S = 300  # one block: an install or the demo, on a loaded 2-core box


def copy_checkout(dest: Path) -> Path:
    """What a clone of the checkout has: the tracked files, as they are in the working tree."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


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


def _reader_env(tmp: Path, venv_bin: Path | None) -> dict[str, str]:
    """A fresh shell's environment: no store or config preset; on the PATH no test venv (the README's
    reader makes their own) or the test venv first (a docs page's reader has installed the package
    with every extra the pages name: the `test` extra has them all)."""
    ours = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG",
                        "AGENT_WATCHDOG_RUN", "AGENT_WATCHDOG_SOCKET")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours]
    env["PATH"] = os.pathsep.join(([str(venv_bin)] if venv_bin else []) + path)
    env["TMPDIR"] = str(tmp)
    return env


class Reader:
    """One reader at one shell in a scratch checkout, running a page's blocks in order.

    venv_bin None: the README's newcomer, whose first command makes and activates `.venv` in the
    checkout (it stays active for the later shell blocks). Else that venv's bin directory is first on
    the PATH: a docs page's reader, who installed the package already."""

    def __init__(self, checkout: Path, scratch: Path, pg_url: str, venv_bin: Path | None = None):
        self.checkout, self.scratch, self.pg_url, self.venv_bin = checkout, scratch, pg_url, venv_bin
        self.tmp = scratch / "tmp"
        self.tmp.mkdir()
        self.env = _reader_env(self.tmp, venv_bin)
        self.outputs: dict[int, str] = {}  # stdout + stderr, by the block's line
        self.stdouts: dict[int, str] = {}

    @property
    def bin(self) -> Path:
        return self.venv_bin or self.checkout / ".venv" / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

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
        path = self.scratch / f"block-{Path(block.page).stem}-{block.line}{suffix}"
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
            prelude = GIVEN[block.argument]  # its frameworks come with the pages' extras (langgraph too)
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
        exe = self.bin / "agent-watchdog"
        result = subprocess.run([str(exe), *args], cwd=self.checkout, env=self.env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"agent-watchdog {' '.join(args)}:\n{result.stdout}{result.stderr}"
        return result.stdout
