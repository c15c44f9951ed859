#!/usr/bin/env python3
"""Merge modules that are one concept split thin (issue 34): a re-runnable rewrite of the tree.

Issue 34 measures the daemon's shape by the files one tool call crosses from the SDK to the
delivered alert (benchmarks/walk_files.py). Many of them were one concept split into files of
9 to 90 lines, or concepts that always travel together; GROUPS names them, per package, and this
tool merges each group into one module. It is the store's merge (which made watchdog/store/ by what
it stores, from 48 modules; that first table is in this file's history) generalized to every package.

Run from the repository root on a checkout where the old modules are still there (main, or main
with other branches merged into it):

    python tools/merge_modules.py            # merge, rewrite every use, then the self-check
    python tools/merge_modules.py --dry-run  # print the plan and the collisions, change nothing
    python tools/merge_modules.py --check    # the self-check only
    python tools/merge_modules.py --only watchdog.core   # only the groups of these packages

What it does, per group: the modules are concatenated into the new one (one docstring made of
theirs, one `from __future__`, their top-level imports and `if TYPE_CHECKING:` imports
deduplicated, imports of each other dropped at any depth, the parts ordered so that a part comes
after those it imports, private names that collide renamed `_<old module>_<name>`, public ones by
RENAMES), written over the first part (`git mv`, so its history follows) and the others `git rm`'d.
Then every import and attribute use in watchdog/, tests/, benchmarks/, migrations/, tools/ and the
docs is rewritten (`from watchdog.core import scrub` -> `text`, `scrub.scrub(` -> `text.scrub(`,
`from watchdog.daemon.tick.locked import note` -> `... tick.batch import note`), every dotted or
path mention (`watchdog.core.scrub`, `watchdog/daemon/tick/locked.py`, `tick/locked.py`) in text
(in Python files: the short forms only in comments and strings), the complexity baseline, the
design page's map of the store, and the lists of pyproject.toml (import-linter's contracts,
mypy's strict modules) lose the duplicates the renames made.

It fails loudly, before writing anything, on what it cannot resolve: two public names (add one to
RENAMES), a name one part defines and another imports, one local name bound to two things, a
sibling module name that the part also binds to something else, a group only partly there.
A group whose parts are gone already is skipped, so a second run changes nothing.

What the SDK imports is merged only with modules as light (the self-check imports
`watchdog.client` in a fresh interpreter and fails if the daemon's dependencies appear), and the
modules the other branches of issue 34 were reshaping (the ticker, the enforcer, the change feed,
the ladder, the pre-filter, the tool watch) are merged around, not into.
"""

from __future__ import annotations

import argparse
import ast
import io
import keyword
import os
import re
import subprocess
import sys
import textwrap
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# package -> {new module: (its one-line summary, the old modules in order: the first one's file becomes it)}
TABLES: dict[str, dict[str, tuple[str, list[str]]]] = {
    "watchdog.core": {
        "text": ("Text every surface shares, made safe: a URL without its secret, a duration, secrets scrubbed "
                 "out of free text, and a writer's words marked and bounded in an alert.",
                 ["text", "scrub", "marked"]),
        "outcomes": ("What the daemon tells a human: the table of outcomes and the one function that words each, "
                     "the kinds of alert with their keys and urgency, and how long a title and a body may be.",
                     ["outcomes", "alert_kinds", "alert_text"]),
        "messages": ("Alert texts and the numbers they quote: a run's facts, titles and bodies, burn rates and "
                     "run-out times.", ["messages", "forecast"]),
        "policies": ("The judge's pure rules: a run snapshot and its budgets in, verdicts out; which breaches "
                     "pause and what `resume` grants.", ["policies", "pause"]),
        "lifecycle": ("The run's vocabulary: statuses, stop reasons, kill modes, ladder stages, circuit states, "
                      "and what a record may hold.", ["lifecycle", "records"]),
        "periods": ("Time: the wall clock (timezone-aware UTC) and the calendar periods of the period budgets.",
                    ["periods", "clock"]),
    },
    "watchdog.sdk": {
        "obey": ("What a run obeys on the SDK side: its parent's budgets and status, a stop, a pause held until "
                 "a human answers.", ["children", "pause"]),
    },
    "watchdog.store": {
        "alerts": ("One outcome in the store: its audit row (`interventions`: written, believed, the quarantine's "
                   "reads), its alert (`alerts` by dedupe key), and the one verb that announces it.",
                   ["alerts", "interventions"]),
        "run_rows": ("A run's row: its status moves, the tick's small reads of it, its children, its times after "
                     "a jump of the store's clock, and its stop.", ["run_rows", "stops"]),
        "scan": ("The tick's reads of active runs and new events, each row or event read so that one bad one "
                 "costs only itself.", ["scan", "isolated"]),
    },
    "watchdog.daemon.alerts": {
        "outbox": ("Alert delivery from the outbox table, and what the daemon itself delivered, checked before "
                   "each send.", ["outbox", "delivered"]),
    },
    "watchdog.daemon.leases": {
        "cluster": ("Several daemons on one store: whose runs each one judges, and the cluster's duties (the "
                    "day partitions of `events` among them).", ["cluster", "partition_duty"]),
    },
    "watchdog.daemon.money": {
        "moneytick": ("One tick's money work, in its enforced order: first price the steps the SDK could not, "
                      "then judge.", ["moneytick", "backfill"]),
    },
    "watchdog.daemon.stops": {
        "exectree": ("Exec'd runs' trees: the descendants the daemon has seen, pinned in its memory, and the "
                     "tree taken down when exec is gone.", ["exectree", "treememory"]),
    },
    "watchdog.daemon.tick": {
        "judging": ("The tick's judgement of one run's row: the transaction it is judged in (a SAVEPOINT per "
                    "run), a lock another session holds on it, what the tick believes of it, its pause or stop "
                    "over budget, and the bounds it keeps when it cannot be judged.",
                    ["believe", "pause", "backstop", "batch", "locked"]),
    },
    "watchdog.daemon.trust": {
        "scan": ("What the tick knows of active runs, from evidence it can trust: the run rows' counters, the "
                 "daemon's own per-run counters folded from the events, and what makes a row or an event "
                 "unusable.", ["scan", "evidence", "isolation"]),
    },
}
# (old module, public name) -> its name in the new module, where two parts define the same name
RENAMES: dict[tuple[str, str], str] = {}
# Not merged, on purpose: tickstate is what the TickContext names (type-only), and what imports the
# context may not share its module (a cycle, tests/unit/test_import_cycles.py); tickread and the
# judging parts all do. killer: tests/system/test_layout.py imports it by name in a string.
# Left alone: the modules other branches of issue 34 reshape (merged after them, if at all).
UNTOUCHED = {"watchdog.daemon.tick.ticker", "watchdog.daemon.tick.toolwatch", "watchdog.daemon.tick.prefilter",
             "watchdog.daemon.stops.ladder", "watchdog.daemon.stops.enforcer", "watchdog.store.changes"}
