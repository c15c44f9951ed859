#!/usr/bin/env python3
"""Merge watchdog/store/ by what it stores (issue 34): a re-runnable rewrite of the tree.

Run from the repository root on a checkout where the old modules are still there (main, or main
with other branches merged into it):

    python tools/store_merge.py            # merge, rewrite every use, then the self-check
    python tools/store_merge.py --dry-run  # print the plan and the collisions, change nothing
    python tools/store_merge.py --check    # the self-check only

What it does, per group of GROUPS: the modules are concatenated into the new one (one docstring
made of theirs, one `from __future__`, their imports deduplicated, imports of each other dropped,
private names that collide renamed `_<old module>_<name>`, public ones by RENAMES), written over
the first part (`git mv`, so its history follows) and the others `git rm`'d. Then every import
and attribute use in watchdog/, tests/, benchmarks/, migrations/, tools/ and the docs is rewritten
(`from watchdog.store import statuses` -> `run_rows`, `statuses.move(` -> `run_rows.move(`,
`from watchdog.store.evidence import load` -> `... attestations import load_evidence as load`),
and every dotted or path mention (`watchdog.store.joined`, `watchdog/store/joined.py`) in text.
A group whose parts are all gone already is skipped, so a second run changes nothing.

Modules that are not in GROUPS are left where they are whatever their content (their imports of a
merged module are rewritten like any caller's). What the SDK imports (agent_writes, lineage, probes,
joined, settings) is merged only with modules as light, so that `import watchdog.client` loads no
more of the store than before: probes stays apart from the daemon's circuits (which import the
views), joined apart from witness (which imports the run's reads, the ledger and the scan).
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
STORE = ROOT / "watchdog" / "store"
PKG = "watchdog.store"

# new module -> (its one-line summary, the old modules in order: the first one's file becomes it)
GROUPS: dict[str, tuple[str, list[str]]] = {
    "run_rows": ("A run's row: its status moves, the tick's small reads of it, its children, its times after a "
                 "jump of the store's clock.", ["statuses", "run_reads", "children", "rebase"]),
    "interventions": ("The audit rows (`interventions`): written, believed, and the quarantine's reads of them.",
                      ["interventions", "quarantine"]),
    "alerts": ("The alerts a daemon queues (`alerts` by dedupe key) and the one verb that announces an outcome.",
               ["alerts", "announce"]),
    "attestations": ("Rows of `attestations`: a run's attested identity and its sealed evidence, and the MAC'd "
                     "events that evidence is checked against.", ["attestations", "evidence"]),
    "event_rows": ("What a run's append-only events show: their totals for the ledger, and the steps the daemon "
                   "prices.", ["evidence_rows", "backfill"]),
    "settings": ("What is published in `settings` (the config, the period budgets, each daemon's own "
                 "description) and which daemons watch the store.", ["settings", "daemon_status"]),
    "viewer": ("Read verbs for what people look at: the web view, `postmortem`, `budgets`, `top`, and the "
               "demo's narration.", ["viewer", "demo"]),
    "joined": ("A run another writer owns, as the commands around it read it: a gateway's reads and appends "
               "(the MCP proxy, the LiteLLM callback), and `exec`'s reads of its own run.", ["joined", "execrun"]),
    "retention": ("What the leader does to ended runs: seals their top tool once, then prunes them when they "
                  "are old.", ["retention", "rollup"]),
    "access": ("How a command reaches the store: an engine on a migrated store, what a driver's error means, "
               "and Alembic driven from code.", ["access", "migrate"]),
}
# (old module, public name) -> its name in the new module, where two parts define the same name
RENAMES: dict[tuple[str, str], str] = {
    ("evidence", "load"): "load_evidence",
    ("evidence", "save"): "save_evidence",
}
TEXT_SUFFIXES = {".py", ".md", ".rst", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".sql", ".sh", ".mako"}
WALKED = ["watchdog", "tests", "benchmarks", "docs", "migrations", "tools", "examples", "README.md",
          "pyproject.toml", "CHANGELOG.md", ".ci", ".importlinter", "sql", "contrib", "systemd"]
SELF = Path(__file__).resolve()


def old_to_new() -> dict[str, str]:
    return {old: new for new, (_, parts) in GROUPS.items() for old in parts}


# -- reading one module ---------------------------------------------------------------------------------------


@dataclass
class Part:
    name: str
    doc: str
    imports: list[ast.stmt]
    body: str
    all_names: list[str] | None
    defined: set[str] = field(default_factory=set)
    bound_by_import: dict[str, str] = field(default_factory=dict)  # local name -> "module:name"


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
    elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` or a backend switch at the top level
        for s in node.body + node.orelse:
            names |= _targets(s)
    elif isinstance(node, ast.Try):
        for s in node.body + node.orelse + node.finalbody:
            names |= _targets(s)
    return names


def read_part(name: str) -> Part:
    src = (STORE / f"{name}.py").read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    stmts = list(tree.body)
    doc = ""
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(getattr(stmts[0], "value", None), ast.Constant) \
            and isinstance(stmts[0].value.value, str):
        raw = ast.get_source_segment(src, stmts[0]) or ""
        doc = re.sub(r'^[rRuU]?("""|\'\'\')|("""|\'\'\')$', "", raw.strip())  # as written: escapes kept
        stmts = stmts[1:]
    imports: list[ast.stmt] = []
    while stmts and isinstance(stmts[0], (ast.Import, ast.ImportFrom)):
        imports.append(stmts.pop(0))
    late = [s.lineno for s in stmts if isinstance(s, (ast.Import, ast.ImportFrom))]
    if late:
        sys.exit(f"{name}.py: top-level imports after code (lines {late}): move them up first")
    start = imports[-1].end_lineno if imports else (tree.body[0].end_lineno if doc else 0)
    all_names: list[str] | None = None
    drop: set[int] = set()
    for s in stmts:
        if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in s.targets):
            all_names = list(ast.literal_eval(s.value))
            drop |= set(range(s.lineno - 1, s.end_lineno))
    body = "".join(ln for i, ln in enumerate(lines) if i >= start and i not in drop)
    part = Part(name, doc, imports, body.strip("\n") + "\n", all_names)
    for s in stmts:
        part.defined |= _targets(s)
    part.defined.discard("__all__")
    for imp in imports:
        for local, origin in _bindings(imp):
            part.bound_by_import[local] = origin
    return part


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
    for row, c0, c1, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        ln = lines[row - 1]
        lines[row - 1] = ln[:c0] + new + ln[c1:]
    return "".join(lines)


