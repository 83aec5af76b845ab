"""Fuzz target: hostile rows in a SQLite meta store, read back by the store and the ``meta`` CLI.

Input: a real SQLite meta store whose rows were written by the store itself (an initial batch,
a planned and committed batch of three channels, their end checkpoints, the namespace's info),
then one or two rows changed as another writer, a restore or a bug could leave them: their
JSON mutated byte by byte, a field replaced (a non-finite or huge time, a deeply nested value,
a token nested deep in base64, a huge string, another type), a cell of another SQLite type, a
manifest of many channels.

Property: ``get_batch`` / ``get_end_checkpoints`` / ``get_namespace_info`` give a record or the
product's ``CorruptMetaRecordError`` (``UnknownBatchError`` for a batch whose row is gone);
``InspectedStore`` never raises on a corrupt row; ``meta batches``, ``meta show`` and
``progress`` end with exit code 0, or 2 and one ``error:`` line that is not "unexpected" (a
bug), and stderr holds no traceback.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from meta_store import BatchState, ChannelStart, EndCheckpoint, Manifest, open_meta_store
from meta_store.errors import CorruptMetaRecordError, UnknownBatchError
from tablestore_cdc.commands.app import app
from tablestore_cdc.feed.reading import InspectedStore
from testkit.fuzzing import fuzz_settings, mostly, mutated

pytestmark = pytest.mark.fuzz

NS = "local:/nowhere/store.db#t#n"
CHANNELS = ("ch-a", "ch-b", "ch-c")

#: values a field may be replaced with: JSON text, spliced in as it is
HOSTILE_VALUES = st.one_of(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", '"NaN"', '"inf"', "-1e400",
                     "null", "true", '""', "[]", "{}", "-1", "0", "9" * 5_000,
                     '"' + "x" * 200_000 + '"', json.dumps("t\ud800", ensure_ascii=True)]),
    st.builds(lambda opening, closing, n: opening * n + closing * n,
              st.sampled_from(["[", '{"a":']), st.sampled_from(["]", "}"]),
              st.sampled_from([10, 300, 5_000])).map(lambda s: s.replace('{"a":}', '{"a":1}')),
    st.builds(lambda raw: json.dumps(base64.b64encode(raw).decode()),
              st.sampled_from([b"[" * 5_000, b'{"t":' * 3_000, b'{"t":"t","c":"ch-a","s":1}'])),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: json.dumps(f) if f == f and abs(f) != float("inf") else "NaN"),
    st.text(max_size=8).map(lambda s: json.dumps(s)),
)
#: (table, column, key column value) of the rows a mutation may change
ROWS = [("cdc_batches", "record", "b1"), ("cdc_batches", "manifest", "b1"),
        ("cdc_batches", "record", "b0"), ("cdc_end_checkpoints", "record", "b1"),
        ("cdc_namespaces", "info", NS)]
FIELDS = {"record": ["uuid", "prev_uuid", "state", "created_at", "committed_at", "pushed_at",
                     "max_rows", "spark_batch_id", "channel_id", "token", "start_token",
                     "sequence_number", "records", "written_at", "attempt"],
          "manifest": ["planned_at", "channels", "children_added", "available_now_us"],
          "info": ["endpoint", "table", "tunnel", "tunnel_id"]}


def build(path: Path) -> str:
    """The meta store every example starts from (copied per example)."""
    uri = f"sqlite://{path}"
    with open_meta_store(uri) as meta:
        meta.set_namespace_info(NS, {"endpoint": "local:/nowhere/store.db", "table": "t",
                                     "tunnel": "n", "tunnel_id": "tid"})
        starts = tuple(ChannelStart(channel_id=ch, token=f"{ch}@0", sequence_number=0,
                                    max_records=100, parent_ids=("p",) if i else ())
                       for i, ch in enumerate(CHANNELS))
        meta.create_batch(NS, "b0", None, state=BatchState.PUSHED,
                          manifest=Manifest(channels=starts, planned_at=time.time()))
        meta.create_batch(NS, "b1", "b0")
        meta.put_manifest(NS, "b1", "b0", Manifest(channels=starts, children_added=("ch-c",),
                                                   planned_at=time.time()))
        for ch in CHANNELS:
            meta.put_end_checkpoint(NS, "b1", EndCheckpoint(
                channel_id=ch, start_token=f"{ch}@0", token=f"{ch}@5", sequence_number=5,
                records=5, attempt="host/1/task", written_at=time.time()))
        meta.mark_committed(NS, "b1", spark_batch_id=0)
    return uri


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[bytes]:
    """The bytes of the built store (WAL checkpointed into the main file)."""
    path = tmp_path_factory.mktemp("fuzz-meta") / "meta.db"
    build(path)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    yield path.read_bytes()


def _replace_field(text: str, field: str, value: str) -> str:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # an earlier change of this example nested it
        return text
    if not isinstance(doc, dict):
        return text
    return json.dumps({**doc, field: "@@"}).replace('"@@"', value)


#: cells of another SQLite type than the layout's
OTHER_TYPES = [None, 7, 1.5, b"\xff\xfe", b"{}"]
KEY_COLUMN = {"cdc_batches": "uuid", "cdc_end_checkpoints": "uuid", "cdc_namespaces": "ns"}


def _apply(path: Path, data: st.DataObject) -> None:
    """Change one or two rows of the store at ``path`` as drawn from ``data``."""
    with sqlite3.connect(path) as conn:
        for _ in range(data.draw(st.integers(1, 2))):
            table, column, key = data.draw(st.sampled_from(ROWS))
            rows = conn.execute(f"SELECT rowid, {column} FROM {table} WHERE "
                                f"{KEY_COLUMN[table]} = ? ORDER BY rowid", (key,)).fetchall()
            rowid, text = rows[data.draw(st.integers(0, len(rows) - 1))]
            how = data.draw(st.sampled_from(["field", "field", "bytes", "type",
                                             "many-channels"]))
            event(f"meta row: {table}.{column} {how}")
            if how == "field" and isinstance(text, str):
                cell: Any = _replace_field(text, data.draw(st.sampled_from(FIELDS[column])),
                                           data.draw(HOSTILE_VALUES))
            elif how == "bytes" and isinstance(text, str):
                cell = data.draw(mostly(mutated(text.encode()), st.binary(max_size=64)))
            elif how == "many-channels":
                cell = json.dumps({"channels": [
                    {"channel_id": f"c{i:05d}", "token": "x" * 50, "sequence_number": 0,
                     "max_records": 1} for i in range(2_000)], "planned_at": 1.0})
            else:
                cell = data.draw(st.sampled_from(OTHER_TYPES))
            if cell is None and column != "manifest":
                cell = "null"  # NOT NULL columns
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (cell, rowid))
    conn.close()


def _reads(uri: str) -> None:
    with open_meta_store(uri, create=False) as meta:
        for call in (lambda: meta.get_batch(NS, "b1"), lambda: meta.get_batch(NS, "b0"),
                     lambda: meta.get_end_checkpoints(NS, "b1"),
                     lambda: meta.get_namespace_info(NS), lambda: meta.list_batches(NS)):
            try:
                call()
                event("meta read: a record")
            except CorruptMetaRecordError as exc:
                str(exc).encode("utf-8")
                event("meta read: CorruptMetaRecordError")
            except UnknownBatchError:
                event("meta read: UnknownBatchError")
        inspected = InspectedStore(meta)
        inspected.list_namespaces()
        inspected.list_batches(NS)
        inspected.get_end_checkpoints(NS, "b1")
        inspected.get_namespace_info(NS)
        if inspected.corrupt:
            event("inspection: corrupt rows named")


def _commands(uri: str) -> None:
    for command in (["meta", "batches"], ["meta", "batches", "--json"], ["meta", "show", "b1"],
                    ["meta", "show", "b1", "--json"], ["progress"]):
        result = CliRunner().invoke(app, [*command, "--meta", uri])
        assert result.exit_code in (0, 2), (command, result.output, result.exception)
        assert "Traceback" not in result.output
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == (result.exit_code == 2), (command, result.stderr)
        assert not any(line.startswith("error: unexpected ") for line in errors), (command, errors)
        event(f"{' '.join(command[:2])}: exit {result.exit_code}")


def _damaged(pristine: bytes, tmp_path_factory: pytest.TempPathFactory,
             data: st.DataObject) -> str:
    path = tmp_path_factory.mktemp("example") / "meta.db"
    path.write_bytes(pristine)
    _apply(path, data)
    return f"sqlite://{path}"


@given(data=st.data())
@fuzz_settings()
def test_hostile_meta_rows_read_as_records_or_corrupt_row_errors(
        pristine: bytes, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    _reads(_damaged(pristine, tmp_path_factory, data))


@given(data=st.data())
@fuzz_settings(default=50)
def test_hostile_meta_rows_in_the_inspection_commands_are_one_line_at_most(
        pristine: bytes, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """The commands open the store and render: fewer inputs (each runs five commands)."""
    _commands(_damaged(pristine, tmp_path_factory, data))