# Docs figures that list a package's modules by name in their first FIGURE_COLUMN characters.
FIGURES = {"watchdog/store/": "watchdog.store"}
FIGURE_COLUMN = 38
# Run after the rewrite: fast, and each one checks something a merge can break.
CHECK_TESTS = ["tests/unit/test_import_cycles.py", "tests/unit/test_complexity.py",
               "tests/unit/test_store_import_names.py", "tests/unit/test_named_test_files.py",
               "tests/system/test_sdk_import.py", "tests/system/test_layout.py"]
HEAVY = {"psutil", "apprise", "apscheduler", "click", "alembic"}
SDK_FORBIDDEN = ("watchdog.daemon", "watchdog.cli", "watchdog.gateways", "watchdog.integrations", "watchdog.web",
                 "watchdog.demo")
TEXT_SUFFIXES = {".py", ".md", ".rst", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".sql", ".sh", ".mako"}
WALKED = ["watchdog", "tests", "benchmarks", "docs", "migrations", "tools", "examples", "README.md",
          "pyproject.toml", "CHANGELOG.md", ".ci", ".importlinter", "sql", "contrib", "systemd"]
SELF = Path(__file__).resolve()


@dataclass(frozen=True)
class Group:
    pkg: str
    new: str  # leaf name
    summary: str
    parts: list[str]  # leaf names

    @property
    def full(self) -> str:
        return f"{self.pkg}.{self.new}"

    def fulls(self) -> list[str]:
        return [f"{self.pkg}.{p}" for p in self.parts]


def groups(only: list[str] | None = None) -> list[Group]:
    out = [Group(pkg, new, summary, parts) for pkg, table in TABLES.items() for new, (summary, parts) in table.items()
           if not only or pkg in only]
    for g in out:
        if set(g.fulls()) & UNTOUCHED:
            sys.exit(f"{g.full}: merges {set(g.fulls()) & UNTOUCHED}, which UNTOUCHED keeps apart")
    return out


def mod_path(full: str) -> Path:
    return ROOT.joinpath(*full.split(".")).with_suffix(".py")


def old_names(gs: list[Group]) -> list[str]:
    return sorted({f for g in gs for f in g.fulls()} - {g.full for g in gs})


# -- reading one module ---------------------------------------------------------------------------------------


@dataclass
class Part:
    name: str  # leaf
    full: str
    doc: str
    imports: list[ast.stmt]  # top level, anywhere in the module
    tc_imports: list[ast.stmt]  # under a top-level `if TYPE_CHECKING:` that holds imports only
    body: str
    all_names: list[str] | None
    sibling_imports: list[ast.ImportFrom]  # imports of a sibling below the top level (dropped from the body)
    defined: set[str] = field(default_factory=set)
    bound_locally: set[str] = field(default_factory=set)  # bound other than by an import: defs, args, targets
    needs: set[str] = field(default_factory=set)  # siblings it imports at run time (for the order)
    one_liners: dict[str, str] = field(default_factory=dict)  # name -> its one-line top-level assignment


def _targets(node: ast.stmt) -> set[str]:
    names: set[str] = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    names.add(n.id)
    elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):  # `if TYPE_CHECKING:`, a backend switch
        for s in node.body + node.orelse + getattr(node, "finalbody", []):
            names |= _targets(s)
        for h in getattr(node, "handlers", []):
            for s in h.body:
                names |= _targets(s)
    return names


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and not node.orelse and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def _sibling_of(imp: ast.ImportFrom, pkg: str, siblings: set[str]) -> tuple[list[ast.alias], list[ast.alias]]:
    """(aliases that name a sibling or come from one, the others)."""
    if imp.level or not imp.module:
        return [], list(imp.names)
    if imp.module == pkg:
        sib = [a for a in imp.names if a.name in siblings]
        return sib, [a for a in imp.names if a.name not in siblings]
    if imp.module.startswith(pkg + ".") and imp.module[len(pkg) + 1:].split(".")[0] in siblings:
        return list(imp.names), []
    return [], list(imp.names)


