"""Every test file a page, a comment or a docstring names exists: the tests moved into unit/,
store/ and system/ (issue 21), and a note that sends a reader to tests/test_x.py sends them nowhere.
Pure: reads the repository's text files only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHERE = ["README.md", ".ci/run", "docs", "migrations", "contrib", "systemd", "watchdog", "examples", "sql",
         "benchmarks", "tests"]
SUFFIXES = {".md", ".py", ".toml", ".yml", ".yaml", ".service", ".sql", ".txt", ""}
NAMED = re.compile(r"\btests/[\w/]+\.py\b")
HYPOTHETICAL = {"tests/agents.py"}  # agent_procs.py explains why there is no such file


def _texts() -> list[Path]:
    out = []
    for name in WHERE:
        top = ROOT / name
        paths = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        out += [p for p in paths if p.suffix in SUFFIXES and "node_modules" not in p.parts
                and "__pycache__" not in p.parts and p != Path(__file__).resolve()]  # not its own examples
    return out


def test_every_test_file_named_exists():
    missing = []
    for path in _texts():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in NAMED.finditer(text):
            if m.group(0) not in HYPOTHETICAL and not (ROOT / m.group(0)).is_file():
                line = text.count("\n", 0, m.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)}")
    assert not missing, "named but not there (moved into tests/unit, store or system?):\n" + "\n".join(missing)


def test_the_check_sees_the_names_it_is_for():
    assert NAMED.findall("see tests/system/test_readme.py::test_x and tests/test_gone.py") == [
        "tests/system/test_readme.py", "tests/test_gone.py"]
    assert any("tests/system/test_readme.py" in p.read_text(encoding="utf-8") for p in _texts()
               if p.name == "run")
