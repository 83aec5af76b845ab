"""The stored format of the DynamoDB and Tablestore meta stores, pinned by golden rows.

``tests/data/meta_kv_layout/{dynamodb,tablestore}.json`` hold the raw items / rows that
``scenario`` wrote through each backend (``rows``), and what that code read back from them
(``decoded``). They were written before the two backends' shared layout moved into
``meta_store/kv_layout.py`` (the commit is in each file). Each backend must still:

- read those rows to the same records: tables written by earlier releases stay readable;
- write exactly those rows when it runs ``scenario`` again: earlier releases, and processes of
  mixed versions sharing one table, read what this one writes.

DynamoDB runs on a moto server (``testkit/aws.py``), Tablestore on the project's
emulator; raw rows are read and planted with boto3 and the Tablestore SDK, bypassing the store.

The files are data, not expectations to refresh when a test fails: a different stored format
needs a way for existing tables first. ``python -m tests.test_meta_kv_layout`` rewrites them
(after a deliberate, documented change of the layout).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import uuid as uuidlib
from pathlib import Path
from typing import Any

import boto3

from meta_store import open_meta_store
from meta_store.base import FINISHED, BatchRecord, BatchState, EndCheckpoint, MetaStore
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from tests.contract.meta_contract import make_end, make_manifest

GOLDEN = Path(__file__).parent / "data" / "meta_kv_layout"
REGION = "us-east-1"
NS = "ep=golden;table=orders;tunnel=t1"
OTHER_NS = "ep=golden;table=items;tunnel=t2"
INFO = {"endpoint": "http://127.0.0.1:1", "table": "orders", "tunnel": "t1",
        "tunnel_id": "tid-1", "committed_generation": "2"}
#: channels of the large manifest: over each backend's compression threshold (300 KB of JSON
#: on DynamoDB, 2 MB on Tablestore) while compressing to a few KB
LARGE_CHANNELS = {"dynamodb": 150, "tablestore": 1000}


def scenario(store: MetaStore, large_channels: int) -> None:
    """Every kind of row, in every state, with fixed times (some whole numbers: they are
    stored as given on DynamoDB)."""
    store.set_namespace_info(NS, INFO)
    store.set_namespace_info(OTHER_NS, {"table": "items"})
    store.create_batch(NS, "b0", None, now=1000)  # pushed, with two ends, one finished
    store.put_manifest(NS, "b0", None, make_manifest(2, tag="b0"))
    store.create_batch(NS, "b1", "b0", max_rows=500, now=1001.25)  # committed, compressed
    store.put_manifest(NS, "b1", "b0",
                       make_manifest(large_channels, tag="large", token_len=2100))
    store.mark_committed(NS, "b1", spark_batch_id=7, now=1002)
    store.mark_pushed(NS, ["b0"], now=1003.5)
    store.create_batch(NS, "b2", None, state=BatchState.PLANNED,  # as initialOffset writes it
                       manifest=make_manifest(1, tag="b2"), now=1004.0)
    store.create_batch(NS, "b3", "b1", now=1005.75)  # minted, never planned
    store.put_end_checkpoint(NS, "b0", make_end("ch-00000"))
    store.put_end_checkpoint(NS, "b0", make_end("ch-00001", token=FINISHED, seq=12, records=3))
    store.put_end_checkpoint(NS, "b1", EndCheckpoint(
        channel_id="ch-00000", start_token="tok-9", token="tok-10", sequence_number=10,
        records=1, attempt="host/2/task-1", written_at=1002.5, last_sequence="10:0"))
    store.committed_not_pushed(NS)  # DynamoDB: marks its committed-not-pushed index seeded


def _batch_summary(batch: BatchRecord) -> dict[str, Any]:
    """The record as JSON, its manifest (up to 2 MB) as a digest and a channel count."""
    out = batch.model_dump(mode="json", exclude={"manifest"})
    if batch.manifest is not None:
        out["manifest_sha256"] = hashlib.sha256(
            batch.manifest.model_dump_json().encode()).hexdigest()
        out["manifest_channels"] = len(batch.manifest.channels)
    return out


def read_back(store: MetaStore) -> dict[str, Any]:
    """What the store reads from the rows, through every read path."""
    batches = store.list_batches(NS)
    finished = store.get_end_checkpoint(NS, "b0", "ch-00001")
    assert finished is not None
    return {
        "namespaces": store.list_namespaces(),
        "info": {ns: store.get_namespace_info(ns) for ns in (NS, OTHER_NS)},
        "batches": [_batch_summary(b) for b in batches],
        "get_batch": [_batch_summary(store.get_batch(NS, b.uuid)) for b in batches],
        "committed_not_pushed": [b.uuid for b in store.committed_not_pushed(NS)],
        "ends": {u: {c: e.model_dump(mode="json")
                     for c, e in sorted(store.get_end_checkpoints(NS, u).items())}
                 for u in ("b0", "b1", "b2")},
        "get_end": finished.model_dump(mode="json"),
    }


# --- DynamoDB: raw items ---------------------------------------------------------------------


def dynamo_client(endpoint: str) -> Any:
    return boto3.client("dynamodb", region_name=REGION, endpoint_url=endpoint)


def dynamo_uri(endpoint: str, table: str) -> str:
    return f"dynamodb://{table}?region={REGION}&endpoint_url={endpoint}&create_table=true"


def dump_dynamo(endpoint: str, table: str) -> list[dict[str, Any]]:
    """Every item of ``table`` in DynamoDB's JSON (binary as base64, sets sorted)."""
    def attribute(value: dict[str, Any]) -> dict[str, Any]:
        ((kind, v),) = value.items()
        if kind == "B":
            return {"B": base64.b64encode(v).decode()}
        return {kind: sorted(v) if kind == "SS" else v}

    client, items, kwargs = dynamo_client(endpoint), [], {"TableName": table,
                                                          "ConsistentRead": True}
    while True:
        page = client.scan(**kwargs)
        items += [{k: attribute(v) for k, v in sorted(item.items())} for item in page["Items"]]
        if not page.get("LastEvaluatedKey"):
            return sorted(items, key=lambda i: (i["ns"]["S"], i["sk"]["S"]))
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def plant_dynamo(endpoint: str, table: str, items: list[dict[str, Any]]) -> None:
    client = dynamo_client(endpoint)
    for item in items:
        client.put_item(TableName=table, Item={
            k: {"B": base64.b64decode(v["B"])} if "B" in v else v for k, v in item.items()})


