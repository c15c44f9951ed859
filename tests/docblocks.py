"""The code blocks of README.md and docs/**.md, and how each one is run or checked.

A block is a fenced code block, found with markdown-it (the parser MyST itself uses, so what the
tests see is what Sphinx renders). An HTML comment on the last non-blank line before its fence,
`<!-- docs-test: KIND ... -->`, says how it is checked. Without one a block must be

- runnable (sh, bash, python, sql): run in order, page by page (tests/system/test_docs.py; the
  README's by test_readme.py, as a newcomer with a fresh venv), or
- checkable by parsing (toml, json, yaml, javascript, typescript: tests/unit/test_docs_blocks.py;
  TOML must also be a config `watchdog.core.config` accepts).

Any other unmarked block fails. An indented code block fails too (it could hide a command). The
kinds of marker, each a reason a block is not simply run:

- `given <something>`: a Python block that uses the reader's own object (an agent): it runs after
  the prelude GIVEN[<something>], which builds one with the real framework and a scripted model.
- `operator` / `operator, after setting [alerts] urls`: the systemd steps, run as root in a
  scratch root (tests/scratch_root.py) by test_the_systemd_steps_run_in_a_scratch_root.
- `file PATH`: the block is that file of the checkout, byte for byte.
- `excerpt PATH`: the block's lines are a run of lines of that file (node checks the file's syntax).
- `readme`: the very block is in README.md, where the README's test runs it.
- `ci (...)`: the test command; .ci/run must run it verbatim in a fresh, activated venv.
- `install`: `pip install` of the project's extras; each extra named must exist in pyproject.toml
  (the test venv has them all: the `test` extra).
- `synopsis`: a command's usage; every option it names must be an option of that click command.
- `run-by TEST (...)`: the test function TEST reads this block from this page and runs it.
- `covered-by TEST (why)`: not run as written (why); TEST runs the same thing its own way.
- `mac-example`: the evidence MAC message of the example, checked against the SDK's own format.
- `output ...` / `figure ...`: a transcript or a drawing, not run (the demo's transcript is compared
  with a real run's).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from markdown_it import MarkdownIt

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
README = REPO / "README.md"
DOCS = REPO / "docs"

RUNNABLE = {"sh", "bash", "python", "sql"}
PARSED = {"toml", "json", "yaml", "javascript", "typescript"}
ALIASES = {"js": "javascript", "ts": "typescript", "yml": "yaml", "shell": "sh", "py": "python"}
KINDS = {"run", "given", "operator", "file", "excerpt", "readme", "ci", "install", "synopsis", "run-by",
         "covered-by", "mac-example", "output", "figure"}

_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: README.md, docs/howto/exec.md
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None

    @property
    def kind(self) -> str:
        if self.marker is None:
            return "run" if self.lang in RUNNABLE else ("parse" if self.lang in PARSED else "unmarked")
        return re.split(r"[\s,;(:]", self.marker, maxsplit=1)[0]

    @property
    def argument(self) -> str:
        return self.marker[len(self.kind):].strip(" ,;") if self.marker else ""

    @property
    def reason(self) -> str:
        """The text in parentheses after the marker's first word (covered-by TEST (why))."""
        m = re.search(r"\((.+)\)\s*$", self.argument)
        return m.group(1).strip() if m else ""

    @property
    def target(self) -> str:
        """The marker's first argument: a test name, a path."""
        return self.argument.split(" ", 1)[0].strip() if self.argument else ""

    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'plain'}{', ' + self.marker if self.marker else ''})"


def pages() -> list[Path]:
    """README.md and every Markdown page of docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def rel(path: Path) -> str:
    return path.resolve().relative_to(REPO).as_posix()


_MD = MarkdownIt("commonmark").enable("table")


def parse(source: str, page: str = "<text>") -> tuple[list[Block], list[int]]:
    """The fenced blocks of a page, and the lines of its indented code blocks (refused)."""
    lines = source.splitlines()
    found, indented = [], []
    for tok in _MD.parse(source):
        if tok.type == "code_block":
            indented.append(tok.map[0] + 1)
        if tok.type != "fence" or tok.info.strip().startswith("{"):  # {toctree} and other MyST directives
            continue
        start = tok.map[0]
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(before)
        lang = tok.info.strip().split()[0].lower() if tok.info.strip() else ""
        found.append(Block(page, start + 1, ALIASES.get(lang, lang), tok.content, marker.group(1) if marker else None))
    return found, indented


@lru_cache(maxsize=None)
def _page_blocks(path: Path) -> tuple[Block, ...]:
    return tuple(parse(path.read_text(encoding="utf-8"), rel(path))[0])


def blocks(path: Path | None = None) -> list[Block]:
    """The blocks of one page, or of every page."""
    if path is not None:
        return list(_page_blocks(path.resolve()))
    return [b for p in pages() for b in _page_blocks(p.resolve())]


def extras() -> dict[str, list[str]]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def defines_test(name: str) -> list[Path]:
    """The test files under tests/ that define the test function NAME."""
    pattern = re.compile(rf"^\s*(async\s+)?def {re.escape(name)}\(", re.M)
    return [p for p in (REPO / "tests").rglob("*.py") if pattern.search(p.read_text(encoding="utf-8", errors="replace"))]


def github_slug(heading: str) -> str:
    """A heading's anchor as GitHub and MyST (myst_heading_anchors) spell it."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name in a page: its headings' slugs (also with _ as -, as docutils)."""
    out = set()
    for tok_i, tok in enumerate(toks := _MD.parse(path.read_text(encoding="utf-8"))):
        if tok.type == "heading_open":
            slug = github_slug(toks[tok_i + 1].content.replace("`", ""))
            out |= {slug, slug.replace("_", "-")}
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image of a page."""
    out = []
    for tok in _MD.parse(path.read_text(encoding="utf-8")):
        if tok.type != "inline" or not tok.children:
            continue
        for child in tok.children:
            if child.type == "link_open":
                out.append((tok.map[0] + 1, child.attrs["href"]))
            elif child.type == "image":
                out.append((tok.map[0] + 1, child.attrs["src"]))
    return out


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
