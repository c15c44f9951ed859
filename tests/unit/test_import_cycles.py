"""No import cycles in the package (issue 34), a type-check-only or function-level import included.

grimp (installed with import-linter) reads every import of `watchdog`, those under
`if TYPE_CHECKING:` and inside functions too: a "late" import still ties two modules together,
so it is no way out of a cycle. The usual fix is a protocol in the lower module for what it
needs of the upper one (e.g. watchdog.sdk.seams, watchdog.daemon.stops.runtree.Killer), or the shared
piece moved below both. A new cycle fails here, naming its modules and the imports that close it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grimp

PACKAGE = "watchdog"

# Cycles let through: none. The last one (the Ticker and the modules that took it whole as `tk`)
# went with issue 34's typed TickContext (watchdog.daemon.context); the set stays empty.
ALLOWED: set[frozenset[str]] = set()


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The cyclic components (strongly connected, more than one module) of `edges` (module ->
    the modules it imports), each sorted; Tarjan's algorithm, iterative (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            nxt = next(todo, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _graph() -> tuple[grimp.ImportGraph, dict[str, set[str]]]:
    graph = grimp.build_graph(PACKAGE)
    return graph, {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}


def _describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    members = set(component)
    lines = [f"cycle of {len(component)} modules: {', '.join(component)}"]
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for d in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"    {importer} -> {imported} (line {d['line_number']}: {d['line_contents']})")
    return "\n".join(lines)


def allowed(component: Iterable[str]) -> bool:
    """A cycle within an allowed one (it may shrink or split as the Ticker is taken apart, never grow)."""
    members = frozenset(component)
    return any(members <= a for a in ALLOWED)


def test_the_package_has_no_import_cycle():
    graph, edges = _graph()
    new = [c for c in cycles(edges) if not allowed(c)]
    assert not new, "import cycles (see this module's docstring for the fix):\n" + "\n".join(
        _describe(graph, c) for c in new)


def test_the_finder_names_each_cycle_and_only_cycles():
    edges = {
        "a": {"b"}, "b": {"c"}, "c": {"a", "d"},  # a -> b -> c -> a
        "d": {"e"}, "e": {"d"},  # d <-> e, reached from the first
        "f": {"a"}, "g": set(),  # on no cycle
        "h": {"h"},  # a module importing itself is no cycle of modules
    }
    assert cycles(edges) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_no_cycle_is_allowed():
    assert not ALLOWED
    assert not allowed(["watchdog.daemon.tick.ticker", "watchdog.daemon.tick.tickread"])
    assert not allowed(["watchdog.sdk.run", "watchdog.sdk.client"])