def run_dynamo(endpoint: str) -> dict[str, Any]:
    """Run the scenario on a fresh table: its raw items and what the store reads back."""
    table = f"golden-{uuidlib.uuid4().hex[:12]}"
    with open_meta_store(dynamo_uri(endpoint, table)) as store:
        scenario(store, LARGE_CHANNELS["dynamodb"])
    rows = dump_dynamo(endpoint, table)
    with open_meta_store(dynamo_uri(endpoint, table)) as store:
        return {"rows": rows, "decoded": read_back(store)}


# --- Tablestore: raw rows --------------------------------------------------------------------


def _ots(emulator: Any) -> Any:
    from tablestore import OTSClient
    from tablestore.retry import NoRetryPolicy

    return OTSClient(emulator.url, KEY_ID, SECRET, INSTANCE, retry_policy=NoRetryPolicy())


def tablestore_uri(emulator: Any, table: str) -> str:
    return f"tablestore://{INSTANCE}/{table}?endpoint={emulator.url}&create_table=true"


def _typed(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return ["BOOLEAN", value]
    if isinstance(value, int):
        return ["INTEGER", value]
    if isinstance(value, float):
        return ["DOUBLE", value]
    if isinstance(value, (bytes, bytearray)):
        return ["BINARY", base64.b64encode(bytes(value)).decode()]
    assert isinstance(value, str), f"unexpected column value {value!r}"
    return ["STRING", value]


def _untyped(kind: str, value: Any) -> Any:
    return bytearray(base64.b64decode(value)) if kind == "BINARY" else value


def dump_tablestore(emulator: Any, table: str) -> list[dict[str, Any]]:
    """Every row of ``table``: primary key, and attribute columns as (name, type, value)
    without their timestamps (write times)."""
    from tablestore import INF_MAX, INF_MIN

    client, rows = _ots(emulator), []
    start: Any = [("ns", INF_MIN), ("sk", INF_MIN)]
    while start is not None:
        _, start, page, _ = client.get_range(table, "FORWARD", start,
                                             [("ns", INF_MAX), ("sk", INF_MAX)], max_version=1)
        rows += [{"pk": [list(k) for k in row.primary_key],
                  "columns": [[name, *_typed(value)] for name, value, *_ in
                              row.attribute_columns]} for row in page]
    return rows


def plant_tablestore(emulator: Any, table: str, rows: list[dict[str, Any]]) -> None:
    from tablestore import Condition, Row, RowExistenceExpectation

    client = _ots(emulator)
    for row in rows:
        client.put_row(table, Row([tuple(k) for k in row["pk"]],
                                  [(name, _untyped(kind, value))
                                   for name, kind, value in row["columns"]]),
                       Condition(RowExistenceExpectation.IGNORE))


def _open_tablestore(emulator: Any, table: str) -> MetaStore:
    return open_meta_store(tablestore_uri(emulator, table),
                           {"access_key_id": KEY_ID, "access_key_secret": SECRET})


def run_tablestore(emulator: Any) -> dict[str, Any]:
    table = f"golden_{uuidlib.uuid4().hex[:12]}"
    with _open_tablestore(emulator, table) as store:
        scenario(store, LARGE_CHANNELS["tablestore"])
    rows = dump_tablestore(emulator, table)
    with _open_tablestore(emulator, table) as store:
        return {"rows": rows, "decoded": read_back(store)}


# --- the tests -------------------------------------------------------------------------------


def golden(backend: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / f"{backend}.json").read_text())
    return data