def read_part(pkg: str, name: str, siblings: set[str], src: str | None = None) -> Part:
    """One part as merge_group needs it; `src` is its file's text unless given (tests give it)."""
    full = f"{pkg}.{name}"
    src = mod_path(full).read_text() if src is None else src
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    stmts = list(tree.body)
    doc = ""
    drop: set[int] = set()  # 0-based line numbers left out of the body
    put: dict[int, str] = {}  # 0-based line -> text written instead of it (the rest of its statement dropped)
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant) \
            and isinstance(stmts[0].value.value, str):
        raw = ast.get_source_segment(src, stmts[0]) or ""
        doc = re.sub(r'^[rRuU]?("""|\'\'\')|("""|\'\'\')$', "", raw.strip())  # as written: escapes kept
        drop |= set(range(stmts[0].lineno - 1, stmts[0].end_lineno or stmts[0].lineno))
        stmts = stmts[1:]
    imports: list[ast.stmt] = []
    tc_imports: list[ast.stmt] = []
    all_names: list[str] | None = None

    def span(s: ast.stmt) -> set[int]:
        return set(range(s.lineno - 1, s.end_lineno or s.lineno))

    for s in stmts:
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            imports.append(s)
            drop |= span(s)
        elif _is_type_checking(s) and all(isinstance(b, (ast.Import, ast.ImportFrom)) for b in s.body):
            tc_imports += s.body
            drop |= span(s)
        elif isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in s.targets):
            all_names = list(ast.literal_eval(s.value))
            drop |= span(s)
    top = {id(s) for s in imports} | {id(s) for s in tc_imports}
    sibling_imports: list[ast.ImportFrom] = []
    for node in ast.walk(tree):
        for block_name in ("body", "orelse", "finalbody"):
            block = getattr(node, block_name, None)
            if not isinstance(block, list) or node is tree:
                continue
            gone = []
            for s in block:
                if not isinstance(s, ast.ImportFrom) or id(s) in top:
                    continue
                sib, rest = _sibling_of(s, pkg, siblings)
                if not sib:
                    continue
                sibling_imports.append(s)
                if rest:
                    indent = " " * s.col_offset
                    put[s.lineno - 1] = _from_line(indent, s.module or "", [(a.name, a.asname) for a in rest]) + "\n"
                    drop |= span(s) - {s.lineno - 1}
                else:
                    gone.append(s)
                    drop |= span(s)
            if gone and len(gone) == len([s for s in block if not isinstance(s, ast.Pass)]):
                put[gone[0].lineno - 1] = " " * gone[0].col_offset + "pass\n"
                drop.discard(gone[0].lineno - 1)
    body = "".join(put.get(i, ln) for i, ln in enumerate(lines) if i not in drop or i in put)
    body = re.sub(r"\n{4,}", "\n\n\n", body.strip("\n") + "\n")
    part = Part(name, full, doc, imports, tc_imports, body, all_names, sibling_imports)
    for s in stmts:
        if not isinstance(s, (ast.Import, ast.ImportFrom)) and not _is_type_checking(s):
            part.defined |= _targets(s)
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and s.lineno == s.end_lineno and s.col_offset == 0:
            part.one_liners[s.targets[0].id] = lines[s.lineno - 1].rstrip("\n")
    part.defined.discard("__all__")
    part.bound_locally = _bound_in_scopes(tree)
    for imp in imports:
        if isinstance(imp, ast.ImportFrom):
            sib, _ = _sibling_of(imp, pkg, siblings)
            if sib:
                part.needs |= {a.name for a in sib} if imp.module == pkg else {imp.module[len(pkg) + 1:].split(".")[0]}
    return part


def _bound_in_scopes(tree: ast.Module) -> set[str]:
    """Names bound in the module or a function (defs, parameters, assignment targets); a class's
    own attributes (`delivered: int = 0`) are not: they shadow no module in a method."""
    out: set[str] = set()

    def visit(node: ast.AST, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not in_class:
                    out.add(child.name)
                visit(child, isinstance(child, ast.ClassDef))
            elif isinstance(child, ast.arg):
                out.add(child.arg)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store) and not in_class:
                out.add(child.id)
            elif isinstance(child, ast.Lambda):
                visit(child, False)
            else:
                visit(child, in_class if isinstance(child, (ast.stmt, ast.expr, ast.arguments)) else False)
    visit(tree, False)
    return out


def _bindings(imp: ast.stmt) -> list[tuple[str, str]]:
    out = []
    if isinstance(imp, ast.Import):
        for a in imp.names:
            out.append((a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0]))
    elif isinstance(imp, ast.ImportFrom):
        for a in imp.names:
            out.append((a.asname or a.name, f"{'.' * imp.level}{imp.module or ''}:{a.name}"))
    return out


# -- token edits ----------------------------------------------------------------------------------------------


def _tokens(src: str) -> list[tokenize.TokenInfo]:
    return [t for t in tokenize.generate_tokens(io.StringIO(src).readline)
            if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE)]


def apply_edits(src: str, edits: list[tuple[int, int, int, str]]) -> str:
    """edits: (row 1-based, col start, col end, replacement), on one line each."""
    lines = src.splitlines(keepends=True)
    for row, c0, c1, new in sorted(set(edits), key=lambda e: (e[0], e[1]), reverse=True):
        ln = lines[row - 1]
        lines[row - 1] = ln[:c0] + new + ln[c1:]
    return "".join(lines)


Modules = dict[str, tuple[str | None, dict[str, str]]]


def rename_in(src: str, names: dict[str, str], modules: Modules) -> str:
    """Rename bare NAMEs (not attributes, not keyword arguments) by `names`; for `modules` (local module
    binding -> (its new binding or None for "now this module", attribute renames)), rewrite `mod.attr`."""
    toks = _tokens(src)
    edits: list[tuple[int, int, int, str]] = []
    for i, t in enumerate(toks):
        if t.type == tokenize.STRING and modules and re.match(r"[rRbB]?[fF]", t.string):
            edits += _in_fstring(t, modules)
            continue
        if t.type != tokenize.NAME or keyword.iskeyword(t.string):
            continue
        prev = toks[i - 1] if i else None
        if prev is not None and prev.type == tokenize.OP and prev.string == ".":
            continue
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if t.string in modules and nxt is not None and nxt.string == "." and i + 2 < len(toks) \
                and toks[i + 2].type == tokenize.NAME:
            binding, attrs = modules[t.string]
            attr = toks[i + 2]
            new_attr = attrs.get(attr.string, attr.string)
            if binding is None:  # a sibling merged into this very module: `scrub.scrub` -> `scrub`
                edits.append((t.start[0], t.start[1], t.end[1], ""))
                edits.append((nxt.start[0], nxt.start[1], nxt.end[1], ""))
            elif binding != t.string:
                edits.append((t.start[0], t.start[1], t.end[1], binding))
            if new_attr != attr.string:
                edits.append((attr.start[0], attr.start[1], attr.end[1], new_attr))
            continue
        if t.string in modules and not (nxt is not None and nxt.string == "=" and prev is not None
                                        and prev.string in ("(", ",")):
            # the module as a value (`monkeypatch.setattr(locked, ...)`): the caller's binding is the
            # old name's only one (else it was kept as an alias), so every use of it is the module
            # (In a merged module, a sibling's name not followed by a dot is a class attribute or the like:
            # left alone; a use of the module itself would be an undefined name, which mypy reports.)
            binding, _ = modules[t.string]
            if binding is not None and binding != t.string:
                edits.append((t.start[0], t.start[1], t.end[1], binding))
            continue
        if t.string in names and not (nxt is not None and nxt.string == "=" and prev is not None
                                      and prev.string in ("(", ",")):
            edits.append((t.start[0], t.start[1], t.end[1], names[t.string]))
    return apply_edits(src, edits)


