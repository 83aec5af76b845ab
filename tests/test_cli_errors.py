"""The ``tablestore-cdc`` command never prints a traceback: one ``error:`` line, exit code 2.

Whatever a command raises -- the product's typed errors and, for a bug, any other exception --
ends in one line on stderr; ``--verbose`` (before the command, or ``TABLESTORE_CDC_VERBOSE=1``)
prints the Python traceback above it. Checked through typer's runner and once through the
installed console script in its own process (typer's own exception hook included).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meta_store import open_meta_store
from meta_store.errors import CorruptMetaRecordError
from meta_store.sqlite import SqliteMetaStore
from tablestore_cdc.cli import app

NS = "local:/data/store.db#orders#t1"


@pytest.fixture
def meta_uri(tmp_path: Path) -> str:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    with open_meta_store(uri) as store:
        store.set_namespace_info(NS, {"table": "orders"})
    return uri


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stderr.splitlines()


def a_bug(*_: object) -> list[str]:
    raise AttributeError("'NoneType' object has no attribute 'startswith'\nsecond line")


def test_a_bug_is_one_line_naming_the_exception_and_the_flag(
        meta_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SqliteMetaStore, "list_namespaces", a_bug)
    code, lines = run("meta", "namespaces", "--meta", meta_uri)
    assert code == 2
    assert lines == ["error: unexpected AttributeError: 'NoneType' object has no attribute "
                     "'startswith' (a bug; rerun with --verbose for the trace)"]


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_verbose_prints_the_trace_above_the_line(meta_uri: str, monkeypatch: pytest.MonkeyPatch,
                                                 how: str) -> None:
    monkeypatch.setattr(SqliteMetaStore, "list_namespaces", a_bug)
    args = ["meta", "namespaces", "--meta", meta_uri]
    if how == "flag":
        code, lines = run("--verbose", *args)
    else:
        code, lines = run(*args, env={"TABLESTORE_CDC_VERBOSE": "1"})
    assert code == 2
    assert lines[0] == "Traceback (most recent call last):"
    assert "in a_bug" in "\n".join(lines)
    assert lines[-1].startswith("error: unexpected AttributeError: ")
    assert lines[-1].endswith("(a bug)")


def test_a_typed_error_is_one_line_and_its_trace_with_verbose(
        meta_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def corrupt(self: SqliteMetaStore) -> list[str]:
        raise CorruptMetaRecordError(store=self.uri, key="k", reason="line one\nline two")

    monkeypatch.setattr(SqliteMetaStore, "list_namespaces", corrupt)
    code, lines = run("meta", "namespaces", "--meta", meta_uri)
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("error: meta store sqlite://") and lines[0].endswith("line one")
    code, lines = run("--verbose", "meta", "namespaces", "--meta", meta_uri)
    assert code == 2 and lines[0] == "Traceback (most recent call last):"
    assert lines[-1].startswith("error: meta store sqlite://")


BUG_SCRIPT = """
import sys
from meta_store.sqlite import SqliteMetaStore
def bug(self):
    raise KeyError("boom")
SqliteMetaStore.list_namespaces = bug
from tablestore_cdc.cli import app
sys.argv = ["tablestore-cdc", *sys.argv[1:]]
app()
"""


def test_the_console_script_prints_no_traceback(meta_uri: str) -> None:
    """The installed entry point (``app()``, typer's exception hook in place)."""
    env = {k: v for k, v in os.environ.items() if k != "TABLESTORE_CDC_VERBOSE"}
    run_ = subprocess.run([sys.executable, "-c", BUG_SCRIPT, "meta", "namespaces", "--meta",
                           meta_uri], capture_output=True, text=True, timeout=120, env=env)
    assert run_.returncode == 2, run_.stderr
    assert run_.stderr.splitlines() == ["error: unexpected KeyError: 'boom' (a bug; rerun with "
                                        "--verbose for the trace)"]
    assert "Traceback" not in run_.stdout + run_.stderr
