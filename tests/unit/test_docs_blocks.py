"""Every code block of README.md and docs/ is run or checked: the checks that need no store and no
process (tests/docblocks.py says which block is checked how; tests/system/test_docs.py runs them).

Here: each block is runnable, parseable or says why not; TOML parses and the config accepts it; JSON
and YAML parse; Python compiles; SQL statements are complete; files and excerpts match the checkout;
install lines name real extras; synopses name real options; the CLI, configuration and metrics
reference pages name every command and option, every config key and every metric there is; links
between pages (and from the README into docs/) resolve; every page is in the toctree; the README stays
short.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import shlex
import sqlite3
import tomllib
from pathlib import Path

import click
import pytest
import yaml

import docblocks as d
from watchdog.cli import main as cli_main
from watchdog.core import config as wconfig
from watchdog.errors import ConfigError

ALL = d.blocks()
GLOBAL_OPTIONS = {"--db", "--config", "--debug"}  # accepted before and after every command's name


def _of(kind: str) -> list[d.Block]:
    return [b for b in ALL if b.kind == kind]


def _of_lang(*langs: str) -> list[d.Block]:
    return [b for b in ALL if b.lang in langs]


def _ids(blocks: list[d.Block]) -> list[str]:
    return [f"{b.page}:{b.line}" for b in blocks]


def test_the_pages_have_blocks_of_every_kind_checked_here():
    kinds = {b.kind for b in ALL}
    assert len(ALL) > 80, "the parser found too few blocks"
    assert {"run", "given", "operator", "file", "excerpt", "readme", "ci", "install", "synopsis", "run-by",
            "covered-by", "mac-example", "output", "figure", "parse"} <= kinds, kinds
    assert {b.lang for b in ALL} >= {"sh", "bash", "python", "sql", "toml", "json", "yaml", "javascript"}


def test_every_block_is_run_or_checked_or_says_why():
    problems = []
    for b in ALL:
        if b.kind == "unmarked":
            problems.append(f"{b.where()}: a {b.lang or 'plain'} block is neither runnable ({sorted(d.RUNNABLE)}) "
                            f"nor parsed ({sorted(d.PARSED)}): mark it `<!-- docs-test: KIND ... -->`")
        elif b.kind not in d.KINDS | {"parse"}:
            problems.append(f"{b.where()}: unknown marker kind {b.kind!r} (known: {sorted(d.KINDS)})")
        elif b.kind == "given" and (b.lang != "python" or b.argument not in d.GIVEN):
            problems.append(f"{b.where()}: a given block is Python with a prelude in docblocks.GIVEN")
        elif b.kind in ("operator", "install") and b.lang not in ("sh", "bash"):
            problems.append(f"{b.where()}: {b.kind} blocks are shell")
        elif b.kind == "ci" and b.page != "README.md":
            problems.append(f"{b.where()}: the test command is the README's")
        elif b.kind in ("covered-by", "run-by") and not (b.target and b.reason):
            problems.append(f"{b.where()}: `{b.kind} TEST (why)` names a test and says why the block is not run here")
        elif b.lang == "typescript" and b.kind != "excerpt":
            problems.append(f"{b.where()}: no TypeScript checker on the project's Node: quote a file (`excerpt PATH`)")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("page", d.pages(), ids=d.rel)
def test_no_page_has_an_indented_code_block(page):
    _, indented = d.parse(page.read_text(encoding="utf-8"), d.rel(page))
    assert indented == [], f"{d.rel(page)}: indented code blocks at lines {indented}: fence them (```lang) and mark them"


def test_tests_named_by_markers_exist_and_read_their_page():
    problems = []
    for b in _of("covered-by") + _of("run-by"):
        files = d.defines_test(b.target)
        if not files:
            problems.append(f"{b.where()}: no test function {b.target} under tests/")
        elif b.kind == "run-by" and not any(Path(b.page).name in f.read_text(encoding="utf-8") for f in files):
            problems.append(f"{b.where()}: {b.target} ({', '.join(map(d.rel, files))}) does not read {b.page}")
    assert problems == [], "\n".join(problems)


def test_file_blocks_are_the_files_they_name():
    checked = 0
    for b in _of("file"):
        assert (d.REPO / b.argument).read_text(encoding="utf-8") == b.text, f"{b.where()} differs from {b.argument}"
        checked += 1
    assert checked >= 1


def test_excerpts_are_runs_of_lines_of_their_files():
    for b in _of("excerpt"):
        source = (d.REPO / b.target).read_text(encoding="utf-8")
        assert b.text in source and b.text.startswith(tuple(source.splitlines())), f"{b.where()}: not in {b.target}"


def test_readme_blocks_are_in_the_readme():
    readme = {b.text for b in d.blocks(d.README)}
    for b in _of("readme"):
        assert b.text in readme, f"{b.where()}: not a block of README.md (where it would run)"


@pytest.mark.parametrize("block", _of_lang("toml"), ids=_ids(_of_lang("toml")))
def test_toml_blocks_parse_and_the_config_accepts_them(block):
    raw = tomllib.loads(block.text)
    config = wconfig.parse(raw, block.where())  # unknown keys, wrong types: ConfigError
    assert config.path == block.where()


def test_json_and_yaml_blocks_parse():
    checked = 0
    for b in _of_lang("json"):
        json.loads(b.text)
        checked += 1
    for b in _of_lang("yaml"):
        loaded = yaml.safe_load(b.text)
        assert isinstance(loaded, dict), b.where()
        for dotted in loaded.get("litellm_settings", {}).get("callbacks", []):
            module, name = dotted.rsplit(".", 1)  # the callback a LiteLLM proxy will import
            path = d.REPO / (module.replace(".", "/") + ".py")
            assert re.search(rf"^{name}\b", path.read_text(encoding="utf-8"), re.M), f"{b.where()}: no {dotted}"
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("block", _of_lang("python"), ids=_ids(_of_lang("python")))
def test_python_blocks_compile(block):
    compile(block.text, block.where(), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_sql_blocks_are_complete_statements():
    for b in _of_lang("sql"):
        assert sqlite3.complete_statement(b.text), f"{b.where()}: not a complete statement"


def test_the_mac_example_is_the_sdks_own_format():
    from watchdog.core.evidence_mac import message

    (b,) = _of("mac-example")
    expected = message("r1", 7, "tool", "search", "ab" * 32, False, None, None, None, None, None, 0.0123456, 2,
                       "2026-12-01 21:13:05.120000").decode()
    assert b.text.strip().replace("abab…ab", "ab" * 32) == expected, b.where()


def test_install_lines_name_extras_the_project_has():
    known = d.extras()
    checked = 0
    for b in _of("install"):
        for line in filter(None, (ln.split("#")[0].strip() for ln in b.text.splitlines())):
            assert re.match(r"(python -m )?pip install ", line), f"{b.where()}: not a pip install: {line}"
            for spec in re.findall(r"\[([\w,-]+)\]", line):
                for extra in spec.split(","):
                    assert extra in known, f"{b.where()}: no extra {extra!r} in pyproject.toml"
                    checked += 1
    assert checked >= 4
    # The suite's own venv has every extra a page installs: the pages' blocks run there.
    test_extra = " ".join(known["test"])
    for extra in ("langchain", "openai-agents", "mcp", "litellm"):
        first = re.split(r"[<>=\[;]", known[extra][0])[0]
        assert first in test_extra or f"[{extra}]" in test_extra, f"the test extra lacks {extra}"


def _commands() -> dict[tuple[str, ...], click.Command]:
    out: dict[tuple[str, ...], click.Command] = {}

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        out[path] = cmd
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, path + (name,))

    walk(cli_main, ())
    return out


def _options(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


def test_synopses_name_real_commands_and_options():
    commands = _commands()
    checked = 0
    for b in _of("synopsis"):
        joined = re.sub(r"\n\s+", " ", b.text)  # a usage continued on indented lines is one line
        for line in filter(None, (ln.split(" #")[0].strip() for ln in joined.splitlines())):
            words = line.replace("…", " ").replace("[", " ").replace("]", " ").replace("|", " ").split()
            assert words[0] == "agent-watchdog", f"{b.where()}: {line}"
            path: tuple[str, ...] = ()
            for w in words[1:]:
                if w.startswith("-") or w == "COMMAND":
                    continue
                if path + (w,) in commands:
                    path += (w,)
                else:
                    break
            allowed = _options(commands[path]) | _options(cli_main)
            for opt in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", line.split(" -- ")[0]):
                assert opt in allowed, f"{b.where()}: `{' '.join(path)}` has no option {opt}"
                checked += 1
    assert checked >= 40


def _sections(page: Path, level: str) -> dict[str, str]:
    """The text under each heading of that level, by the heading's text (backticks removed)."""
    text = page.read_text(encoding="utf-8")
    parts = re.split(rf"^{level} (.+)$", text, flags=re.M)
    return {parts[i].replace("`", "").strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_cli_page_names_every_command_and_option():
    page = d.DOCS / "reference" / "cli.md"
    sections = _sections(page, "###")
    glob = _sections(page, "##")["Global options"]
    problems = [f"global option {o} missing" for o in sorted(_options(cli_main)) if f"`{o}" not in glob]
    for path, cmd in _commands().items():
        if not path or (isinstance(cmd, click.Group) and not _options(cmd) - GLOBAL_OPTIONS - {"--help"}):
            continue  # the root (global options, above) and groups with nothing of their own (`db`)
        name = " ".join(path)
        section = sections.get(name)
        if section is None:
            problems.append(f"no section `### \\`{name}\\`` for the command {name}")
            continue
        for opt in sorted(_options(cmd) - GLOBAL_OPTIONS - {"--help"}):
            if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", section):
                problems.append(f"`{name}`: option {opt} not on the page")
        for arg in (p for p in cmd.params if isinstance(p, click.Argument)):
            if arg.name.upper() not in section and arg.name.upper().replace("_", "") not in section.replace("_", ""):
                problems.append(f"`{name}`: argument {arg.name.upper()} not on the page")
    names = {" ".join(p) for p in _commands() if p}
    problems += [f"section {s!r} is no command" for s in sections if s not in names]
    assert problems == [], "\n".join(problems)


def test_the_metrics_page_names_every_metric_the_daemon_defines():
    pytest.importorskip("prometheus_client")  # the test extra has it; CI turns a skip into a failure
    from prometheus_client import CollectorRegistry

    from watchdog.daemon.process.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    defined = set()
    for family in registry.collect():
        defined.add(family.name + ("_total" if family.type == "counter" else ""))
    page = (d.DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(agent_watchdog_\w+)` \|", page, re.M))
    assert documented == defined, f"missing on the page: {sorted(defined - documented)}; " \
                                  f"not defined: {sorted(documented - defined)}"


def _known_keys(raw: dict, where: str) -> set[str]:
    """The keys config.parse accepts at one place, from its own refusal of an unknown key."""
    try:
        wconfig.parse(raw)
    except ConfigError as exc:
        m = re.search(r"one of the known keys \(([^)]*)\)", str(exc))
        assert m, f"{where}: {exc}"
        return set(m.group(1).split(", "))
    raise AssertionError(f"{where}: an unknown key was accepted")


def test_the_configuration_page_names_every_key():
    bad = "zz_no_such_key_zz"
    places = {
        "": {bad: 1},
        "store": {"store": {bad: 1}},
        "daemon": {"daemon": {bad: 1}},
        "defaults": {"defaults": {bad: 1}},
        "circuit": {"circuit": {bad: 1}},
        "alerts": {"alerts": {bad: 1}},
        "metrics": {"metrics": {bad: 1}},
        "pricing": {"pricing": {bad: 1}},
        "drift": {"drift": {bad: 1}},
        "otlp": {"otlp": {bad: 1}},
        "prices": {"prices": {"m": {bad: 1}}},
        "budgets": {"budgets": [{bad: 1}]},
    }
    page = (d.DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    missing = []
    for where, raw in places.items():
        for key in sorted(_known_keys(raw, where)):
            if not re.search(rf"^\[*{re.escape(key)}\b|^{re.escape(key)} =|`{re.escape(key)}`", page, re.M):
                missing.append(f"{where}.{key}" if where else key)
    assert missing == [], f"config keys not on docs/reference/configuration.md: {missing}"


def _link_problems(page: Path) -> list[str]:
    problems = []
    for line, target in d.links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: — another site
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{d.rel(page)}:{line}: {target}: no such file")
        elif not dest.is_relative_to(d.REPO):
            problems.append(f"{d.rel(page)}:{line}: {target}: outside the checkout")
        elif page != d.README and not dest.is_relative_to(d.DOCS):
            problems.append(f"{d.rel(page)}:{line}: {target}: a page links outside docs/ (Sphinx cannot follow it)")
        elif anchor and dest.suffix == ".md" and anchor not in d.anchors(dest):
            near = difflib.get_close_matches(anchor, sorted(d.anchors(dest)), n=1)
            problems.append(f"{d.rel(page)}:{line}: {target}: no heading #{anchor} (near: {near})")
    return problems


def test_links_from_the_readme_and_between_pages_resolve():
    problems = [p for page in d.pages() for p in _link_problems(page)]
    assert problems == [], "\n".join(problems)
    assert any(t.startswith("docs/") for _, t in d.links(d.README)), "the README links into docs/"


def test_the_link_check_catches_what_it_is_for(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\n## Some heading\n\n[ok](b.md#b-title) [bad](b.md#nope) [gone](c.md)\n")
    (docs / "b.md").write_text("# B title\n\n[back](a.md#some-heading) [web](https://example.org/x)\n")
    monkeypatch.setattr(d, "REPO", tmp_path)
    monkeypatch.setattr(d, "DOCS", docs)
    monkeypatch.setattr(d, "README", tmp_path / "README.md")
    assert _link_problems(docs / "b.md") == []
    got = _link_problems(docs / "a.md")
    assert len(got) == 2 and "#nope" in got[0] and "c.md: no such file" in got[1], got


def test_every_page_is_in_the_toctree():
    index = (d.DOCS / "index.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^([a-z][\w/-]*)$", index, re.M))
    pages = {p.relative_to(d.DOCS).with_suffix("").as_posix() for p in d.DOCS.rglob("*.md")} - {"index"}
    assert pages == listed, f"not in the toctree: {sorted(pages - listed)}; listed, no page: {sorted(listed - pages)}"


@pytest.mark.parametrize("page", d.pages(), ids=d.rel)
def test_each_page_has_one_title(page):
    titles = [tok for tok in d._MD.parse(page.read_text(encoding="utf-8")) if tok.type == "heading_open" and tok.tag == "h1"]
    assert len(titles) == 1, f"{d.rel(page)}: {len(titles)} top-level headings (the toctree shows each as a page)"


def test_the_readme_stays_short_and_says_the_names():
    text = d.README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 180, "the README is the front door: move detail into a docs/ page"
    assert "agent-watchdog-daemon" in text and "filesystem-events package `watchdog`" in text
    words = shlex.split(next(b.text for b in d.blocks(d.README) if b.kind == "ci").splitlines()[-1])
    assert "pytest" in words