def rename_in(src: str, names: dict[str, str], modules: dict[str, tuple[str | None, dict[str, str]]]) -> str:
    """Rename bare NAMEs (not attributes) by `names`; for `modules` (local module binding -> (its new
    binding or None for "now this module", attribute renames)), rewrite `mod.attr`."""
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
            if binding is None:  # a sibling merged into this very module: `statuses.move` -> `move`
                edits.append((t.start[0], t.start[1], t.end[1], ""))
                edits.append((nxt.start[0], nxt.start[1], nxt.end[1], ""))
            elif binding != t.string:
                edits.append((t.start[0], t.start[1], t.end[1], binding))
            if new_attr != attr.string:
                edits.append((attr.start[0], attr.start[1], attr.end[1], new_attr))
            continue
        if t.string in names and not (nxt is not None and nxt.string == "=" and prev is not None
                                      and prev.string in ("(", ",")):
            edits.append((t.start[0], t.start[1], t.end[1], names[t.string]))
    return apply_edits(src, edits)


def _in_fstring(t: tokenize.TokenInfo, modules: dict[str, tuple[str | None, dict[str, str]]]
                ) -> list[tuple[int, int, int, str]]:
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


def _wrap_doc(text: str) -> str:
    return text.strip()


def _summary(text: str, width: int = 110) -> str:
    return "\n".join(textwrap.wrap(text, width))


