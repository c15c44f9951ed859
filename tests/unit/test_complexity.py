"""No function in the package is over McCabe complexity 25 (issue 21: `config.parse`,
`PreFilter.due`, `Ticker.tick` and `ladder.advance` were split; this keeps them, and every new
function, under the limit).

The count is the `mccabe` tool's (what flake8's C901 reports), computed from the AST here so the
gate needs no extra dependency: 1, plus one per `if`/`elif`, loop and `except` handler, counting
those of nested functions into the outer one as mccabe does (boolean operators, comprehensions
and conditional expressions do not count, as in mccabe).
"""

from __future__ import annotations

import ast
from pathlib import Path

import watchdog

LIMIT = 25
PACKAGE = Path(watchdog.__file__).parent
_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.match_case)


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return 1 + sum(isinstance(node, _BRANCHES) for node in ast.walk(fn))


def _functions() -> list[tuple[str, int]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
                out.append((where, complexity(node)))
    return out


def test_no_function_is_over_the_limit() -> None:
    over = [f"{where} = {score}" for where, score in _functions() if score > LIMIT]
    assert not over, f"McCabe complexity over {LIMIT}; split them:\n" + "\n".join(over)


def test_the_count_is_mccabes() -> None:
    source = (
        "def f(a, b):\n"
        "    if a and b:\n        return 1\n"
        "    elif b:\n        pass\n"
        "    for x in a:\n        try:\n            pass\n        except ValueError:\n            pass\n"
        "    return [y for y in b if y]\n"
    )
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert complexity(fn) == 5  # 1 + if + elif + for + except; `and` and the comprehension do not count