class TestDynamoDbLayout:
    def test_golden_items_decode_to_the_same_records(self, moto_endpoint: str) -> None:
        expected = golden("dynamodb")
        table = f"golden-{uuidlib.uuid4().hex[:12]}"
        open_meta_store(dynamo_uri(moto_endpoint, table)).close()  # creates the table
        plant_dynamo(moto_endpoint, table, expected["rows"])
        with open_meta_store(dynamo_uri(moto_endpoint, table)) as store:
            assert read_back(store) == expected["decoded"]

    def test_new_writes_are_the_golden_items(self, moto_endpoint: str) -> None:
        expected = golden("dynamodb")
        assert run_dynamo(moto_endpoint) == {"rows": expected["rows"],
                                             "decoded": expected["decoded"]}


class TestTablestoreLayout:
    def test_golden_rows_decode_to_the_same_records(self, ots_emulator: Any) -> None:
        expected = golden("tablestore")
        table = f"golden_{uuidlib.uuid4().hex[:12]}"
        _open_tablestore(ots_emulator, table).close()  # creates the table
        plant_tablestore(ots_emulator, table, expected["rows"])
        with _open_tablestore(ots_emulator, table) as store:
            assert read_back(store) == expected["decoded"]

    def test_new_writes_are_the_golden_rows(self, ots_emulator: Any) -> None:
        expected = golden("tablestore")
        assert run_tablestore(ots_emulator) == {"rows": expected["rows"],
                                                "decoded": expected["decoded"]}


def test_the_two_backends_read_the_same_records() -> None:
    """One layout: the same scenario reads back the same on both (the manifest sizes differ
    on purpose, and only DynamoDB keeps a committed-not-pushed index)."""
    dynamo, tablestore = golden("dynamodb")["decoded"], golden("tablestore")["decoded"]
    for decoded in (dynamo, tablestore):
        for batch in decoded["batches"] + decoded["get_batch"]:
            if batch["uuid"] == "b1":
                batch.pop("manifest_sha256"), batch.pop("manifest_channels")
    assert dynamo == tablestore


def main() -> None:
    """Rewrite the golden files with this checkout's code (see the module docstring)."""
    from tablestore_emulator.server import EmulatorServer
    from testkit.aws import AWS_TEST_ENV, start_moto_server, stop_moto_server

    os.environ.update(AWS_TEST_ENV)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or "unknown"
    proc, endpoint = start_moto_server()
    try:
        results = {"dynamodb": run_dynamo(endpoint)}
    finally:
        stop_moto_server(proc)
    with tempfile.TemporaryDirectory() as tmp, EmulatorServer(
            str(Path(tmp) / "store.db"), INSTANCE, KEY_ID, SECRET) as server:
        results["tablestore"] = run_tablestore(server)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for backend, result in results.items():
        text = json.dumps({"written_by_commit": commit, **result}, indent=1, sort_keys=True)
        (GOLDEN / f"{backend}.json").write_text(text + "\n")
        print(f"wrote {GOLDEN / f'{backend}.json'} ({len(text)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
