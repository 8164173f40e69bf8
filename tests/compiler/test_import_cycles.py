"""No import cycle of more than 3 modules in shapescript/: each stage reads the ones below it, and
a cycle is where that breaks down. Imports inside functions count (they run when called); imports
under `if TYPE_CHECKING:` don't (they never run). grimp is import-linter's own graph."""

from __future__ import annotations

import grimp

import shapescript

LONGEST_CYCLE = 3


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, iteratively (no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_the_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycle_of_more_than_three_modules() -> None:
    imports = grimp.build_graph(shapescript.__name__, exclude_type_checking_imports=True, cache_dir=None)
    graph = {m: set(imports.find_modules_directly_imported_by(m)) for m in imports.modules}
    too_long = [c for c in strongly_connected(graph) if len(c) > LONGEST_CYCLE]
    assert not too_long, f"import cycles of more than {LONGEST_CYCLE} modules: {too_long}"
