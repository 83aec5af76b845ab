"""The packages stand on each other in one direction only (see tablestore_cdc/__init__.py):

    cdc_common  <-  meta_store  <-  connector  <-  tablestore_emulator  <-  tablestore_cdc

A module may import from its own package and from packages to its left, never to its right.
Checked on the source text (every ``import``/``from`` statement, including those inside
functions), so a lazy import cannot hide a wrong-way dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["cdc_common", "meta_store", "connector", "tablestore_emulator", "tablestore_cdc"]


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update((alias.name.split(".")[0], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", LAYERS)
def test_imports_go_one_way(package: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    forbidden = set(LAYERS) - allowed
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line in sorted(_imported_packages(path))
        if name in forbidden
    ]
    assert not wrong, f"{package} may only import {sorted(allowed)}:\n" + "\n".join(wrong)


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
