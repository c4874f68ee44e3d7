"""The house rules that import-linter cannot state (docs/architecture.md, "Layers"), held in CI.

- no function over 60 lines and no module over 450 in the product (``cis/``): a function is counted from its
  first decorator to its last line, a module by its lines;
- no import circle between the product's modules, counting every import: module-level, annotation-only
  (``if TYPE_CHECKING:``) and inside functions (a lazy import that closes a circle is still a circle).
  ``from cis import X`` imports the root package (its lazy public names): only the command layer may.

Each rule is checked on the real tree and, so the check itself is known to work, on a small tree that
breaks it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ROOT / "cis"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450


def modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``package`` (its folder's name is the root)."""
    out = {}
    for p in sorted(package.rglob("*.py")):
        parts = list(p.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def long_functions(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lines = (node.end_lineno or node.lineno) - start + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{path}:{node.lineno} {node.name} has {lines} lines")
    return found


def module_lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the product's modules it imports (a name imported from a package counts as its module when
    there is one, else the package)."""
    root = next(iter(mods)).split(".")[0]

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == root and (target := owner(name)) and target != m:
                    graph[m].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_product_function_over_60_lines():
    found = [f for p in modules(PRODUCT).values() for f in long_functions(p)]
    assert not found, "functions over 60 lines:\n" + "\n".join(found)


def test_no_product_module_over_450_lines():
    found = [f"{p.relative_to(ROOT)} has {n} lines" for p in modules(PRODUCT).values()
             if (n := module_lines(p)) > MAX_MODULE_LINES]  # fmt: skip
    assert not found, "modules over 450 lines:\n" + "\n".join(found)


def test_no_import_circle_in_the_product_annotations_included():
    found = circles(import_graph(modules(PRODUCT)))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_only_the_command_layer_imports_the_root_package():
    graph = import_graph(modules(PRODUCT))
    found = sorted(m for m, targets in graph.items() if "cis" in targets and not m.startswith("cis.cli"))
    assert not found, f"modules that import the root package cis (its lazy public names): {found}"


@pytest.fixture()
def broken_tree(tmp_path):
    """A package that breaks every rule: a 61-line function, a 451-line module, an annotation-only circle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (pkg / "long.py").write_text(f"def f():\n{body}\n    return 0\n")
    (pkg / "big.py").write_text("\n".join(f"v{i} = {i}" for i in range(451)) + "\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("from pkg.a import A\n\n\ndef g():\n    from pkg import long\n")
    return pkg


def test_the_rules_catch_a_tree_that_breaks_them(broken_tree):
    mods = modules(broken_tree)
    assert long_functions(mods["pkg.long"]) and not long_functions(mods["pkg.b"])
    assert module_lines(mods["pkg.big"]) == 451 > MAX_MODULE_LINES
    assert circles(import_graph(mods)) == [["pkg.a", "pkg.b"]]
