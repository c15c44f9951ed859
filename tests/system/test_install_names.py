"""No tracked file tells anyone to install `agent-watchdog` by name.

That name on PyPI belongs to an unrelated project: `pip install 'agent-watchdog[langchain]'`
fetches a stranger's code. Ours is the distribution `agent-watchdog-daemon`, or the
checkout itself (`pip install '.[langchain]'`).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SELF = "tests/system/test_install_names.py"

# PyPI normalises -, _ and . alike: all three spell the stranger's project.
_THEIRS = r"(?<![\w./-])['\"]?agent[-_.]watchdog(?![\w.-]*\w)"
_SPEC = re.compile(_THEIRS + r"['\"]?\s*(\[|[=<>~!]=|[<>]\s*\d)")  # agent-watchdog[extra], agent-watchdog>=0.1
# Between `install` and the name only options and other requirements (they carry punctuation:
# -q, '.[x]', pkg>=1), not prose such as "from a checkout of agent-watchdog".
_ARGS = r"(?:\s+(?:-\S+|\S*[./\[=<>'\"]\S*))*\s+"
_INSTALL = re.compile(r"\b(pip3?|pipx|uv|poetry|pdm|conda|mamba)\b(?:\s+\S+)*?\s+(install|add)" + _ARGS + _THEIRS)


def offending(line: str) -> bool:
    return bool(_SPEC.search(line) or _INSTALL.search(line))


def test_the_check_catches_what_it_is_for():
    bad = [
        "pip install 'agent-watchdog[langchain]'",
        "pip install agent-watchdog",
        "python -m pip install -q agent_watchdog",
        "sudo /opt/x/bin/pip install --upgrade agent-watchdog  # old",
        'dependencies = ["agent-watchdog>=0.1"]',
        "uv add agent.watchdog",
        "pip install \"agent-watchdog[postgres,metrics]\"",
    ]
    good = [
        "pip install '.[langchain]'",
        "pip install 'agent-watchdog-daemon[langchain]'",
        "python -m pip install agent-watchdog-daemon",
        "sudo /opt/agent-watchdog/venv/bin/pip install '.[postgres,metrics]'",
        "useradd --home-dir /var/lib/agent-watchdog agent-watchdog",
        "agent-watchdog --config /etc/agent-watchdog/config.toml db upgrade",
        "from agent_watchdog import nothing  # an import is no install",
        "pip install '.[langchain]' from a checkout of agent-watchdog",
    ]
    assert [line for line in bad if not offending(line)] == []
    assert [line for line in good if offending(line)] == []


def test_no_tracked_file_installs_the_unrelated_agent_watchdog():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    paths = [p for p in files.decode().split("\0") if p]
    assert {"README.md", "pyproject.toml", SELF} <= set(paths)  # the listing is the checkout's
    found = []
    for rel in paths:
        if rel == SELF:  # its examples of what is refused, on purpose
            continue
        try:
            text = (REPO / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if offending(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == [], "install by the unrelated name (use '.[extra]' or agent-watchdog-daemon):\n" + "\n".join(found)
