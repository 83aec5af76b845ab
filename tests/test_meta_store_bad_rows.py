"""Meta-table rows this product did not write: each is a ``CorruptMetaRecordError``.

A meta table can hold rows written by hand, by another program, or cut short: cells of another
type than the layout's (a NULL or BLOB namespace, a number where JSON text belongs), JSON
nested past any parser's recursion limit, a compressed manifest that inflates to hundreds of
megabytes. Each backend (SQLite on a real file; DynamoDB on a moto server; Tablestore on the
project's emulator) must refuse every such row as corrupt -- naming the row -- without a raw
Python error and without allocating what a compressed cell would inflate to; the inspection
tools skip and name it (``InspectedStore``, the ``meta`` CLI).
"""

from __future__ import annotations

import json
import sqlite3
import struct
import time
import tracemalloc
import uuid as uuidlib
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from meta_store import open_meta_store
from meta_store.base import BatchState, ChannelStart, EndCheckpoint, Manifest, MetaStore
from meta_store.errors import CorruptMetaRecordError, MetaStoreRequestError
from meta_store.kv_layout import MAX_MANIFEST_JSON_BYTES
from tablestore_cdc.commands.app import app
from tablestore_cdc.feed.reading import InspectedStore
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from tests.contract.meta_contract import make_manifest

NS = "local:/data/store.db#orders#t1"
DEEP = "[" * 100_000
DEEP_OBJECT = '{"a":' * 100_000


def _bomb(mib: int = 256) -> bytes:
    """A zlib stream of about 259 KiB that inflates to ``mib`` MiB of zeros, made without
    holding (or compressing) the inflated bytes: after a full flush the encoder's state is
    reset, so each further MiB encodes to the same bytes; the checksum is then set for the
    whole."""
    chunk = bytes(1 << 20)
    packer = zlib.compressobj(9)
    first = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    end = packer.flush()[:-4]  # the final block; its Adler-32 is of two MiB only
    adler = 1
    for _ in range(mib):
        adler = zlib.adler32(chunk, adler)
    return first + again * (mib - 1) + end + struct.pack(">I", adler)


BOMB = _bomb()


def test_the_bomb_is_what_the_issue_describes() -> None:
    assert 250 * 1024 < len(BOMB) < 260 * 1024
    small = _bomb(3)
    assert zlib.decompress(small) == bytes(3 << 20)  # a valid stream, checksum included


def peak_mib(call: Any) -> float:
    """The peak of Python's allocations (MiB) while ``call()`` runs."""
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / (1 << 20)


def corrupt(call: Any) -> CorruptMetaRecordError:
    with pytest.raises(CorruptMetaRecordError) as info:
        call()
    return info.value


# --- SQLite ---------------------------------------------------------------------------------


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[tuple[MetaStore, Path]]:
    path = tmp_path / "meta.db"
    store = open_meta_store(f"sqlite://{path}")
    store.set_namespace_info(NS, {"table": "orders"})
    store.create_batch(NS, "b0", None, now=1000)
    try:
        yield store, path
    finally:
        store.close()


def _sql(path: Path, statement: str, *args: Any) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(statement, args)


@pytest.mark.parametrize("cell", [None, b"ns", b"\xff\xfe"], ids=repr)
def test_a_namespace_cell_that_is_not_text(sqlite_store: tuple[MetaStore, Path],
                                          cell: Any) -> None:
    """A NULL, BLOB or number in ``cdc_namespaces.ns``: the listing raises for the store's
    users; the inspection tools skip and name it, and the ``meta`` CLI warns in one line."""
    store, path = sqlite_store
    _sql(path, "INSERT INTO cdc_namespaces (ns, info) VALUES (?, '{}')", cell)
    error = corrupt(store.list_namespaces)
    assert "namespace cell holds" in str(error) and "not text" in str(error)
    inspected = InspectedStore(store)
    assert inspected.list_namespaces() == [NS]
    assert [r["reason"] for r in inspected.corrupt_records()] == [error.fields["reason"]]
    for command in (["meta", "namespaces"], ["meta", "batches"]):
        result = CliRunner().invoke(app, [*command, "--meta", f"sqlite://{path}"])
        assert result.exit_code == 0, result.output
        assert "warning: meta store" in result.stderr and "not text" in result.stderr
        assert "Traceback" not in result.output


