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
from tablestore_cdc.commands.app import app

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
from tablestore_cdc.commands.app import app
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


# --- hostile command lines: bytes that are not UTF-8, control characters ----------------------


@pytest.mark.parametrize("args, label", [
    (["replicate", "--table", "t\udcff", "--output", "{tmp}/out"], "--table"),
    (["replicate", "--table=t\udcff", "--output", "{tmp}/out"], "--table"),
    (["replicate", "--table", "t", "--target", "delta:///x\udcff", "--output", "{tmp}/out"],
     "--target"),
    (["replicate", "--tables", "a,b\x00", "--output", "{tmp}/out"], "--tables"),
    (["local", "create-table", "{tmp}/s.db", "t\udcff", "--pk", "id:INTEGER"],
     "argument TABLE"),
    (["local", "create-table", "{tmp}/s.db", "t", "--pk", "id\x1b[2J:INTEGER"], "--pk"),
    (["local", "channels", "{tmp}/s.db", "t\ud800"], "argument TABLE"),
    (["local", "tables", "{tmp}/s\udcff.db"], "argument STORE"),
    (["meta", "batches", "--meta", "sqlite:///m\udcff.db"], "--meta"),
    (["meta", "show", "ab\x00cd", "--meta", "{meta}"], "argument UUID"),
    (["--verbose", "meta", "show", "ab\udc80cd", "--meta", "{meta}"], "argument UUID"),
], ids=lambda v: ascii(v)[:40] if isinstance(v, list) else v)
def test_a_non_utf8_byte_or_control_character_in_an_argument_names_it(
        tmp_path: Path, meta_uri: str, args: list[str], label: str) -> None:
    """A byte of the command line that is not UTF-8 arrives as a lone surrogate, which SQLite,
    URIs and JSON cannot encode (UnicodeEncodeError, "a bug", before): each value is checked
    before any command runs, and the line names the flag or argument. Nothing is created."""
    line = [a.format(tmp=tmp_path, meta=meta_uri) for a in args]
    before = sorted(tmp_path.iterdir())
    code, lines = run(*line)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"error: {label}: "), lines
    assert "not UTF-8" in lines[0] or "surrogate" in lines[0] or "control character" in lines[0]
    assert sorted(tmp_path.iterdir()) == before


def test_tabs_and_line_breaks_in_a_value_are_text(tmp_path: Path) -> None:
    """A JSON value spanning lines (``--option catalog=...``) is text: not refused here."""
    code, lines = run("replicate", "--table", "t", "--option", 'catalog={\n\t"columns": {}\n}',
                      "--output", str(tmp_path / "out"))
    assert code == 2 and not any("control character" in line for line in lines), lines


@pytest.mark.parametrize("command", [
    ["replicate", "--table", "t", "--tunnel", "x", "--output", "{tmp}/out"],
    ["reconcile", "--table", "t", "--tunnel", "x", "--target", "delta://{tmp}/t"],
    ["resnapshot", "--table", "t", "--tunnel", "x"],
], ids=["replicate", "reconcile", "resnapshot"])
@pytest.mark.parametrize("option, flag", [
    ("tables=a,b", "--tables or --table"), ("TABLES=a", "--tables or --table"),
    ("endpoint=local:///elsewhere.db", "--store or --endpoint"), ("exclude=b*", "--exclude"),
    ("tunnel.name=other", "--tunnel"), ("Table.Name=t2", "--table"),
])
def test_a_reader_option_the_command_has_a_flag_for_is_refused_naming_it(
        tmp_path: Path, command: list[str], option: str, flag: str) -> None:
    """Given twice (a flag and ``--option``), one part of a command could read the selection
    from one and another part from the other: refused before anything starts."""
    (tmp_path / "s.db").write_bytes(b"")
    before = sorted(tmp_path.iterdir())
    code, lines = run(*(arg.format(tmp=tmp_path) for arg in command), "--store",
                      str(tmp_path / "s.db"), "--option", option)
    assert code == 2
    assert lines == [f"error: --option {option.partition('=')[0]}=...: give it as {flag}"]
    assert sorted(tmp_path.iterdir()) == before


