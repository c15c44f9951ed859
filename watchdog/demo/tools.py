"""The demo's tool catalogue: five tools over a few files the demo writes in its folder.

Two of them are broken on purpose, the way real tools break: `verify_iban`
stands for an upstream API that answers 500 to everything, `scan_archive` for a
call with no timeout whose peer never answers. The others are honest and
deterministic, so every run of the demo sees the same results (and the same
token counts, hence the same euros).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SEARCH_MAX_HITS = 3
SEARCH_LINE_MAX = 90
IBAN_LATENCY_S = 0.05  # the 500 arrives after a round trip, like a real one

# What the demo writes, relative to its files folder. errors.log carries the
# answer the healthy agents look for; access.log is big so reading it costs.
FILES = {
    "errors.log": "\n".join([
        "2025-03-14 09:12:01 INFO  scheduler: 12 workers up",
        "2025-03-14 09:12:07 WARN  worker 3: queue depth 840 above 500",
        "2025-03-14 09:13:44 ERROR worker 7: upstream payments-api timed out after 30000 ms",
        "2025-03-14 09:13:44 ERROR worker 7: refund R-1042 left in state pending",
        "2025-03-14 09:14:02 WARN  worker 7: retry 1/3 for refund R-1042",
        "2025-03-14 09:14:33 ERROR worker 7: retry 1/3 failed: 500 Internal Server Error",
        "2025-03-14 09:15:10 INFO  scheduler: worker 7 restarted",
    ]) + "\n",
    "access.log": "\n".join(
        f'10.0.{i % 7}.{20 + i} - - [14/Mar/2025:09:{10 + i // 6:02d}:{(i * 7) % 60:02d}] '
        f'"{("GET", "POST")[i % 2]} /api/v2/{("refunds", "invoices", "customers", "payments")[i % 4]}/{1000 + i * 3} '
        f'HTTP/1.1" {(200, 200, 201, 404, 500, 200)[i % 6]} {512 + i * 37} "-" "billing-agent/1.{i % 4}"'
        for i in range(36)
    ) + "\n",
    "notes.txt": "Remember to rotate your logs.\nThe payments-api team is on call this week (#payments-oncall).\n",
    "archive/README": "Monthly log archives. scan_archive indexes them (slow).\n",
}


class ToolError(Exception):
    """A tool failed. The message is written for the model: it says what to do next."""


class UpstreamError(ToolError):
    """The upstream service behind a tool answered with an HTTP error."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: dict  # name -> one-line description (enough for a prompt, and for token counts)
    read_only: bool
    fn: Callable


def write_files(root: Path) -> None:
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


class Catalogue:
    """The tools of one agent process, bound to the demo's files folder."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.tools = {t.name: t for t in (
            Tool("list_files", "List the files in a folder, with their sizes.", {"dir": "folder, default ."},
                 True, self.list_files),
            Tool("read_file", "Read a text file.", {"path": "file path"}, True, self.read_file),
            Tool("search", "Find the lines of every file that contain a word.", {"query": "word to look for"},
                 True, self.search),
            Tool("verify_iban", "Check a bank account number with the payments API.", {"iban": "the IBAN"},
                 False, self.verify_iban),
            Tool("scan_archive", "Index the monthly log archives (slow).", {"path": "archive folder"},
                 True, self.scan_archive),
        )}

    def schema(self) -> list[dict]:
        """What the model is told about the tools (it is part of every prompt, so it costs tokens)."""
        return [{"name": t.name, "description": t.description, "parameters": t.params} for t in self.tools.values()]

    def _path(self, rel: str) -> Path:
        path = (self.root / rel).resolve()
        if path != self.root and self.root not in path.parents:
            raise ToolError(f"{rel}: outside the working folder")
        return path

    def list_files(self, dir: str = ".") -> str:  # noqa: A002 — the tool's public parameter name
        folder = self._path(dir)
        if not folder.is_dir():
            raise ToolError(f"no such folder: {dir}. Call list_files with no arguments to see the top folder.")
        entries = sorted(folder.iterdir())
        return "\n".join(f"{p.name}/" if p.is_dir() else f"{p.name}  {p.stat().st_size} bytes" for p in entries)

    def read_file(self, path: str) -> str:
        file = self._path(path)
        if not file.is_file():
            # Written for a reader: the model can act on it (the `recover` agent does).
            raise FileNotFoundError(f"no such file: {path}. Call list_files to see what exists.")
        return file.read_text(encoding="utf-8")

    def search(self, query: str) -> str:
        hits = []
        for file in sorted(p for p in self.root.rglob("*") if p.is_file()):
            for line in file.read_text(encoding="utf-8").splitlines():
                if query.lower() in line.lower():
                    hits.append(f"{file.relative_to(self.root)}: {line[:SEARCH_LINE_MAX]}")
        if not hits:
            return f"no line contains {query!r}"
        more = f"\n(+{len(hits) - SEARCH_MAX_HITS} more)" if len(hits) > SEARCH_MAX_HITS else ""
        return "\n".join(hits[:SEARCH_MAX_HITS]) + more

    def verify_iban(self, iban: str) -> str:
        time.sleep(IBAN_LATENCY_S)
        raise UpstreamError("500 Internal Server Error")

    def scan_archive(self, path: str = "archive") -> str:
        # No timeout anywhere: the classic hang. Only a signal ends this process now.
        threading.Event().wait()
        return "unreachable"