@pytest.mark.parametrize("column, cell, words", [
    ("record", DEEP, "recursion limit"),
    ("record", DEEP_OBJECT, "recursion limit"),
    ("record", 5, "Input should be an object"),  # TEXT affinity: stored as '5'
    ("record", b"\xff{", "Invalid JSON"),
    ("record", b'{"uuid": "b0"}', "Field required"),
    ("manifest", DEEP, "recursion limit"),
    ("manifest", 1.5, "Input should be an object"),
    ("manifest", b"\x00", "Invalid JSON"),
], ids=lambda v: repr(v)[:20])
def test_a_batch_cell_of_another_type_or_too_deep(sqlite_store: tuple[MetaStore, Path],
                                                  column: str, cell: Any, words: str) -> None:
    store, path = sqlite_store
    _sql(path, f"UPDATE cdc_batches SET {column} = ? WHERE uuid = 'b0'", cell)
    error = corrupt(lambda: store.get_batch(NS, "b0"))
    assert error.fields["key"].startswith(f"{NS}/batch/b0") and words in error.fields["reason"]
    assert InspectedStore(store).list_batches(NS) == []


@pytest.mark.parametrize("cell", [DEEP, '{"a": ' + "[" * 5000 + "]" * 5000 + "}", b"\xff",
                                  12, "[]"], ids=lambda v: repr(v)[:20])
def test_a_namespace_info_cell_of_another_type_or_too_deep(
        sqlite_store: tuple[MetaStore, Path], cell: Any) -> None:
    store, path = sqlite_store
    _sql(path, "UPDATE cdc_namespaces SET info = ? WHERE ns = ?", cell, NS)
    assert corrupt(lambda: store.get_namespace_info(NS)).fields["key"] == f"{NS}/info"


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", '"NaN"', '"inf"']


def _json_cell(path: Path, table: str, column: str, where: str, field: str, value: Any) -> None:
    """Set ``field`` of the JSON in ``table.column`` (rows ``where``) to the JSON text
    ``value`` (a number or a bare ``NaN``), as another writer could have stored it."""
    with sqlite3.connect(path) as conn:
        for rowid, text in conn.execute(f"SELECT rowid, {column} FROM {table} WHERE {where}"):
            head = json.dumps({**json.loads(text), field: "@"})
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?",
                         (head.replace('"@"', str(value)), rowid))


@pytest.mark.parametrize("value", NON_FINITE, ids=str)
@pytest.mark.parametrize("column, field", [("manifest", "planned_at"),
                                           ("record", "created_at"),
                                           ("record", "committed_at")])
def test_a_non_finite_time_in_a_batch_row(sqlite_store: tuple[MetaStore, Path], column: str,
                                          field: str, value: Any) -> None:
    """A stored ``NaN`` or infinite time passed validation as a float and broke every command
    that formats it later: now the row is corrupt, the error names the field, and the
    inspection commands skip and name the row."""
    store, path = sqlite_store
    store.put_manifest(NS, "b0", None, make_manifest(2))
    store.mark_committed(NS, "b0", now=1001)
    _json_cell(path, "cdc_batches", column, "uuid = 'b0'", field, value)
    error = corrupt(lambda: store.get_batch(NS, "b0"))
    assert error.fields["key"].startswith(f"{NS}/batch/b0")
    assert error.fields["reason"] == f"{field}: Input should be a finite number"
    assert InspectedStore(store).list_batches(NS) == []
    for command in (["meta", "batches"], ["meta", "batches", "--json"], ["progress"]):
        result = CliRunner().invoke(app, [*command, "--meta", f"sqlite://{path}"])
        assert result.exit_code == 0, result.output
        assert "finite number" in result.stderr and "Traceback" not in result.output
    shown = CliRunner().invoke(app, ["meta", "show", "b0", "--meta", f"sqlite://{path}"])
    assert shown.exit_code == 2 and "unexpected" not in shown.stderr
    assert shown.stderr.startswith("error: ") and "finite number" in shown.stderr