def merge_group(new: str, summary: str, parts: list[Part]) -> tuple[str, dict[tuple[str, str], str]]:
    """The new module's source, and every (old module, name) -> new name it renamed."""
    siblings = {p.name for p in parts}
    owner: dict[str, str] = {}
    renamed: dict[tuple[str, str], str] = {}
    for p in parts:
        for n in sorted(p.defined):
            new_name = RENAMES.get((p.name, n), n)
            if new_name in owner and owner[new_name] != p.name:
                if n.startswith("_"):
                    new_name = f"_{p.name}{n}" if n.startswith("_") else n
                else:
                    sys.exit(f"{new}: {p.name}.{n} collides with {owner[new_name]}.{n}: add it to RENAMES")
            owner[new_name] = p.name
            if new_name != n:
                renamed[(p.name, n)] = new_name
    # imports: deduplicated by the local name they bind; those of a sibling are dropped (now local)
    seen: dict[str, str] = {}
    import_lines: list[str] = []
    local_alias: dict[str, dict[str, str]] = {p.name: {} for p in parts}  # per part: local name -> new local
    sibling_mods: dict[str, dict[str, tuple[str | None, dict[str, str]]]] = {p.name: {} for p in parts}
    for p in parts:
        for imp in p.imports:
            if isinstance(imp, ast.ImportFrom) and imp.module == "__future__":
                continue
            kept = []
            for a in imp.names:
                local = a.asname or a.name.split(".")[0]
                if isinstance(imp, ast.ImportFrom) and imp.module == PKG and a.name in siblings:
                    sibling_mods[p.name][local] = (None, {n: renamed.get((a.name, n), n) for (m, n) in
                                                          _defined_of(parts, a.name)})
                    continue
                if isinstance(imp, ast.ImportFrom) and imp.module and imp.module.startswith(PKG + ".") \
                        and imp.module.split(".")[2] in siblings:
                    src_mod = imp.module.split(".")[2]
                    target = renamed.get((src_mod, a.name), a.name)
                    if local != target:
                        local_alias[p.name][local] = target
                    continue
                origin = f"{imp.module}:{a.name}" if isinstance(imp, ast.ImportFrom) else a.name
                if local in owner:
                    sys.exit(f"{new}: {p.name} imports {local!r}, which {owner[local]} defines: rename one")
                if local in seen:
                    if seen[local] != origin and not _same_object(seen[local], origin):
                        sys.exit(f"{new}: {p.name} binds {local!r} to {origin}, another part to {seen[local]}")
                    continue
                seen[local] = origin
                kept.append(a)
            if kept:
                if isinstance(imp, ast.ImportFrom):
                    import_lines.append(_from_line("", imp.module or "", [(a.name, a.asname) for a in kept]))
                else:
                    import_lines.extend(f"import {a.name}" + (f" as {a.asname}" if a.asname else "") for a in kept)
    bodies = []
    for p in parts:
        names = {n: renamed[(p.name, n)] for (m, n) in renamed if m == p.name}
        names.update(local_alias[p.name])
        body = rename_in(p.body, names, sibling_mods[p.name])
        if p is not parts[0]:
            first = p.doc.strip().splitlines()[0] if p.doc.strip() else p.name
            body = f"# -- {first.rstrip('.')} " + "-" * max(3, 100 - len(first)) + "\n\n" + body
        bodies.append(body)
    doc = _summary(summary) + "\n\n" + "\n\n".join(_wrap_doc(p.doc) for p in parts if p.doc.strip())
    all_names = _merged_all(parts, renamed)
    out = [f'"""{doc}\n"""\n', "from __future__ import annotations\n", _sorted_imports(import_lines)]
    if all_names is not None:
        out.append(_all_line(all_names))
    return "\n".join(out) + "\n\n" + "\n\n".join(b.rstrip("\n") + "\n" for b in bodies), renamed