def _in_fstring(t: tokenize.TokenInfo, modules: Modules) -> list[tuple[int, int, int, str]]:
    """Python 3.11 tokenizes an f-string as one STRING: `{migrate.current(e)}` is rewritten inside
    its braces (the literal text around them is left as it is)."""
    def field_(m: re.Match[str]) -> str:
        def one(a: re.Match[str]) -> str:
            binding, attrs = modules[a.group(1)]
            attr = attrs.get(a.group(2), a.group(2))
            return attr if binding is None else f"{binding}.{attr}"
        pat = r"(?<![\w.])(" + "|".join(map(re.escape, modules)) + r")\.(\w+)"
        return re.sub(pat, one, m.group(0))
    new = re.sub(r"\{[^{}]*\}", field_, t.string)
    if new == t.string:
        return []
    if t.start[0] != t.end[0]:
        sys.exit(f"line {t.start[0]}: a multi-line f-string names a merged module: rewrite it by hand")
    return [(t.start[0], t.start[1], t.end[1], new)]


# -- merging a group ------------------------------------------------------------------------------------------


def _order(parts: list[Part]) -> list[Part]:
    """The parts in their order, each after the siblings it imports at run time (module-level code
    may use what they define); a circle between them keeps the order given."""
    out: list[Part] = []
    left = list(parts)
    while left:
        ready = [p for p in left if not (p.needs - {q.name for q in out} - {p.name}) & {q.name for q in left}]
        nxt = ready[0] if ready else left[0]
        out.append(nxt)
        left.remove(nxt)
    return out


def merge_group(g: Group, parts: list[Part]) -> tuple[str, dict[tuple[str, str], str]]:
    """The new module's source, and every (old module, name) -> new name it renamed."""
    pkg = g.pkg
    siblings = {p.name for p in parts}
    owner: dict[str, str] = {}
    renamed: dict[tuple[str, str], str] = {}
    by_name = {p.name: p for p in parts}
    for p in parts:
        for n in sorted(p.defined):
            new_name = RENAMES.get((p.full, n), n)
            first = by_name.get(owner.get(new_name, ""))
            if first is not None and first is not p and n in p.one_liners \
                    and p.one_liners[n] == first.one_liners.get(n):
                # the same line in both (`log = logging.getLogger(__name__)`): kept once
                p.body = re.sub(rf"(?m)^{re.escape(p.one_liners[n])}\n", "", p.body, count=1)
                continue
            if new_name in owner and owner[new_name] != p.name:
                if n.startswith("__") and n.endswith("__"):
                    sys.exit(f"{g.full}: {p.name}.{n} and {owner[new_name]}.{n}: two module dunders, merge by hand")
                loggers = [q.one_liners.get(n, "") for q in (p, first)]
                if not n.startswith("_") and all(re.match(r"\w+ = logging\.getLogger\(", ln) for ln in loggers):
                    # two log channels (`watchdog.outbox`, `watchdog.alerts`): each part keeps its own
                    new_name = f"_{p.name}_{n}"
                elif not n.startswith("_"):
                    sys.exit(f"{g.full}: {p.full}.{n} collides with {owner[new_name]}.{n}: add it to RENAMES")
                else:
                    new_name = f"_{p.name}{n}"
                if new_name in owner or any(new_name in q.defined for q in parts):
                    sys.exit(f"{g.full}: renaming {p.name}.{n} to {new_name} collides again: add it to RENAMES")
            owner[new_name] = p.name
            if new_name != n:
                renamed[(p.full, n)] = new_name
    defined_of = {p.name: p.defined for p in parts}
    local_alias: dict[str, dict[str, str]] = {p.name: {} for p in parts}  # per part: local name -> new local
    sibling_mods: dict[str, Modules] = {p.name: {} for p in parts}

    def note_sibling(p: Part, imp: ast.ImportFrom) -> None:
        for a in _sibling_of(imp, pkg, siblings)[0]:
            local = a.asname or a.name
            if imp.module == pkg:  # `from pkg import sibling`: `sibling.name` -> `name`
                if local in p.bound_locally:
                    sys.exit(f"{g.full}: {p.name} binds {local!r} (a sibling module) to something else too: "
                             "rename it by hand first")
                sibling_mods[p.name][local] = (None, {n: renamed.get((f"{pkg}.{a.name}", n), n)
                                                      for n in defined_of[a.name]})
            else:
                src_mod = (imp.module or "")[len(pkg) + 1:].split(".")[0]
                target = renamed.get((f"{pkg}.{src_mod}", a.name), a.name)
                if local != target:
                    local_alias[p.name][local] = target

    seen: dict[str, str] = {}
    blocks: dict[str, list[str]] = {"top": [], "tc": []}
    for kind in ("top", "tc"):
        for p in parts:
            for imp in (p.imports if kind == "top" else p.tc_imports):
                if isinstance(imp, ast.ImportFrom) and imp.module == "__future__":
                    continue
                if isinstance(imp, ast.ImportFrom):
                    note_sibling(p, imp)
                    kept_from = _sibling_of(imp, pkg, siblings)[1]
                    kept = []
                    for a in kept_from:
                        local = a.asname or a.name
                        origin = f"{imp.module}:{a.name}"
                        if local in owner:
                            sys.exit(f"{g.full}: {p.name} imports {local!r}, which {owner[local]} defines: rename one")
                        if local in seen:
                            if seen[local] != origin and not _same_object(seen[local], origin):
                                sys.exit(f"{g.full}: {p.name} binds {local!r} to {origin}, another part to "
                                         f"{seen[local]}: alias one by hand")
                            continue
                        seen[local] = origin
                        kept.append(a)
                    if kept:
                        blocks[kind].append(_from_line("", imp.module or "", [(a.name, a.asname) for a in kept]))
                else:
                    for a in imp.names:
                        line = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                        local = a.asname or a.name.split(".")[0]
                        if local in owner:
                            sys.exit(f"{g.full}: {p.name} imports {local!r}, which {owner[local]} defines: rename one")
                        origin = f"import {a.name}" if a.asname else f"import {local}"  # `import os.path` binds os
                        if local in seen and seen[local] != origin:
                            sys.exit(f"{g.full}: {p.name} binds {local!r} to {a.name}, another part to {seen[local]}")
                        seen[local] = origin
                        if line in blocks["top"] or line in blocks["tc"]:
                            continue
                        blocks[kind].append(line)
        for p in parts:
            for imp in p.sibling_imports:
                note_sibling(p, imp)
    bodies = []
    ordered = _order(parts)
    for p in ordered:
        names = {n: renamed[(p.full, n)] for (m, n) in renamed if m == p.full}
        names.update(local_alias[p.name])
        body = rename_in(p.body, names, sibling_mods[p.name])
        if p is not ordered[0]:
            first = p.doc.strip().splitlines()[0] if p.doc.strip() else p.name
            first = first.rstrip(".")[:96]
            body = f"# -- {first} " + "-" * max(3, 110 - len(first)) + "\n\n" + body
        bodies.append(body)
    doc = _summary(g.summary) + "\n\n" + "\n\n".join(p.doc.strip() for p in ordered if p.doc.strip())
    all_names = _merged_all(ordered, renamed)
    out = [f'"""{doc}\n"""\n', "from __future__ import annotations\n", _sorted_imports(blocks["top"])]
    if blocks["tc"]:
        out.append("if TYPE_CHECKING:\n" + textwrap.indent(_sorted_imports(blocks["tc"]), "    ").rstrip("\n") + "\n")
        if "TYPE_CHECKING" not in seen:
            sys.exit(f"{g.full}: `if TYPE_CHECKING:` imports without `TYPE_CHECKING` imported")
    if all_names is not None:
        out.append(_all_line(all_names))
    text = "\n".join(out) + "\n\n" + "\n\n\n".join(b.rstrip("\n") + "\n" for b in bodies)
    return re.sub(r"\n{4,}", "\n\n\n", text), renamed


