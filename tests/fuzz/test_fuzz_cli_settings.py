"""Fuzz targets: hostile settings files (``replicate --config``) and command lines.

Input, settings: a valid per-table settings file mutated byte by byte, or one built from parts
that break readers (nesting of arrays, inline tables and dotted keys to past the bound, long
integers, bytes that are not UTF-8, strings holding brackets, unterminated strings).
Property: ``load_table_config`` gives a ``TableConfig`` or a ``TableConfigError`` naming the
file; never another error (no ``RecursionError``, ``UnicodeDecodeError`` or ``ValueError``).

Input, command lines: a command of ``tablestore-cdc`` with one of its text values replaced by
text holding what the terminal can hand over (bytes that are not UTF-8 as lone surrogates,
control characters, any character). Property: exit code 0 or 2; on 2 one ``error:`` line on
stderr that is not "unexpected" (a bug), or click's usage message for a value it took for an
option (``-0``); no traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from connector.local import LocalTablestore
from tablestore_cdc.commands.app import app
from tablestore_cdc.pipeline.table_config import (
    MAX_SETTINGS_DEPTH,
    TableConfig,
    TableConfigError,
    load_table_config,
)
from testkit.fuzzing import fuzz_settings, mutated

pytestmark = pytest.mark.fuzz

VALID = b"""# per-table settings
[defaults]
schema_drift = "lenient"
max_offsets_per_trigger = 50000

[tables.orders]
scd = 2
target = "iceberg:///wh?table=cdc.{table}"
keys = ["id", "region"]

[tables.events]
snapshot_op = "READ"
soft_delete_column = "deleted"
max_bytes_per_trigger = 1048576
"""

PARTS = st.one_of(
    st.builds(lambda opening, closing, n: b"a = " + opening * n + closing * n,
              st.sampled_from([b"[", b"{b = "]), st.sampled_from([b"]", b"}"]),
              st.sampled_from([MAX_SETTINGS_DEPTH - 1, MAX_SETTINGS_DEPTH + 1, 3_000])),
    st.builds(lambda n: b"[tables." + b".".join([b"x"] * n) + b"]\nscd = 1",
              st.sampled_from([2, MAX_SETTINGS_DEPTH + 2, 3_000])),
    st.builds(lambda n: b"[defaults]\nmax_offsets_per_trigger = " + b"9" * n,
              st.sampled_from([10, 4_300, 4_301, 10_000])),
    st.sampled_from([b'[tables.orders]\ntarget = "[[[[{{{{"', b"a = '''[[[[\n]]]]'''",
                     b'a = "unterminated [[[[', b'a = """\n' + b"[" * 500 + b'"""',
                     b"a = 1e999", b"a = nan", b"\xff\xfe", b"# \xc3\x28", b"\xed\xa0\x80",
                     b"[tables]\n\x00", b"a = 0x" + b"f" * 5_000]),
)


@st.composite
def settings_files(draw: Any) -> bytes:
    if draw(st.booleans()):
        event("settings: mutated valid file")
        return draw(mutated(VALID, max_edits=6))
    event("settings: built from hostile parts")
    return b"\n".join(draw(st.lists(PARTS, min_size=1, max_size=3)))


@given(content=settings_files())
@fuzz_settings()
def test_hostile_settings_files_end_in_a_config_or_a_config_error(
        tmp_path_factory: pytest.TempPathFactory, content: bytes) -> None:
    path = tmp_path_factory.mktemp("settings") / "tables.toml"
    path.write_bytes(content)
    try:
        config = load_table_config(path)
    except TableConfigError as exc:
        message = str(exc)
        assert message.startswith(f"config {path}: ")
        message.encode("utf-8")
        kind = re.sub(r"0x[0-9A-F]+|[0-9]+", "N", message.removeprefix(f"config {path}: "))
        event(f"settings: TableConfigError ({kind.split('(')[0].strip()[:40]})")
    else:
        assert isinstance(config, TableConfig)
        event("settings: read")


# --- command lines -------------------------------------------------------------------------

HOSTILE_TEXT = st.one_of(
    st.text(st.characters(categories=["Cs", "Cc"]), min_size=1, max_size=4),
    st.text(max_size=12),
    st.binary(min_size=1, max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape")),
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("cli") / "store.db"
    LocalTablestore(path).create_table("t", [("id", "INTEGER")], channels=2)
    yield path


#: commands that end at once whatever their text (nothing long-running is started): each a
#: list where "{}" marks the value replaced
COMMANDS = [
    ["local", "channels", "{store}", "{}"],
    ["local", "create-table", "{store}", "{}", "--pk", "id:INTEGER"],
    ["local", "create-table", "{store}", "u", "--pk", "{}"],
    ["local", "put", "{store}", "t", "--pk", "{}"],
    ["local", "split", "{store}", "t", "{}"],
    ["local", "tunnels", "{store}", "{}"],
    ["meta", "show", "{}", "--meta", "sqlite:///nonexistent/meta.db"],
    ["meta", "batches", "--meta", "{}"],
    ["replicate", "--table", "{}", "--output", "{tmp}/out"],
    ["replicate", "--table", "t", "--target", "{}", "--output", "{tmp}/out"],
    ["replicate", "--tables", "{}", "--output", "{tmp}/out"],
]


@given(command=st.sampled_from(COMMANDS), text=HOSTILE_TEXT)
@fuzz_settings(default=150)
def test_hostile_text_on_the_command_line_is_one_line_at_most(
        store: Path, tmp_path_factory: pytest.TempPathFactory, command: list[str],
        text: str) -> None:
    tmp = tmp_path_factory.mktemp("line")
    line = [text if a == "{}" else a.format(store=store, tmp=tmp) for a in command]
    result = CliRunner().invoke(app, line)
    assert result.exit_code in (0, 2), (line, result.output, result.exception)
    assert "Traceback" not in result.output
    errors = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    usage = [x for x in result.stderr.splitlines() if x.startswith("Error:")]
    # exit 2: the product's one line, or click's usage message (a value taken for an option)
    assert (len(errors) + len(usage)) == (result.exit_code == 2), (line, result.stderr)
    assert not any(x.startswith("error: unexpected ") for x in errors), (line, errors)
    event(f"{command[0]} {command[1]}: exit {result.exit_code}")
    if errors and ("not UTF-8" in errors[0] or "control character" in errors[0]
                   or "surrogate" in errors[0]):
        event("command line: refused as not text")
