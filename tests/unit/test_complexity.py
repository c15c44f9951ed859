"""Two complexity gates on every function of the package (issues 21 and 34).

1. McCabe complexity (what flake8's C901 reports) at most 25, for every function: 1, plus one
   per `if`/`elif`, loop, `except` handler and `match` case, counting those of nested functions
   into the outer one as mccabe does (issue 21: `config.parse`, `PreFilter.due`, `Ticker.tick`
   and `ladder.advance` were split to pass it).
2. A radon-like count at most 15 for new code (issue 34: `PreFilter.due` passed gate 1 at 22
   while radon rates it 55, because mccabe does not count `a and b or c`): gate 1's count plus one
   per extra operand of a boolean operator, per conditional expression, per comprehension loop and
   its `if`s, and per `assert`. The functions over 15 when the gate came are listed, with their
   count, in complexity_baseline.txt: they may shrink or go, never grow; no other may pass 15.
   Both counts are computed from the AST here, so the gates need no extra dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import watchdog

LIMIT = 25
NEW_LIMIT = 15
PACKAGE = Path(watchdog.__file__).parent
BASELINE = Path(__file__).with_name("complexity_baseline.txt")
_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.match_case)
_Fn = ast.FunctionDef | ast.AsyncFunctionDef


def complexity(fn: _Fn) -> int:
    return 1 + sum(isinstance(node, _BRANCHES) for node in ast.walk(fn))


def decisions(fn: _Fn) -> int:
    """Gate 2's count: McCabe's, plus the decisions hidden in expressions."""
    extra = 0
    for node in ast.walk(fn):
        if isinstance(node, ast.BoolOp):
            extra += len(node.values) - 1
        elif isinstance(node, (ast.IfExp, ast.Assert)):
            extra += 1
        elif isinstance(node, ast.comprehension):
            extra += 1 + len(node.ifs)
    return complexity(fn) + extra


def _functions() -> list[tuple[str, _Fn]]:
    out: list[tuple[str, _Fn]] = []

    def visit(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((f"{module}::{prefix}{child.name}", child))
                visit(child, module, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, module, f"{prefix}{child.name}.")
            else:
                visit(child, module, prefix)

    for path in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(path.read_text(), filename=str(path)), str(path.relative_to(PACKAGE.parent)), "")
    return out


def _baseline() -> dict[str, int]:
    lines = [line.split() for line in BASELINE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {name: int(score) for name, score in lines}


def test_no_function_is_over_the_limit() -> None:
    over = [f"{where} = {score}" for where, fn in _functions() if (score := complexity(fn)) > LIMIT]
    assert not over, f"McCabe complexity over {LIMIT}; split them:\n" + "\n".join(over)


def test_no_new_function_is_over_the_radon_like_limit_and_no_old_one_grows() -> None:
    allowed = _baseline()
    over = [f"{where} = {score}" + (f" (was {allowed[where]})" if where in allowed else "")
            for where, fn in _functions()
            if (score := decisions(fn)) > max(NEW_LIMIT, allowed.get(where, 0))]
    assert not over, (f"decisions over {NEW_LIMIT} (boolean operators count; tests/unit/complexity_baseline.txt "
                      "lists the older ones, which may only shrink); split them:\n" + "\n".join(over))


def test_the_count_is_mccabes_and_the_new_one_counts_expressions_too() -> None:
    source = (
        "def f(a, b):\n"
        "    if a and b or a:\n        return 1\n"
        "    elif b:\n        pass\n"
        "    for x in a:\n        try:\n            pass\n        except ValueError:\n            pass\n"
        "    assert a\n"
        "    return [y for y in b if y] if a else None\n"
    )
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert complexity(fn) == 5  # 1 + if + elif + for + except; `and` and the comprehension do not count
    # + 2 (a and b or a: two extra operands) + assert + conditional expression + the comprehension's loop and if
    assert decisions(fn) == 5 + 2 + 1 + 1 + 2


if __name__ == "__main__":  # regenerate the baseline: python tests/unit/test_complexity.py > tests/unit/complexity_baseline.txt
    print("# Functions over the radon-like limit (15) when the gate came (issue 34): name and count; may only shrink.")
    for where, fn in _functions():
        if (score := decisions(fn)) > NEW_LIMIT:
            print(where, score)