def _summary(text: str, width: int = 110) -> str:
    return "\n".join(textwrap.wrap(text, width))


def _all_line(names: list[str], width: int = 120) -> str:
    lines, cur = [], "__all__ = ["
    for i, n in enumerate(names):
        piece = f'"{n}"' + ("," if i < len(names) - 1 else "]")
        if len(cur) + len(piece) + 1 > width:
            lines.append(cur.rstrip())
            cur = " " * len("__all__ = [")
        cur += piece + " "
    return "\n".join(lines + [cur.rstrip()]) + "\n"


_SAME = [{"sqlalchemy.engine", "watchdog.store.engine", "sqlalchemy", "sqlalchemy.sql.elements"},
         {"typing", "collections.abc"}]


def _same_object(a: str, b: str) -> bool:
    # `Connection` from sqlalchemy.engine or re-exported by watchdog.store.engine: one class
    # (and `Sequence` from typing or collections.abc: one in annotations, which is all they are used for)
    return a.split(":")[-1] == b.split(":")[-1] and any({a.split(":")[0], b.split(":")[0]} <= s for s in _SAME)


def _merged_all(parts: list[Part], renamed: dict[tuple[str, str], str]) -> list[str] | None:
    if all(p.all_names is None for p in parts):
        return None
    names: list[str] = []
    for p in parts:
        own = p.all_names if p.all_names is not None else sorted(n for n in p.defined if not n.startswith("_"))
        names += [renamed.get((p.full, n), n) for n in own if renamed.get((p.full, n), n) not in names]
    return names


def _from_line(indent: str, module: str, names: list[tuple[str, str | None]], width: int = 120) -> str:
    items = [n + (f" as {a}" if a else "") for n, a in names]
    one = f"{indent}from {module} import {', '.join(items)}"
    if len(one) <= width:
        return one
    lines, cur = [], f"{indent}from {module} import ("
    for i, it in enumerate(items):
        piece = it + ("," if i < len(items) - 1 else ")")
        if len(cur) + len(piece) + 1 > width:
            lines.append(cur.rstrip())
            cur = indent + " " * (len("from ") + len(module) + len(" import ("))
        cur += piece + " "
    lines.append(cur.rstrip())
    return "\n".join(lines)


def _sorted_imports(lines: list[str]) -> str:
    """One `from M import ...` per module (the parts' names joined), in three blocks: the standard
    library, third parties, watchdog."""
    by_module: dict[str, list[str]] = {}
    plain: list[str] = []
    for ln in lines:
        words = ln.split(None, 3)
        if words[0] == "from":
            names = [n.strip() for n in words[3].replace("(", "").replace(")", "").replace("\n", " ").split(",")]
            by_module.setdefault(words[1], [])
            by_module[words[1]] += [n for n in names if n and n not in by_module[words[1]]]
        else:
            plain.append(ln)
    merged = plain + [_from_line("", m, [(n.split(" as ")[0], n.split(" as ")[1] if " as " in n else None)
                                         for n in names]) for m, names in by_module.items()]

    def group(ln: str) -> int:
        top = ln.split()[1].split(".")[0]
        return 2 if top == "watchdog" else 0 if top in sys.stdlib_module_names else 1
    blocks: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for ln in merged:
        blocks[group(ln)].append(ln)
    return "\n\n".join("\n".join(sorted(b, key=lambda s: (s.startswith("from"), s.split()[1])))
                       for b in blocks.values() if b) + "\n"


# -- rewriting every caller -----------------------------------------------------------------------------------