# --- hostile settings files (replicate --config) --------------------------------------------


@pytest.mark.parametrize("content, words", [
    (b"a = " + b"[" * 5_000 + b"]" * 5_000, "nests arrays or tables deeper than 64 levels"),
    (b"a = " + b"{b = " * 5_000 + b"}" * 5_000, "nests arrays or tables deeper than 64 levels"),
    (b"[tables." + b".".join([b"x"] * 5_000) + b"]\n",
     "nests arrays or tables deeper than 64 levels"),
    (b"[defaults]\nscd = 1\n# caf\xe9\n", "is not UTF-8 text (byte 0xE9 at offset 24)"),
    (b"\xff\xfe[\x00d\x00", "is not UTF-8 text (byte 0xFF at offset 0)"),
    (b"[defaults]\nmax_offsets_per_trigger = " + b"9" * 5_000 + b"\n",
     "line 2: key 'max_offsets_per_trigger': an integer of more than 4300 digits"),
    (b"[tables.orders]\nmax_bytes_per_trigger = 1" + b"0" * 4_400 + b"\n",
     "line 2: key 'max_bytes_per_trigger': an integer of more than 4300 digits"),
], ids=["deep-arrays", "deep-inline-tables", "deep-dotted", "latin-1", "utf-16",
        "long-integer", "long-integer-in-a-table"])
def test_a_hostile_settings_file_is_one_line_naming_the_file(
        tmp_path: Path, content: bytes, words: str) -> None:
    config = tmp_path / "tables.toml"
    config.write_bytes(content)
    code, lines = run("replicate", "--config", str(config), "--tables", "orders", "--endpoint",
                      f"local://{tmp_path / 'store.db'}", "--output", str(tmp_path / "out"))
    assert code == 2
    assert lines == [f"error: config {config}: {words}"] or (
        len(lines) == 1 and lines[0].startswith(f"error: config {config}: {words}")), lines


def test_settings_nesting_within_the_bound_and_brackets_in_strings_are_read(
        tmp_path: Path) -> None:
    from tablestore_cdc.pipeline.table_config import (
        MAX_SETTINGS_DEPTH,
        bracket_depth_exceeds,
        load_table_config,
    )

    config = tmp_path / "tables.toml"
    config.write_text('# [[[[ a comment\n[tables.orders]\ntarget = "delta:///w/{table}[[[[[["\n'
                      "keys = ['a]]]]', \"b\\\"[[[[\"]\n"
                      + 'soft_delete_column = """\n' + "[" * 200 + '"""\n')
    settings = load_table_config(config).tables["orders"]
    assert settings.keys == ("a]]]]", 'b"[[[[') and settings.target.endswith("[[[[[[")
    assert not bracket_depth_exceeds("a = " + "[" * MAX_SETTINGS_DEPTH + "]" * MAX_SETTINGS_DEPTH,
                                     MAX_SETTINGS_DEPTH)
    assert bracket_depth_exceeds("a = " + "[" * (MAX_SETTINGS_DEPTH + 1), MAX_SETTINGS_DEPTH)


def test_a_non_utf8_byte_from_a_real_command_line(tmp_path: Path) -> None:
    """The bytes a terminal hands over, through the installed entry point in its own process
    (Python decodes argv with surrogateescape)."""
    script = ("import sys\nfrom tablestore_cdc.commands.app import app\n"
              "sys.argv = ['tablestore-cdc', *sys.argv[1:]]\napp()\n")
    env = {k: v for k, v in os.environ.items() if k != "TABLESTORE_CDC_VERBOSE"}
    run_ = subprocess.run([sys.executable, "-c", script, b"replicate", b"--table", b"caf\xe9",
                           b"--output", str(tmp_path / "out").encode()],
                          capture_output=True, timeout=120, env={**env, "LC_ALL": "C.UTF-8"})
    assert run_.returncode == 2, run_.stderr
    assert run_.stderr.decode().splitlines() == [
        "error: --table: byte 0xE9 at position 3 is not UTF-8"]
    assert not (tmp_path / "out").exists()