@pytest.mark.parametrize("value", NON_FINITE[:3], ids=str)
def test_a_non_finite_time_in_an_end_checkpoint(sqlite_store: tuple[MetaStore, Path],
                                                value: Any) -> None:
    store, path = sqlite_store
    manifest = make_manifest(1)
    store.put_manifest(NS, "b0", None, manifest)
    channel = manifest.channels[0].channel_id
    store.put_end_checkpoint(NS, "b0", EndCheckpoint(
        channel_id=channel, start_token="t0", token="t1", sequence_number=1, records=1,
        attempt="a", written_at=1002.0))
    _json_cell(path, "cdc_end_checkpoints", "record", "uuid = 'b0'", "written_at", value)
    error = corrupt(lambda: store.get_end_checkpoints(NS, "b0"))
    assert error.fields["reason"] == "written_at: Input should be a finite number"
    assert InspectedStore(store).get_end_checkpoints(NS, "b0") == {}
    result = CliRunner().invoke(app, ["meta", "show", "b0", "--json", "--meta",
                                      f"sqlite://{path}"])
    assert result.exit_code == 0, result.output
    assert "finite number" in result.stderr


def test_a_manifest_past_the_bound_is_corrupt_and_not_parsed(
        sqlite_store: tuple[MetaStore, Path]) -> None:
    """A 30 MB manifest (200,000 channels) another writer left: refused by its length before
    it is parsed, so reading it costs what the cell costs, not a parse of 200,000 channels;
    ``meta show`` ends in one line well within seconds."""
    store, path = sqlite_store
    one = make_manifest(1).model_dump(mode="json")
    channel = one["channels"][0]
    one["channels"] = [dict(channel, channel_id=f"c{i:08d}", token="x" * 100)
                       for i in range(200_000)]
    cell = json.dumps(one)
    assert len(cell) > 30_000_000
    _sql(path, "UPDATE cdc_batches SET manifest = ? WHERE uuid = 'b0'", cell)
    errors: list[CorruptMetaRecordError] = []
    peak = peak_mib(lambda: errors.append(corrupt(lambda: store.get_batch(NS, "b0"))))
    assert f"over the {MAX_MANIFEST_JSON_BYTES} any meta store writes" in errors[0].fields[
        "reason"]
    assert errors[0].fields["key"] == f"{NS}/batch/b0/manifest"
    assert peak < 3 * len(cell) / (1 << 20), f"reading the row allocated {peak:.0f} MiB"
    started = time.monotonic()
    result = CliRunner().invoke(app, ["meta", "show", "b0", "--meta", f"sqlite://{path}"])
    assert time.monotonic() - started < 20
    assert result.exit_code == 2 and result.stderr.startswith("error: ")
    assert "any meta store writes" in result.stderr


def test_a_manifest_over_the_bound_is_refused_when_written_to_sqlite(
        sqlite_store: tuple[MetaStore, Path]) -> None:
    """SQLite keeps the bound its reader enforces, as the key-value backends do."""
    store, _ = sqlite_store
    big = Manifest(channels=tuple(
        ChannelStart(channel_id=f"ch-{i:05d}", token="t" * 20_000, sequence_number=i,
                     max_records=1) for i in range(900)), planned_at=1.0)
    with pytest.raises(MetaStoreRequestError, match="over the 16777216 a meta store reads back"):
        store.put_manifest(NS, "b0", None, big)
    with pytest.raises(MetaStoreRequestError, match="over the 16777216"):
        store.create_batch(NS, "b1", None, state=BatchState.PLANNED, manifest=big)
    assert store.get_batch(NS, "b0").manifest is None