def walked_files() -> list[Path]:
    out = []
    for name in WALKED:
        p = ROOT / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES
                    and ".venv" not in f.parts and "__pycache__" not in f.parts and "node_modules" not in f.parts]
    return [f for f in out if f.resolve() != SELF]


def _parent(full: str) -> str:
    return full.rsplit(".", 1)[0]


def _leaf(full: str) -> str:
    return full.rsplit(".", 1)[1]


def rewrite_python(path: Path, src: str, moved: dict[str, str], renamed: dict[tuple[str, str], str]) -> str:
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return src
    this_mod = _module_of(path)
    pkgs = {_parent(m) for m in moved}
    taken = _bound_elsewhere(tree, pkgs)
    stmt_edits: list[tuple[ast.stmt, str]] = []
    modules: Modules = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in pkgs:
            pkg = node.module
            if not any(f"{pkg}.{a.name}" in moved for a in node.names):
                continue
            names: list[tuple[str, str | None]] = []
            for a in node.names:
                old = f"{pkg}.{a.name}"
                new = _leaf(moved[old]) if old in moved else a.name
                attrs = {n: r for (m, n), r in renamed.items() if m == old}
                local = a.asname or a.name
                alias = a.asname
                if old in moved and alias is None and (new in taken or a.name in taken):
                    # the file binds the new name to something else (`interventions`, the table), or the
                    # old one too (a parameter `batch`): the module keeps its old local name
                    alias = local = a.name
                if old in moved:
                    if alias is None:
                        modules[a.name] = (None if this_mod == moved[old] else new, attrs)
                    else:
                        modules[local] = (local, attrs)
                item = (new, alias if alias and alias != new else None)
                if item not in names:
                    names.append(item)
            stmt_edits.append((node, _from_line(" " * node.col_offset, pkg, names)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _moved_prefix(node.module, moved):
            old = _moved_prefix(node.module, moved)
            new_mod = moved[old] + node.module[len(old):]
            names = []
            for a in node.names:
                target = renamed.get((old, a.name), a.name)
                names.append((target, a.asname or (a.name if target != a.name else None)))
            stmt_edits.append((node, _from_line(" " * node.col_offset, new_mod, names)))
        elif isinstance(node, ast.Import) and any(_moved_prefix(a.name, moved) for a in node.names):
            items = []
            for a in node.names:
                old = _moved_prefix(a.name, moved)
                name = moved[old] + a.name[len(old):] if old else a.name
                items.append(name + (f" as {a.asname}" if a.asname else ""))
            stmt_edits.append((node, f"{' ' * node.col_offset}import {', '.join(items)}"))
    if stmt_edits:
        lines = src.splitlines(keepends=True)
        for node, text in sorted(stmt_edits, key=lambda e: e[0].lineno, reverse=True):
            first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
            head = lines[first][:node.col_offset]
            tail = lines[last][node.end_col_offset or 0:]
            lines[first:last + 1] = [head + text.lstrip() + tail]
        src = "".join(lines)
        src = _join_imports(_dedupe_imports(src), set(moved.values()) | {_parent(m) for m in moved})
        if modules:
            src = rename_in(src, {}, modules)
    return _rewrite_text(src, moved, renamed, python=True)


def _moved_prefix(dotted: str, moved: dict[str, str]) -> str | None:
    for old in moved:
        if dotted == old or dotted.startswith(old + "."):
            return old
    return None


def _bound_elsewhere(tree: ast.Module, pkgs: set[str]) -> set[str]:
    """Every name the file binds other than by `from <a merged package> import ...`: imports from
    elsewhere, defs, classes, assignments, parameters (a local shadows a module as surely)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom)
                                                                   and node.module in pkgs and node.level == 0):
            out |= {local for local, _origin in _bindings(node)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _dedupe_imports(src: str) -> str:
    # `from watchdog.core import text` twice in a row (two old modules, one new): keep one line
    out, prev = [], None
    for ln in src.splitlines(keepends=True):
        if ln == prev and ln.lstrip().startswith(("from watchdog", "import watchdog")):
            continue
        out.append(ln)
        prev = ln
    return "".join(out)


def _join_imports(src: str, targets: set[str]) -> str:
    """Top-level `from M import ...` statements of one M among the rewritten targets, which the renames
    may have made two (`from watchdog.store.alerts import announce` and `... import actor`), joined
    into the first; one with a comment on its lines is left as it is."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return src
    lines = src.splitlines(keepends=True)
    by_module: dict[str, list[ast.ImportFrom]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in targets \
                and not any("#" in lines[i] for i in range(node.lineno - 1, node.end_lineno or node.lineno)):
            by_module.setdefault(node.module, []).append(node)
    edits: list[tuple[int, int, str]] = []  # (first line, last line, text), 0-based
    for module, nodes in by_module.items():
        if len(nodes) < 2:
            continue
        names: list[tuple[str, str | None]] = []
        for n in nodes:
            names += [(a.name, a.asname) for a in n.names if (a.name, a.asname) not in names]
        edits.append((nodes[0].lineno - 1, (nodes[0].end_lineno or nodes[0].lineno) - 1,
                      _from_line("", module, names) + "\n"))
        edits += [(n.lineno - 1, (n.end_lineno or n.lineno) - 1, "") for n in nodes[1:]]
    for first, last, text in sorted(edits, reverse=True):
        lines[first:last + 1] = [text] if text else []
    return "".join(lines)


def _module_of(path: Path) -> str | None:
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    if rel.parts[0] != "watchdog" or rel.suffix != ".py":
        return None
    return ".".join(rel.with_suffix("").parts)


def _patterns(moved: dict[str, str], renamed: dict[tuple[str, str], str]
              ) -> tuple[list[tuple[re.Pattern[str], object]], list[tuple[re.Pattern[str], object]]]:
    """(the full forms, `watchdog.core.scrub` and `watchdog/core/scrub.py`; the short ones, `core.scrub`,
    `tick/locked.py`), as (pattern, replacement) pairs."""
    full, short = [], []
    for pkg in sorted({_parent(m) for m in moved}):
        olds = "|".join(sorted((_leaf(m) for m in moved if _parent(m) == pkg), key=len, reverse=True))
        parts = pkg.split(".")

        def dotted(m: re.Match[str], pkg: str = pkg) -> str:
            old = f"{pkg}.{m.group(2)}"
            attr = m.group(3)
            new = _leaf(moved[old])
            if attr:
                return f"{m.group(1)}{new}{attr[0]}{renamed.get((old, attr[1:]), attr[1:])}"
            return f"{m.group(1)}{new}"

        def path(m: re.Match[str], pkg: str = pkg) -> str:
            return f"{m.group(1)}{_leaf(moved[pkg + '.' + m.group(2)])}.py"

        dots = r"\.".join(map(re.escape, parts))
        slashes = "/".join(map(re.escape, parts))
        full.append((re.compile(rf"(?<![\w.])({dots}\.)({olds})\b(?!\.py\b)([.:]\w+)?"), dotted))
        full.append((re.compile(rf"(?<![\w./])({slashes}/)({olds})\.py\b"), path))
        # shorter suffixes of the package: `daemon.tick.locked`, `tick.locked`, `tick/locked.py`
        for i in range(1, len(parts)):
            sd = r"\.".join(map(re.escape, parts[i:]))
            ss = "/".join(map(re.escape, parts[i:]))
            short.append((re.compile(rf"(?<![\w.])({sd}\.)({olds})\b(?!\.py\b)([.:]\w+)?"), dotted))
            short.append((re.compile(rf"(?<![\w./])({ss}/)({olds})\.py\b"), path))
    return full, short


def _subs(text: str, pats: list[tuple[re.Pattern[str], object]]) -> str:
    for pat, repl in pats:
        text = pat.sub(repl, text)  # type: ignore[arg-type]
    return text


def _rewrite_text(src: str, moved: dict[str, str], renamed: dict[tuple[str, str], str], python: bool = False) -> str:
    full, short = _patterns(moved, renamed)
    src = _subs(src, full)
    if not python:
        return _subs(src, short)
    # in Python, `tick.pause` may be an attribute of a variable: the short forms only in comments and strings
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError):
        return src
    lines = src.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))
    out, pos = [], 0
    for t in toks:
        if t.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        a = starts[t.start[0] - 1] + t.start[1]
        b = starts[t.end[0] - 1] + t.end[1]
        out.append(src[pos:a])
        out.append(_subs(src[a:b], short))
        pos = b
    out.append(src[pos:])
    return "".join(out)