def _all_line(names: list[str], width: int = 120) -> str:
    lines, cur = [], "__all__ = ["
    for i, n in enumerate(names):
        piece = f'"{n}"' + ("," if i < len(names) - 1 else "]")
        if len(cur) + len(piece) + 1 > width:
            lines.append(cur.rstrip())
            cur = " " * len("__all__ = [")
        cur += piece + " "
    return "\n".join(lines + [cur.rstrip()]) + "\n"


def _defined_of(parts: list[Part], name: str) -> list[tuple[str, str]]:
    return [(name, n) for p in parts if p.name == name for n in p.defined]


def _same_object(a: str, b: str) -> bool:
    # `Connection` from sqlalchemy.engine or re-exported by watchdog.store.engine: one class
    # (and `Sequence` from typing or collections.abc: one in annotations, which is all the store uses it for)
    same = [{"sqlalchemy.engine", "watchdog.store.engine", "sqlalchemy", "sqlalchemy.sql.elements"}, {"typing", "collections.abc"}]
    return a.split(":")[-1] == b.split(":")[-1] and any({a.split(":")[0], b.split(":")[0]} <= s for s in same)


def _merged_all(parts: list[Part], renamed: dict[tuple[str, str], str]) -> list[str] | None:
    if all(p.all_names is None for p in parts):
        return None
    names: list[str] = []
    for p in parts:
        own = p.all_names if p.all_names is not None else sorted(n for n in p.defined if not n.startswith("_"))
        names += [renamed.get((p.name, n), n) for n in own if renamed.get((p.name, n), n) not in names]
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
        mod = ln.split()[1]
        return 2 if mod.startswith("watchdog") else 1 if mod.split(".")[0] in _THIRD else 0
    blocks: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for ln in merged:
        blocks[group(ln)].append(ln)
    return "\n\n".join("\n".join(sorted(b, key=lambda s: (s.startswith("from"), s.split()[1])))
                       for b in blocks.values() if b) + "\n"


_THIRD = {"sqlalchemy", "alembic", "psycopg", "psutil"}


# -- rewriting every caller -----------------------------------------------------------------------------------


def walked_files() -> list[Path]:
    out = []
    for name in WALKED:
        p = ROOT / name
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES
                    and ".venv" not in f.parts and "__pycache__" not in f.parts]
    return [f for f in out if f.resolve() != SELF]