# --- DynamoDB and Tablestore: the key-value layout -------------------------------------------



class KvBackend:
    """One key-value backend: open a fresh table, and overwrite a batch row's cells raw."""

    compressed: str

    def open(self) -> MetaStore:
        raise NotImplementedError

    def overwrite(self, cells: dict[str, Any]) -> None:
        raise NotImplementedError


class Dynamo(KvBackend):
    compressed = "manifest"

    def __init__(self, endpoint: str) -> None:
        self.endpoint, self.table = endpoint, f"bad-{uuidlib.uuid4().hex[:12]}"
        self.client = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint)

    def open(self) -> MetaStore:
        return open_meta_store(f"dynamodb://{self.table}?region=us-east-1&endpoint_url="
                               f"{self.endpoint}&create_table=true")

    def overwrite(self, cells: dict[str, Any]) -> None:
        def typed(v: Any) -> dict[str, Any]:
            if isinstance(v, bytes):
                return {"B": v}
            if isinstance(v, bool):
                return {"BOOL": v}
            return {"N": str(v)} if isinstance(v, int | float) else {"S": v}

        names = {f"#c{i}": k for i, k in enumerate(cells)}
        self.client.update_item(
            TableName=self.table, Key={"ns": {"S": NS}, "sk": {"S": "B#b0"}},
            UpdateExpression="SET " + ", ".join(f"{n} = :v{n[2:]}" for n in names),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues={f":v{i}": typed(v) for i, v in enumerate(cells.values())})


class Tablestore(KvBackend):
    compressed = "manifest_z"

    def __init__(self, emulator: Any) -> None:
        self.emulator, self.table = emulator, f"bad_{uuidlib.uuid4().hex[:12]}"

    def open(self) -> MetaStore:
        return open_meta_store(f"tablestore://{INSTANCE}/{self.table}?endpoint="
                               f"{self.emulator.url}&create_table=true",
                               {"access_key_id": KEY_ID, "access_key_secret": SECRET})

    def overwrite(self, cells: dict[str, Any]) -> None:
        from tablestore import OTSClient, Row
        from tablestore.retry import NoRetryPolicy

        client = OTSClient(self.emulator.url, KEY_ID, SECRET, INSTANCE,
                           retry_policy=NoRetryPolicy())
        client.update_row(self.table, Row([("ns", NS), ("sk", "B#b0")], {"put": [
            (k, bytearray(v) if isinstance(v, bytes) else v) for k, v in cells.items()]}), None)


@pytest.fixture(params=["dynamodb", "tablestore"])
def kv(request: pytest.FixtureRequest) -> Iterator[tuple[KvBackend, MetaStore]]:
    backend: KvBackend
    if request.param == "dynamodb":
        backend = Dynamo(request.getfixturevalue("moto_endpoint"))
    else:
        backend = Tablestore(request.getfixturevalue("ots_emulator"))
    store = backend.open()
    store.set_namespace_info(NS, {"table": "orders"})
    store.create_batch(NS, "b0", None, state=BatchState.PLANNED, manifest=make_manifest(2),
                       now=1000)
    try:
        yield backend, store
    finally:
        store.close()


def test_a_manifest_cell_that_inflates_to_256_mib_is_refused_unallocated(
        kv: tuple[KvBackend, MetaStore]) -> None:
    """A 255 KiB compressed cell inflating to 256 MiB: corrupt, and reading it allocates at
    most the 16 MiB a manifest may have (the CLI peaked at ~2.4 GB before). (On moto, which
    counts a binary value by its Python repr against the 400 KB item limit, 64 MiB from
    66 KiB.)"""
    backend, store = kv
    backend.overwrite({backend.compressed: BOMB if isinstance(backend, Tablestore)
                       else _bomb(64)})
    errors: list[CorruptMetaRecordError] = []
    peak = peak_mib(lambda: errors.append(corrupt(lambda: store.get_batch(NS, "b0"))))
    assert f"inflates past {MAX_MANIFEST_JSON_BYTES} bytes" in errors[0].fields["reason"]
    assert peak < 48, f"reading the row allocated {peak:.0f} MiB"
    assert InspectedStore(store).list_batches(NS) == []