def _baseline_renames(src: str, renamed: dict[tuple[str, str], str], moved: dict[str, str]) -> str:
    # tests/unit/complexity_baseline.txt names functions `watchdog/core/text.py::name 17`
    for (old, name), new in renamed.items():
        path = moved.get(old, old).replace(".", "/") + ".py"
        src = re.sub(rf"(?m)^({re.escape(path)}::){re.escape(name)}(?=[ .])", rf"\g<1>{new}", src)
    return src


def _dedupe_toml_lists(src: str) -> str:
    """In each `[...]` list of strings, an entry the renames made twice (two strict modules merged into
    one, two sources of a contract) is kept once."""
    def one_list(m: re.Match[str]) -> str:
        seen: set[str] = set()

        def item(i: re.Match[str]) -> str:
            if i.group(1) in seen:
                return ""
            seen.add(i.group(1))
            return i.group(0)
        body = re.sub(r'"([^"\n]*)",?[ \t]*(?:#[^\n]*)?(?:\n[ \t]*)?', item, m.group(2))
        body = re.sub(r",(\s*)$", r"\1", body) if body.rstrip().endswith(",") and not m.group(2).rstrip().endswith(",") \
            else body
        if body != m.group(2) and "\n" in body and "#" not in body and max(map(len, body.splitlines())) > 110:
            # the renames made a line long: the list wrapped again, at its own indent
            indent = re.match(r"[^\n]*\n([ \t]*)", body)
            items = re.findall(r'"[^"\n]*"', body)
            lines, cur = [], ""
            for i, it in enumerate(items):
                piece = it + ("," if i < len(items) - 1 else "")
                if cur and len(cur) + len(piece) + 1 > 110 - len(indent.group(1) if indent else ""):
                    lines.append(cur)
                    cur = piece
                else:
                    cur = f"{cur} {piece}" if cur else piece
            lines.append(cur)
            pad = indent.group(1) if indent else "    "
            body = lines[0] + "".join(f"\n{pad}{ln}" for ln in lines[1:])
        return m.group(1) + body + m.group(3)
    return re.sub(r"(=\s*\[)((?:[^\[\]])*?)(\])", one_list, src)


def _figures(src: str, moved: dict[str, str], figures: dict[str, str] = FIGURES) -> str:
    """A docs figure that lists a package's modules in its first column: merged names become the new one."""
    for header, pkg in figures.items():
        if f"\n{header}\n" not in src:
            continue
        head, rest = src.split(f"\n{header}\n", 1)
        figure, tail = rest.split("```", 1)
        out = []
        for line in figure.splitlines(keepends=True):
            col, desc = line[:FIGURE_COLUMN], line[FIGURE_COLUMN:]
            words = col.split()
            new_words: list[str] = []
            for w in words:
                n = _leaf(moved.get(f"{pkg}.{w}", f"{pkg}.{w}"))
                if n not in new_words:
                    new_words.append(n)
            if new_words != words:
                col = ("  " + "  ".join(new_words)).ljust(FIGURE_COLUMN) if new_words else ""
                if not new_words:
                    desc = desc.lstrip()
                    col = " " * FIGURE_COLUMN
            out.append(col + desc)
        src = head + f"\n{header}\n" + "".join(out) + "```" + tail
    return src


