"""Which code may import which: the map in docs/index.md, checked on the source.

The product's packages stand on each other in one direction only:

    cdc_common  <-  meta_store  <-  connector  <-  tablestore_emulator  <-  tablestore_cdc

A module may import from its own package and from packages to its left, never to its right,
and never the test support (``testkit``, ``tests``, ``integration``, ``benchmarks``).
``testkit`` may import any product package; ``tests/``, ``integration/`` and ``benchmarks/`` may
import the product and ``testkit``, and ``tests/`` and ``integration/`` not each other. Within
the product no module import cycle exists.

Checked on the source text (every ``import``/``from`` statement, including those inside
functions and under ``if TYPE_CHECKING:``), so a lazy import cannot hide a wrong-way dependency
or a cycle.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the product's packages, each importing only from those before it
LAYERS = ["cdc_common", "meta_store", "connector", "tablestore_emulator", "tablestore_cdc"]
#: code that supports tests; the product never imports it
TEST_SUPPORT = ["testkit", "tests", "integration", "benchmarks"]
#: top-level packages each folder of test code may import besides the product and itself
TEST_CODE_MAY_IMPORT = {
    "testkit": set(),
    "tests": {"testkit", "benchmarks"},  # tests/test_benchmarks_smoke.py runs the benchmarks
    "integration": {"testkit"},
    "benchmarks": {"testkit"},
}


def _python_files(package: str, root: Path = ROOT) -> list[Path]:
    return sorted((root / package).rglob("*.py"))


def _imports(path: Path, root: Path = ROOT) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of ``path`` with the absolute name it imports from."""
    package = list(path.relative_to(root).parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node, node.module or ""
            else:  # relative: resolved against the importing module's package
                base = package[: len(package) - node.level + 1]
                yield node, ".".join([*base, *([node.module] if node.module else [])])


def _top_levels(path: Path) -> set[tuple[str, int]]:
    return {(name.split(".")[0], node.lineno) for node, name in _imports(path)}


def _existing(packages: list[str]) -> list[str]:
    return [p for p in packages if (ROOT / p).is_dir()]


def _imports_of(folder: str, names: set[str]) -> list[str]:
    """``path:line imports name`` for every import of ``names`` in ``folder``."""
    return [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _python_files(folder)
        for name, line in sorted(_top_levels(path))
        if name in names
    ]


@pytest.mark.parametrize("package", LAYERS)
def test_imports_go_one_way(package: str) -> None:
    if not (ROOT / package).is_dir():
        pytest.skip(f"{package}/ does not exist yet")
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    wrong = _imports_of(package, (set(LAYERS) - allowed) | set(TEST_SUPPORT))
    assert not wrong, f"{package} may only import {sorted(allowed)}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("folder", sorted(TEST_CODE_MAY_IMPORT))
def test_test_code_imports_the_product_testkit_and_itself(folder: str) -> None:
    allowed = {folder, *LAYERS, *TEST_CODE_MAY_IMPORT[folder]}
    forbidden = set(TEST_SUPPORT) - allowed
    wrong = _imports_of(folder, forbidden)
    assert not wrong, f"{folder} may not import {sorted(forbidden)}:\n" + "\n".join(wrong)


# --- no module import cycle in the product ------------------------------------------------------


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(packages: list[str], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports. ``import a.b.c`` and ``from a.b
    import c`` point at module ``a.b.c`` when it exists, else at the nearest enclosing module
    (``a.b``: a name defined in a package's ``__init__``). The parents a statement imports
    implicitly (``a``'s ``__init__``) are left out: a package's ``__init__`` importing its own
    modules is the usual shape, not a cycle."""
    files = {_module_name(p, root): p for package in packages
             for p in _python_files(package, root)}
    graph: dict[str, set[str]] = {name: set() for name in files}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    for module, path in files.items():
        for node, name in _imports(path, root):
            targets = [name]
            if isinstance(node, ast.ImportFrom):
                targets = [f"{name}.{alias.name}" for alias in node.names]
            for target in targets:
                found = resolve(target)
                if found is not None and found != module:
                    graph[module].add(found)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def test_no_module_import_cycle_in_the_product() -> None:
    cycles = import_cycles(import_graph(_existing(LAYERS)))
    assert not cycles, "module import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_crash_points_seam_imports_nothing_of_the_product() -> None:
    """``connector.crash_hook`` (the crash points' seam, on the executor's read path) imports
    no product module: a crash point is one check and pulls nothing in; the fault harness's
    hook lives in ``testkit`` (``testkit/crash_points.py``), which the product never imports."""
    graph = import_graph(_existing(LAYERS))
    assert graph["connector.crash_hook"] == set()


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    """The check is not blind: two modules importing each other, one of them inside a
    function and by a relative import, are reported; a one-way import is not."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("from p.a import f\n")
    (tmp_path / "p" / "a.py").write_text("def f():\n    from . import b\n    return b\n")
    (tmp_path / "p" / "b.py").write_text("import p.a\n")
    (tmp_path / "p" / "c.py").write_text("from p.b import p\n")
    graph = import_graph(["p"], tmp_path)
    assert graph == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.b"}}
    assert import_cycles(graph) == [["p.a", "p.b"]]
    assert import_cycles({"p.a": {"p.b"}, "p.b": set()}) == []


def test_finished_token_agrees_across_layers() -> None:
    from cdc_common.tokens import FINISHED
    from connector.tunnel.base import FINISHED as tunnel_finished
    from meta_store.base import FINISHED as meta_finished

    assert meta_finished == tunnel_finished == "finished"
    assert meta_finished is FINISHED and tunnel_finished is FINISHED


def test_finished_is_written_once_in_the_product() -> None:
    """The token's literal appears in one module; every other compares against ``FINISHED``.
    A JSON field named "finished" (a dict key, a subscript) is not the token."""
    found = sorted(
        str(path.relative_to(ROOT))
        for package in LAYERS
        for path in (ROOT / package).rglob("*.py")
        for node in _token_literals(ast.parse(path.read_text(), filename=str(path)))
    )
    assert found == ["cdc_common/tokens.py"], f'"finished" written outside cdc_common: {found}'


def _token_literals(tree: ast.AST) -> list[ast.Constant]:
    keys = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys}
    keys |= {id(node.slice) for node in ast.walk(tree) if isinstance(node, ast.Subscript)}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and node.value == "finished" and id(node) not in keys]


def test_errors_have_one_root_reexported_by_connector() -> None:
    from cdc_common.errors import CdcError
    from connector import errors as connector_errors
    from meta_store import errors as meta_errors

    assert connector_errors.CdcError is meta_errors.CdcError is CdcError
    assert issubclass(connector_errors.TunnelError, meta_errors.CdcError)
    assert connector_errors.UnknownBatchError is meta_errors.UnknownBatchError


# --- the map in docs/index.md ------------------------------------------------------------------

#: the folders whose every module docs/index.md names on a line of its own
MAPPED = [*LAYERS, "testkit"]
MODULE_ROW = re.compile(r"^\| `([\w/]+\.(?:py|c))` \| ", re.M)


def _mapped_modules() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for package in _existing(MAPPED)
                  for path in (ROOT / package).rglob("*") if path.suffix in (".py", ".c")
                  and "__pycache__" not in path.parts)


def test_docs_index_names_every_module_once() -> None:
    """docs/index.md's "Every module" tables have one row per module of the product and of
    ``testkit``: none missing, none twice, none that no longer exists."""
    rows = MODULE_ROW.findall((ROOT / "docs" / "index.md").read_text())
    modules = _mapped_modules()
    missing = sorted(set(modules) - set(rows))
    stale = sorted(set(rows) - set(modules))
    twice = sorted({r for r in rows if rows.count(r) > 1})
    assert not missing, "modules docs/index.md does not name:\n" + "\n".join(missing)
    assert not stale, "docs/index.md names modules that do not exist:\n" + "\n".join(stale)
    assert not twice, "docs/index.md names these modules twice:\n" + "\n".join(twice)


def test_the_module_map_check_sees_a_missing_row(tmp_path: Path) -> None:
    """The row pattern is not blind: it reads the map's rows and nothing else."""
    text = ("| `a/b.py` | one line |\n| `a/_c.c` | compiled |\n"
            "prose naming `a/d.py` is not a row\n| module | what it holds |\n")
    assert MODULE_ROW.findall(text) == ["a/b.py", "a/_c.c"]


# --- test modules stand alone --------------------------------------------------------------------


def test_no_test_module_imports_another() -> None:
    """A helper two test modules need lives in ``testkit`` (or a suite's support module such as
    ``tests/contract/``), never in a test module another one imports: importing a test module
    also collects its tests and fixtures where they were not meant to run."""
    wrong = [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
        for folder in ("tests", "integration", "benchmarks")
        for path in _python_files(folder)
        for node, name in _imports(path)
        if name.split(".")[0] in ("tests", "integration")
        and any(part.startswith("test_") for part in name.split(".")[1:])
    ]
    assert not wrong, "test modules importing test modules:\n" + "\n".join(wrong)


# --- module size ---------------------------------------------------------------------------------

#: a module longer than this holds more than one concern: split it by what it does
MAX_MODULE_LINES = 650


def test_no_product_module_is_longer_than_the_limit() -> None:
    long = [f"{path.relative_to(ROOT)}: {lines} lines"
            for package in LAYERS for path in _python_files(package)
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"product modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)