def rewrite_python(path: Path, src: str, moved: dict[str, str], renamed: dict[tuple[str, str], str]) -> str:
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return src
    this_mod = _module_of(path)
    taken = _bound_elsewhere(tree)
    stmt_edits: list[tuple[ast.stmt, str]] = []
    modules: dict[str, tuple[str | None, dict[str, str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == PKG:
            if not any(a.name in moved for a in node.names):
                continue
            names: list[tuple[str, str | None]] = []
            for a in node.names:
                new = moved.get(a.name, a.name)
                attrs = {n: r for (m, n), r in renamed.items() if m == a.name}
                local = a.asname or a.name
                alias = a.asname
                if a.name in moved and alias is None and new in taken:
                    # the file binds the new name to something else (`interventions`, the table, from
                    # the schema): the module keeps its old local name, `import interventions as quarantine`
                    alias = local = a.name
                if a.name in moved:
                    if alias is None:
                        modules[a.name] = (None if this_mod == f"{PKG}.{new}" else new, attrs)
                    else:
                        modules[local] = (local, attrs)
                item = (new, alias if alias and alias != new else None)
                if item not in names:
                    names.append(item)
            stmt_edits.append((node, _from_line(_indent(src, node), PKG, names)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith(PKG + ".") and node.module.split(".")[2] in moved:
            old = node.module.split(".")[2]
            new_mod = ".".join([PKG, moved[old], *node.module.split(".")[3:]])
            names = []
            for a in node.names:
                target = renamed.get((old, a.name), a.name)
                names.append((target, a.asname or (a.name if target != a.name else None)))
            stmt_edits.append((node, _from_line(_indent(src, node), new_mod, names)))
        elif isinstance(node, ast.Import) and any(a.name.startswith(PKG + ".") and a.name.split(".")[2] in moved
                                                  for a in node.names):
            items = []
            for a in node.names:
                parts = a.name.split(".")
                if a.name.startswith(PKG + ".") and parts[2] in moved:
                    parts[2] = moved[parts[2]]
                items.append(".".join(parts) + (f" as {a.asname}" if a.asname else ""))
            stmt_edits.append((node, f"{_indent(src, node)}import {', '.join(items)}"))
    if not stmt_edits:
        return _rewrite_text(src, moved, renamed)
    lines = src.splitlines(keepends=True)
    for node, text in sorted(stmt_edits, key=lambda e: e[0].lineno, reverse=True):
        first, last = node.lineno - 1, node.end_lineno - 1
        head = lines[first][:node.col_offset]
        tail = lines[last][node.end_col_offset:]
        lines[first:last + 1] = [head + text.lstrip() + tail]
    src = "".join(lines)
    src = _dedupe_imports(src)
    if modules:
        src = rename_in(src, {}, modules)
    return _rewrite_text(src, moved, renamed)


def _bound_elsewhere(tree: ast.Module) -> set[str]:
    """Every name the file binds other than by `from watchdog.store import ...`: imports from
    elsewhere, defs, classes, assignments, parameters (a local shadows a module as surely)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom)
                                                                   and node.module == PKG and node.level == 0):
            out |= {local for local, _origin in _bindings(node)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _dedupe_imports(src: str) -> str:
    # `from watchdog.store import a, run_rows` twice in a row (two old modules, one new): keep one line
    out, prev = [], None
    for ln in src.splitlines(keepends=True):
        if ln == prev and ln.lstrip().startswith(("from watchdog.store", "import watchdog.store")):
            continue
        out.append(ln)
        prev = ln
    return "".join(out)


def _indent(src: str, node: ast.stmt) -> str:
    return " " * node.col_offset


def _module_of(path: Path) -> str | None:
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    if rel.parts[0] != "watchdog" or rel.suffix != ".py":
        return None
    return ".".join(rel.with_suffix("").parts)


def _rewrite_text(src: str, moved: dict[str, str], renamed: dict[tuple[str, str], str]) -> str:
    olds = "|".join(sorted(moved, key=len, reverse=True))

    def dotted(m: re.Match[str]) -> str:
        old, attr = m.group(2), m.group(3)
        new = moved[old]
        if attr:
            return f"{m.group(1)}{new}.{renamed.get((old, attr[1:]), attr[1:])}"
        return f"{m.group(1)}{new}"

    src = re.sub(rf"(\bwatchdog\.store\.)({olds})\b(\.\w+)?", dotted, src)
    src = re.sub(rf"(\bwatchdog/store/)({olds})\.py\b", lambda m: f"{m.group(1)}{moved[m.group(2)]}.py", src)
    src = re.sub(rf"((?<![\w./])store/)({olds})\.py\b", lambda m: f"{m.group(1)}{moved[m.group(2)]}.py", src)
    src = re.sub(rf"((?<![\w.])store\.)({olds})\b(\.\w+)?", dotted, src)
    return src


def _baseline_renames(src: str, renamed: dict[tuple[str, str], str], moved: dict[str, str]) -> str:
    # tests/unit/complexity_baseline.txt names functions `watchdog/store/X.py::name`
    for (old, name), new in renamed.items():
        src = src.replace(f"watchdog/store/{moved[old]}.py::{name} ", f"watchdog/store/{moved[old]}.py::{new} ")
    return src


# -- the steps ------------------------------------------------------------------------------------------------


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def merge(dry_run: bool) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    moved: dict[str, str] = {}
    renamed_all: dict[tuple[str, str], str] = {}
    for new, (summary, names) in GROUPS.items():
        present = [n for n in names if (STORE / f"{n}.py").exists()]
        if not present or present == [new] and len(names) > 1 and not any((STORE / f"{n}.py").exists()
                                                                           for n in names if n != new):
            print(f"  {new}: already merged, skipped")
            continue
        if present != names:
            sys.exit(f"{new}: only {present} of {names} are there: merge by hand or fix GROUPS")
        if new not in names and (STORE / f"{new}.py").exists():
            sys.exit(f"{new}.py exists already and is not one of {names}")
        parts = [read_part(n) for n in names]
        text, renamed = merge_group(new, summary, parts)
        renamed_all.update(renamed)
        for n in names:
            if n != new:
                moved[n] = new
        lines = text.count("\n")
        print(f"  {new:14} <- {', '.join(names):45} {lines:4} lines"
              + (f"  renamed: {', '.join(f'{m}.{a}->{b}' for (m, a), b in renamed.items())}" if renamed else ""))
        if dry_run:
            continue
        first = names[0]
        if first != new:
            git("mv", f"watchdog/store/{first}.py", f"watchdog/store/{new}.py")
        for n in names[1:]:
            if n != new:
                git("rm", "-q", f"watchdog/store/{n}.py")
        (STORE / f"{new}.py").write_text(text)
    return moved, renamed_all


def rewrite(moved: dict[str, str], renamed: dict[tuple[str, str], str], dry_run: bool) -> int:
    changed = 0
    for path in walked_files():
        src = path.read_text()
        new = rewrite_python(path, src, moved, renamed) if path.suffix == ".py" else _rewrite_text(src, moved, renamed)
        if path.name == "complexity_baseline.txt":
            new = _baseline_renames(new, renamed, moved)
        if new != src:
            changed += 1
            if not dry_run:
                path.write_text(new)
    return changed


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name  # the venv's, whether it is activated or not
    return str(beside) if beside.exists() else name


def self_check(olds: list[str]) -> int:
    failures = 0
    mods = sorted(p.stem for p in STORE.glob("*.py"))
    code = "import importlib\n" + "".join(f"importlib.import_module('watchdog.store.{m}'.replace('.__init__', ''))\n"
                                          for m in mods)
    for label, cmd in (("import every store module", [sys.executable, "-c", code]),
                       ("mypy", [sys.executable, "-m", "mypy"]), ("lint-imports", [_tool("lint-imports")])):
        # this tree's package, whatever an editable install of another checkout says
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
        print(f"  {label}: {'ok' if r.returncode == 0 else 'FAILED'}" + ("" if r.returncode == 0 else "\n    "
                                                                          + "\n    ".join(tail)))
        failures += r.returncode != 0
    if olds:
        pat = "|".join(olds)
        regex = rf"watchdog[./]store[./]({pat})\b|from watchdog\.store import .*\b({pat})\b"
        r = subprocess.run(["git", "grep", "-nE", regex, "--", ".", ":!tools/store_merge.py"], cwd=ROOT,
                           capture_output=True, text=True)
        hits = [ln for ln in r.stdout.splitlines() if ln]
        print(f"  old module names left: {len(hits)}")
        for ln in hits[:20]:
            print("    " + ln)
        failures += bool(hits)
    print(f"  store modules: {len(mods)} (with __init__)")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    ap.add_argument("--check", action="store_true", help="only the self-check")
    args = ap.parse_args()
    olds = sorted(old_to_new().keys() - GROUPS.keys())
    if not args.check:
        print(f"store modules before: {len(list(STORE.glob('*.py')))} (with __init__)")
        moved, renamed = merge(args.dry_run)
        if moved:
            n = rewrite(moved, renamed, args.dry_run)
            print(f"  files rewritten: {n}")
        if args.dry_run:
            return 0
    print("self-check:")
    return 1 if self_check(olds) else 0


if __name__ == "__main__":
    sys.exit(main())