@pytest.mark.parametrize("cells, words", [
    ({"doc": DEEP}, "recursion limit"),
    ({"doc": '{"a":' * 5_000}, "recursion limit"),
    ({"doc": 5}, ""),
    ({"doc": "[1, 2]"}, "Input should be an object"),
    ({"doc": b"\xff\xfe"}, ""),
    ({"manifest": DEEP}, "recursion limit"),
    ({"compressed": zlib.compress(b"[" * 100_000)}, "recursion limit"),
    ({"compressed": zlib.compress(b'{"channels": []}')[:-3]}, "cut short"),
    ({"compressed": zlib.compress(b"{}") + b"tail"}, "after the compressed manifest"),
    ({"compressed": b"not zlib at all"}, ""),
    ({"state": 3}, ""),
    ({"committed_at": "yesterday"}, ""),
    ({"doc": '{"uuid": "b0", "prev_uuid": null, "created_at": NaN}'}, "finite number"),
    ({"manifest": '{"channels": [], "planned_at": Infinity}'}, "planned_at: Input should be"),
], ids=lambda v: repr(v)[:30])
def test_a_batch_row_of_another_shape(kv: tuple[KvBackend, MetaStore], cells: dict[str, Any],
                                      words: str) -> None:
    backend, store = kv
    if "compressed" in cells:
        cells = {backend.compressed: cells["compressed"]}
    backend.overwrite(cells)
    error = corrupt(lambda: store.get_batch(NS, "b0"))
    assert words in error.fields["reason"], error
    assert error.fields["key"].startswith(f"{NS}/B#b0")


def test_a_manifest_over_the_limit_is_refused_when_written(
        kv: tuple[KvBackend, MetaStore]) -> None:
    """The limit the read enforces is the one the write keeps: no manifest this product
    writes is refused when read back."""
    _, store = kv
    big = Manifest(channels=tuple(
        ChannelStart(channel_id=f"ch-{i:05d}", token="t" * 20_000, sequence_number=i,
                     max_records=1) for i in range(900)), planned_at=1.0)
    store.create_batch(NS, "b1", None, now=1001)
    with pytest.raises(MetaStoreRequestError, match="over the 16777216 a meta store reads back"):
        store.put_manifest(NS, "b1", None, big)


def test_a_dynamodb_namespace_key_of_another_type(moto_endpoint: str) -> None:
    """A table with the layout's key names but a binary ``ns`` (not one this product made):
    its namespaces are corrupt records, skipped and named by the inspection tools."""
    table = f"bad-{uuidlib.uuid4().hex[:12]}"
    client = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=moto_endpoint)
    client.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                        AttributeDefinitions=[{"AttributeName": "ns", "AttributeType": "B"},
                                              {"AttributeName": "sk", "AttributeType": "S"}],
                        KeySchema=[{"AttributeName": "ns", "KeyType": "HASH"},
                                   {"AttributeName": "sk", "KeyType": "RANGE"}])
    client.put_item(TableName=table, Item={"ns": {"B": b"\x00ns"}, "sk": {"S": "N#info"},
                                           "info": {"S": "{}"}})
    with open_meta_store(f"dynamodb://{table}?region=us-east-1&endpoint_url="
                         f"{moto_endpoint}") as store:
        assert "namespace cell holds dict" in str(corrupt(store.list_namespaces))
        inspected = InspectedStore(store)
        assert inspected.list_namespaces() == [] and len(inspected.corrupt_records()) == 1