# -- the steps ------------------------------------------------------------------------------------------------


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def plan(gs: list[Group]) -> list[tuple[Group, list[Part]]]:
    todo = []
    for g in gs:
        present = [n for n in g.parts if mod_path(f"{g.pkg}.{n}").exists()]
        gone_already = mod_path(g.full).exists() and not [n for n in present if n != g.new]
        if gone_already:
            print(f"  {g.full}: already merged, skipped")
            continue
        if present != g.parts:
            sys.exit(f"{g.full}: only {present} of {g.parts} are there: merge by hand or fix TABLES")
        if g.new not in g.parts and mod_path(g.full).exists():
            sys.exit(f"{g.full}.py exists already and is not one of {g.parts}")
        siblings = set(g.parts)
        todo.append((g, [read_part(g.pkg, n, siblings) for n in g.parts]))
    return todo


def merge(gs: list[Group], dry_run: bool) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    moved: dict[str, str] = {}
    renamed_all: dict[tuple[str, str], str] = {}
    texts = []
    for g, parts in plan(gs):  # every group read and merged before the first is written: a collision stops all
        text, renamed = merge_group(g, parts)
        renamed_all.update(renamed)
        for n in g.parts:
            if n != g.new:
                moved[f"{g.pkg}.{n}"] = g.full
        texts.append((g, text))
        print(f"  {g.full:34} <- {', '.join(g.parts):32} {text.count(chr(10)):4} lines"
              + (f"  renamed: {', '.join(f'{_leaf(m)}.{a}->{b}' for (m, a), b in renamed.items())}"
                 if renamed else ""))
    if dry_run:
        return moved, renamed_all
    for g, text in texts:
        first = g.parts[0]
        rel = Path(*g.pkg.split("."))
        if first != g.new:
            git("mv", str(rel / f"{first}.py"), str(rel / f"{g.new}.py"))
        for n in g.parts[1:]:
            if n != g.new:
                git("rm", "-q", str(rel / f"{n}.py"))
        mod_path(g.full).write_text(text)
    return moved, renamed_all


def rewrite(moved: dict[str, str], renamed: dict[tuple[str, str], str], dry_run: bool) -> int:
    changed = 0
    for path in walked_files():
        src = path.read_text()
        new = rewrite_python(path, src, moved, renamed) if path.suffix == ".py" else _rewrite_text(src, moved, renamed)
        if path.name == "complexity_baseline.txt":
            new = _baseline_renames(new, renamed, moved)
        if path.name == "pyproject.toml":
            new = _dedupe_toml_lists(new)
        if path.suffix == ".md":
            new = _figures(new, moved)
        if new != src:
            changed += 1
            if not dry_run:
                path.write_text(new)
    return changed


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name  # the venv's, whether it is activated or not
    return str(beside) if beside.exists() else name


_SDK_PROBE = """
import sys, watchdog.client
from watchdog import Watchdog, RunKilled
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r}
                      or any(m == f or m.startswith(f + ".") for f in {forbidden!r}))))
"""


def self_check(gs: list[Group], tests: bool) -> int:
    failures = 0
    pkgs = sorted({g.pkg for g in gs})
    mods = sorted(f"{pkg}.{p.stem}" for pkg in pkgs for p in mod_path(pkg + ".x").parent.glob("*.py")
                  if p.stem != "__init__")
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in mods)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    checks: list[tuple[str, list[str]]] = [
        ("import every module of the merged packages", [sys.executable, "-c", code]),
        ("the SDK stays light (import watchdog.client)",
         [sys.executable, "-c", _SDK_PROBE.format(heavy=sorted(HEAVY), forbidden=SDK_FORBIDDEN)]),
        ("mypy", [sys.executable, "-m", "mypy"]), ("lint-imports", [_tool("lint-imports")])]
    if tests:
        checks.append(("pytest " + " ".join(CHECK_TESTS), [sys.executable, "-m", "pytest", "-q", "-x", "-p",
                                                           "no:cacheprovider", *CHECK_TESTS]))
    for label, cmd in checks:
        # this tree's package, whatever an editable install of another checkout says
        r = subprocess.run(cmd, cwd=ROOT if "SDK" not in label else "/", capture_output=True, text=True, env=env)
        ok = r.returncode == 0 and not ("SDK" in label and r.stdout.strip())
        tail = (r.stdout + r.stderr).strip().splitlines()[-4:]
        print(f"  {label}: {'ok' if ok else 'FAILED'}" + ("" if ok else "\n    " + "\n    ".join(tail)))
        failures += not ok
    olds = old_names(gs)
    if olds:
        alts = []
        for m in olds:
            alts.append(re.escape(m) + r"\b(?!\.py)")
            alts.append(re.escape(m.replace(".", "/")) + r"\.py")
            alts.append(rf"^\s*from {re.escape(_parent(m))} import ([^#]*[ ,(])?(?<!as ){re.escape(_leaf(m))}\b")
        r = subprocess.run(["git", "grep", "-nP", "|".join(alts), "--", ".", f":!{SELF.relative_to(ROOT)}"],
                           cwd=ROOT, capture_output=True, text=True)
        hits = [ln for ln in r.stdout.splitlines() if ln]
        print(f"  old module names left: {len(hits)}")
        for ln in hits[:20]:
            print("    " + ln)
        failures += bool(hits)
    sizes = sorted((mod_path(g.full).read_text().count("\n"), g.full) for g in gs if mod_path(g.full).exists())
    if sizes:
        print(f"  merged modules: {len(sizes)}, {sizes[0][0]}..{sizes[-1][0]} lines "
              "(" + ", ".join(f"{m.removeprefix('watchdog.')} {n}" for n, m in sizes) + ")")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    ap.add_argument("--check", action="store_true", help="only the self-check")
    ap.add_argument("--no-tests", action="store_true", help="self-check without the fast tests (CHECK_TESTS)")
    ap.add_argument("--only", nargs="*", help="only the groups of these packages (e.g. watchdog.core)")
    args = ap.parse_args()
    gs = groups(args.only)
    if not args.check:
        moved, renamed = merge(gs, args.dry_run)
        if moved:
            n = rewrite(moved, renamed, args.dry_run)
            print(f"  files rewritten: {n}")
        if args.dry_run:
            return 0
    print("self-check:")
    return 1 if self_check(gs, not args.no_tests) else 0


if __name__ == "__main__":
    sys.exit(main())
