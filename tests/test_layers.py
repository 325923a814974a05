"""Imports point down only: the package layers of docs/architecture.md, checked on the source.

Every module of compiler/, tuner/, cost_model/ and db/ is parsed (never imported), and every import is
collected: ``import x``, ``from x import y`` (also relative ones), imports inside functions, classes and
``if TYPE_CHECKING:`` blocks, and ``importlib.import_module("x")`` / ``__import__("x")`` calls with a
string literal. An import is allowed when it stays inside its package or goes to a package below it:

    tuner -> compiler, cost_model, db
    cost_model -> compiler, db
    db -> compiler
    compiler -> (none of the other three)

Inside compiler, a few sub-layers are checked the same way (see ``COMPILER_FORBIDDEN``). Each violation is
reported as ``file:line: package -> package (import text)``; circular imports between the packages (and
between compiler's sub-packages) are reported with the cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("compiler", "tuner", "cost_model", "db")
ALLOWED: dict[str, set[str]] = {
    "tuner": {"compiler", "cost_model", "db"},
    "cost_model": {"compiler", "db"},
    "db": {"compiler"},
    "compiler": set(),
}
# Inside compiler: (importing module prefix, forbidden imported module prefix, why).
COMPILER_FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("compiler.graph", "compiler.backends", "the graph is below every backend"),
    ("compiler.ops", "compiler.backends", "ops are target independent"),
    ("compiler.passes", "compiler.backends", "graph passes are target independent"),
    ("compiler.loopir", "compiler.backends", "the loop IR and its passes are shared by every backend"),
    ("compiler.codegen", "compiler.backends", "the C-style printer base is shared by every backend"),
    ("compiler.loopir", "compiler.runtime", "the loop IR is below the runtime"),
    ("compiler.runtime", "compiler.backends.cpu.sketches", "the runtime replays kernels, never schedules"),
    ("compiler.runtime", "compiler.backends.cuda.sketches", "the runtime replays kernels, never schedules"),
    ("compiler.backends.cpu", "compiler.backends.cuda", "one backend never reaches into another"),
    ("compiler.backends.cuda", "compiler.backends.cpu", "one backend never reaches into another"),
)


@dataclass(frozen=True)
class Import:
    """One import found in a source file: the importing module, the imported module, where it is."""

    source: str  # dotted module name of the importing file
    target: str  # dotted name of the imported module (or of the object's module for `from x import y`)
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(source: str, is_package: bool, level: int, module: str | None) -> str:
    base = source.split(".") if is_package else source.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def imports_of(path: Path, text: str | None = None) -> Iterator[Import]:
    """Every import of one file (at any depth, including string literals given to import_module);
    ``text`` stands in for the file's content when given."""
    source = module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve_relative(source, is_package, node.level, node.module)
            else:
                base = node.module or ""
            yield Import(source, base, path, node.lineno)
            # `from pkg import submodule` imports pkg.submodule: check the submodule too
            for alias in node.names:
                if (ROOT / Path(*base.split("."), alias.name)).is_dir() or (
                    ROOT / Path(*base.split("."), f"{alias.name}.py")
                ).is_file():
                    yield Import(source, f"{base}.{alias.name}", path, node.lineno)
        elif isinstance(node, ast.Call) and node.args and _is_import_call(node):
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield Import(source, first.value, path, node.lineno)
            elif isinstance(first, ast.Name):
                dynamic = True
    if dynamic:  # import_module(name): module names listed in module-level constants count as imports
        yield from _listed_modules(tree, source, path)


def _is_import_call(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__")


def _listed_modules(tree: ast.Module, source: str, path: Path) -> Iterator[Import]:
    """String constants in module-level tuples/lists that name a module of the four packages (e.g. the
    CLI's ``COMMAND_MODULES``)."""
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assign | ast.AnnAssign) or stmt.value is None:
            continue
        if not isinstance(stmt.value, ast.Tuple | ast.List):
            continue
        for elt in stmt.value.elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str) and _is_module(elt.value):
                yield Import(source, elt.value, path, elt.lineno)


def _is_module(name: str) -> bool:
    if package_of(name) is None:
        return False
    base = ROOT / Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def all_imports() -> list[Import]:
    out: list[Import] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            out.extend(imports_of(path))
    return out


def package_of(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in PACKAGES else None


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Elementary cycles of a small directed graph, one per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return components


IMPORTS = all_imports()


def test_the_scan_sees_every_package_and_lazy_imports() -> None:
    sources = {package_of(i.source) for i in IMPORTS}
    assert sources == set(PACKAGES)
    # the CLI registers its commands through importlib.import_module(name) over a tuple of module names
    assert any(i.source == "tuner.cli" and i.target == "tuner.commands.query" for i in IMPORTS)


def test_packages_import_only_downwards() -> None:
    bad = []
    for imp in IMPORTS:
        src, dst = package_of(imp.source), package_of(imp.target)
        if dst is None or src == dst or src is None:
            continue
        if dst not in ALLOWED[src]:
            bad.append(f"{imp.where()}: {src} -> {dst} (imports {imp.target})")
    rules = "; ".join(f"{p} -> {', '.join(sorted(a)) or 'nothing'}" for p, a in ALLOWED.items())
    assert not bad, f"upward imports (allowed: {rules}):\n" + "\n".join(bad)


def test_no_circular_package_imports() -> None:
    edges: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for imp in IMPORTS:
        src, dst = package_of(imp.source), package_of(imp.target)
        if src and dst and src != dst:
            edges[src].add(dst)
    cycles = find_cycles(edges)
    assert not cycles, "circular imports between packages: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("importer,forbidden,why", COMPILER_FORBIDDEN)
def test_compiler_sub_layers(importer: str, forbidden: str, why: str) -> None:
    bad = [
        f"{imp.where()}: {imp.source} imports {imp.target}"
        for imp in IMPORTS
        if _within(imp.source, importer) and _within(imp.target, forbidden)
    ]
    assert not bad, f"{importer} must not import {forbidden} ({why}):\n" + "\n".join(bad)


def test_the_checker_reports_file_and_line() -> None:
    """The scanner itself: lazy, relative and import_module imports are found with their lines."""
    text = (
        "import importlib\n"
        "def f():\n"
        "    from tuner.space import config_json\n"
        "    importlib.import_module('cost_model.model')\n"
        "from . import status\n"
        "MODULES = ('tuner.cli', 'not.a.module')\n"
        "def g(name):\n"
        "    return importlib.import_module(name)\n"
    )
    found = {(i.target, i.line) for i in imports_of(ROOT / "db" / "_layers_probe.py", text)}
    assert {
        ("tuner.space", 3),
        ("cost_model.model", 4),
        ("db", 5),
        ("db.status", 5),
        ("tuner.cli", 6),
    } <= found
    assert not any(target == "not.a.module" for target, _ in found)
