"""The package's layers import one way (issue 13): the import-linter contracts in
pyproject.toml pass, and no two packages of dlvm_eq import each other, lazy imports included.

`lint-imports` reads every import statement in a module, also those inside functions, so a
lazy import that points up a layer fails here as an eager one would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.fail("lint-imports is not installed: the test extra installs import-linter")
    run = subprocess.run(
        [exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _package_edges(graph, depth: int, under: str) -> dict[str, set[str]]:
    """Edges between the packages `depth` levels below the root, for modules under `under`."""

    def package(module: str) -> str | None:
        parts = module.split(".")
        if not module.startswith(under + ".") or len(parts) <= depth:
            return None
        return ".".join(parts[: depth + 1])

    edges: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        a = package(module)
        if a is None:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            b = package(imported)
            if b is not None and b != a:
                edges[a].add(b)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("dlvm_eq", cache_dir=None)


def test_no_package_cycles(graph):
    assert _cycles(_package_edges(graph, 1, "dlvm_eq")) == []


def test_no_codegen_subpackage_cycles(graph):
    assert _cycles(_package_edges(graph, 2, "dlvm_eq.codegen")) == []


def test_cycle_finder_finds_a_planted_cycle():
    # the check above must be able to fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
