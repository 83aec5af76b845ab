"""``tablestore-cdc reconcile`` without Spark: real sources (the embedded store, the emulator
read with the official SDK's GetRange, DynamoDB on a moto server), real Delta and Iceberg
targets built by the real apply sink from the source's own change stream
(``testkit.reconcile.apply_stream``), then changed behind the product's back with
``deltalake`` / ``pyiceberg``. The Spark pipeline under a write load, with the in-flight
labels, is tests/test_reconcile_spark.py."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytest.importorskip("polars")

import deltalake  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from connector.local import LocalTablestore  # noqa: E402
from connector.tunnel import ColumnSpec, TableSchema  # noqa: E402
from tablestore_cdc.commands.app import app  # noqa: E402
from tablestore_cdc.lakehouse import open_apply_sink  # noqa: E402
from tablestore_cdc.reconcile import SourceSpec, reconcile_table  # noqa: E402
from tablestore_cdc.reconcile import compare as compare_module  # noqa: E402
from tablestore_cdc.reconcile.layout import CompareLayout  # noqa: E402
from tablestore_cdc.reconcile.target import open_target_table  # noqa: E402
from testkit.reconcile import (  # noqa: E402
    DeltaTarget,
    Target,
    apply_stream,
    found,
)

runner = CliRunner()


def history(store: LocalTablestore, keys: int = 300, changes: int = 900, seed: int = 5,
            split: bool = True) -> None:
    """Puts, updates (a column removed now and then) and deletes over ``keys`` keys of table
    ``t``, with a channel split and a merge of its children on the way."""
    rng = random.Random(seed)
    for i in range(changes):
        if split and i == changes // 3:
            store.split_channel("t", [c for c in store.list_channels("t") if not c.closed][0]
                                .channel_id)
        if split and i == 2 * changes // 3:
            children = sorted((c for c in store.list_channels("t") if not c.closed
                               and c.parent_ids), key=lambda c: c.range_lo)
            store.merge_channels("t", children[0].channel_id, children[1].channel_id)
        key = {"id": rng.randrange(keys)}
        roll = rng.random()
        if roll < 0.15:
            store.delete_row("t", key)
        elif roll < 0.5:
            store.update_row("t", key, {"qty": i} if i % 3 else {"qty": i, "name": None})
        else:
            store.put_row("t", key, {"name": f"n{i}", "qty": i, "price": i / 4,
                                     "paid": i % 2 == 0, "blob": bytes([i % 256, 1])})


def make_store(path: Path, **kwargs: Any) -> LocalTablestore:
    store = LocalTablestore(path)
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER"), ("price", "DOUBLE"),
                                ("paid", "BOOLEAN"), ("blob", "BINARY")], channels=2)
    history(store, **kwargs)
    return store


#: the shared ``target`` fixture gives testkit.reconcile's targets (testkit/fixtures.py)
pytestmark = pytest.mark.reconcile_target


def six_changes(target: Target) -> tuple[list[int], list[int], int]:
    """Three rows deleted, two changed, one added, behind the product's back."""
    keys = target.live_keys()
    picked = random.Random(11).sample(keys, 5)
    deleted, changed, added = picked[:3], picked[3:], max(keys) + 1000
    target.tamper(deleted, changed, added)
    return deleted, changed, added


# --- the embedded store -------------------------------------------------------------------------


def test_an_equal_pair_reads_each_side_once(tmp_path: Path, target: Target) -> None:
    store = make_store(tmp_path / "store.db")
    uri = f"local://{store.path}"
    apply_stream(uri, "t", open_apply_sink(target.uri))
    report = reconcile_table(SourceSpec(uri, "t"), target.uri)
    assert report.ok and report.comparison.differences == []
    assert report.comparison.source_rows == report.comparison.target_rows == store.count_rows("t")
    assert report.comparison.unequal_buckets == 0 and report.comparison.drill_rows == 0
    assert report.in_flight is None  # nothing to label
    assert set(report.columns) == {"name", "qty", "price", "paid", "blob"}


def test_three_deleted_two_changed_one_added_are_exactly_the_differences(
        tmp_path: Path, target: Target) -> None:
    store = make_store(tmp_path / "store.db")
    uri = f"local://{store.path}"
    apply_stream(uri, "t", open_apply_sink(target.uri))
    deleted, changed, added = six_changes(target)
    report = reconcile_table(SourceSpec(uri, "t"), target.uri)
    assert found(report) == {"MISSING": set(deleted), "EXTRA": {added},
                             "DIFFERENT": set(changed), "IN-FLIGHT": set()}
    assert not report.ok
    by_key = {d.key[0]: d for d in report.comparison.differences}
    assert by_key[changed[0]].columns == ["qty"] and by_key[changed[0]].target["qty"] == -1
    assert by_key[changed[1]].columns == ["name"]
    assert by_key[added].target == {"name": "added by hand", "qty": 7}
    assert by_key[deleted[0]].source == {k: v for k, v in store.get_row("t", {
        "id": deleted[0]}).items()}
    # the stream never ran here: no meta table, so nothing can be in flight, and it says so
    assert report.in_flight is not None and not report.in_flight.determined
    assert "has not run" in report.in_flight.note


def test_the_rows_read_hold_the_newest_batch_named_even_one_committed_after_the_open(
        tmp_path: Path, target: Target) -> None:
    """The target is opened, then the apply query commits another batch, then reconcile asks
    how far the stream applied it: the rows it reads next must hold the batch it was told of.
    (``DeltaTable.history`` reads past the version the object holds; a pinned read that
    lacked the newest batch made differences the stream had applied look not in flight.)"""
    store = make_store(tmp_path / "store.db", split=False)
    uri = f"local://{store.path}"
    apply_stream(uri, "t", open_apply_sink(target.uri), app_id="first-query")
    opened = open_target_table(target.uri)
    key = target.live_keys()[0]
    store.update_row("t", {"id": key}, {"qty": -777})
    apply_stream(uri, "t", open_apply_sink(target.uri, adopt_target=True), app_id="second-query")

    applied = opened.applied()
    assert applied is not None
    rows = pa.Table.from_batches(list(opened.batches(["id", "qty"], 1000)))
    qty = {r["id"]: r["qty"] for r in rows.to_pylist()}[key]
    # whichever batch it names (Delta: the newest; Iceberg: the opened snapshot's), the rows
    # read agree with it
    assert (applied.app_id == "second-query") == (qty == -777), (applied, qty)


def test_the_command_prints_the_differences_and_exits_1(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store.db")
    delta = DeltaTarget(tmp_path)
    apply_stream(f"local://{store.path}", "t", open_apply_sink(delta.uri))
    deleted, changed, added = six_changes(delta)
    args = ["reconcile", "--store", str(store.path), "--table", "t", "--target", delta.uri]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "DIFFERS: 3 missing, 1 extra, 2 different; 0 in flight" in result.output
    assert f"MISSING    id={deleted[0]}" in result.output or \
        f"MISSING    id={min(deleted)}" in result.output
    result = runner.invoke(app, [*args, "--json", "--limit", "2"])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    (table,) = document["tables"]
    assert document["ok"] is False
    assert table["differences"] == {"MISSING": 3, "EXTRA": 1, "DIFFERENT": 2, "IN-FLIGHT": 0}
    assert len(table["listed"]) == 2 and table["listed"][0]["key"] == {"id": min(changed)}
    assert table["listed"][0]["kind"] == "DIFFERENT"


def test_the_command_exits_0_on_an_equal_pair_and_2_on_a_bad_flag(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store.db", changes=200)
    delta = DeltaTarget(tmp_path)
    apply_stream(f"local://{store.path}", "t", open_apply_sink(delta.uri))
    result = runner.invoke(app, ["reconcile", "--store", str(store.path), "--table", "t",
                                 "--target", delta.uri])
    assert result.exit_code == 0, result.output
    assert "EQUAL: 0 missing, 0 extra, 0 different" in result.output
    for args, message in [
        (["--table", "t", "--target", delta.uri], "give exactly one of --store or --endpoint"),
        (["--store", str(tmp_path / "nope.db"), "--table", "t", "--target", delta.uri],
         "does not exist"),
        # no job recorded t's target in the meta table (tests/test_job_targets.py: one did)
        (["--store", str(store.path), "--table", "t"], "no replicate job has recorded its "
         "target in the meta store"),
        (["--store", str(store.path), "--table", "t", "--table", "u", "--target", delta.uri],
         "{table}"),
        (["--store", str(store.path), "--table", "t", "--target", f"delta://{tmp_path}/none"],
         "no table there yet"),
        (["--store", str(store.path), "--table", "t", "--target", "parquet:///x"],
         "unknown scheme"),
        (["--store", str(store.path), "--table", "nope", "--target", delta.uri], "nope"),
        (["--store", str(store.path), "--table", "t", "--target", delta.uri,
          "--option", "maxOffsetsPerChanel=5"], "did you mean"),
    ]:
        result = runner.invoke(app, ["reconcile", *args])
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, result.output
        assert "Traceback" not in result.output


def test_scd2_compares_the_open_versions_and_soft_deleted_rows_count_as_deleted(
        tmp_path: Path) -> None:
    store = make_store(tmp_path / "store.db")
    uri = f"local://{store.path}"
    scd2 = f"delta://{tmp_path}/scd2"
    soft = f"iceberg://{tmp_path}/wh?table=cdc.soft"
    apply_stream(uri, "t", open_apply_sink(scd2, scd=2))
    apply_stream(uri, "t", open_apply_sink(soft, soft_delete_column="_deleted"))
    report = reconcile_table(SourceSpec(uri, "t"), scd2)
    assert report.scd == 2 and report.ok and not report.comparison.differences
    assert report.comparison.target_rows == store.count_rows("t")
    report = reconcile_table(SourceSpec(uri, "t"), soft, soft_delete_column="_deleted")
    assert report.ok and not report.comparison.differences
    # without the flag the deleted rows the target keeps are extra
    report = reconcile_table(SourceSpec(uri, "t"), soft)
    extra = found(report)["EXTRA"]
    assert extra and all(store.get_row("t", {"id": k}) is None for k in extra)


def test_a_key_the_target_holds_twice_is_extra(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store.db", changes=200)
    delta = DeltaTarget(tmp_path)
    apply_stream(f"local://{store.path}", "t", open_apply_sink(delta.uri))
    doubled = delta.live_keys()[0]
    copy = deltalake.DeltaTable(delta.path).to_pyarrow_table(filters=[("id", "=", doubled)])
    deltalake.write_deltalake(delta.path, copy, mode="append")
    report = reconcile_table(SourceSpec(f"local://{store.path}", "t"), delta.uri)
    (difference,) = report.comparison.differences
    assert (difference.kind, difference.key) == ("EXTRA", (doubled,))
    assert "holds 2 rows" in difference.note


def test_many_unequal_buckets_are_drilled_in_rounds(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A target far from its source: pass 2 holds a bounded number of rows at a time."""
    store = make_store(tmp_path / "store.db", keys=2000, changes=3000, split=False)
    delta = DeltaTarget(tmp_path)
    apply_stream(f"local://{store.path}", "t", open_apply_sink(delta.uri))
    deltalake.DeltaTable(delta.path).update(predicate="id % 2 = 0", updates={"qty": "0"})
    monkeypatch.setattr(compare_module, "BUCKETS", 1 << 8)
    monkeypatch.setattr(compare_module, "ROUND_ROWS", 100)
    report = reconcile_table(SourceSpec(f"local://{store.path}", "t"), delta.uri,
                             in_flight=False)
    expected = {pk["id"] for pk, attrs in store.scan("t") if pk["id"] % 2 == 0
                and attrs.get("qty") != 0}
    assert found(report)["DIFFERENT"] == expected and len(expected) > 300
    assert report.comparison.unequal_buckets > 100
    assert report.comparison.rounds > 10  # about 100 rows of unequal buckets per round
    # only the rows of unequal buckets are compared by key
    assert 2 * len(expected) < report.comparison.drill_rows < 2 * store.count_rows("t")


# --- what "equal" means (tablestore_cdc/reconcile/layout.py) -----------------------------------


SCHEMA = TableSchema("t", (ColumnSpec("id", "INTEGER"),),
                     (ColumnSpec("d", "DOUBLE"), ColumnSpec("s", "STRING")))


def compare_rows(source: dict[str, Any], target: dict[str, Any],
                 target_schema: pa.Schema) -> list[str]:
    """The attributes that differ between one source row and one target row (id 1), through
    the layout and the row hashes."""
    layout = CompareLayout.build(SCHEMA, target_schema)
    s = pa.Table.from_batches([layout.from_source([({"id": 1}, source)])])
    t = pa.Table.from_batches([layout.from_target(pa.RecordBatch.from_pylist(
        [{"id": 1, **target}],
        schema=pa.schema([target_schema.field(n) for n in layout.target_columns])))])
    with_hash = []
    for side in (s, t):
        _, row_hash = compare_module.hashes(side.to_batches()[0], layout)
        with_hash.append(side.append_column(compare_module.HASH, pa.array(row_hash)))
    differences = compare_module.classify(*with_hash, layout)
    return differences[0].columns if differences else []


def target_schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field("id", pa.int64(), False), *fields])


@pytest.mark.parametrize(("source", "target", "schema", "differ"), [
    # an integer in a floating-point column is the same number (the apply stores it so)
    ({"d": 5}, {"d": 5.0}, target_schema(("d", pa.float64())), []),
    ({"d": 5.5}, {"d": 5.0}, target_schema(("d", pa.float64())), ["d"]),
    # a column only one side has: equal when null or absent on the other
    ({"s": "x"}, {"s": "x", "note": None}, target_schema(("s", pa.string()),
                                                         ("note", pa.string())), []),
    ({"s": "x"}, {"s": "x", "note": "y"}, target_schema(("s", pa.string()),
                                                        ("note", pa.string())), ["note"]),
    ({"s": "x", "gone": 1}, {"s": "x"}, target_schema(("s", pa.string())), ["gone"]),
    # a value that does not fit the target's column type never equals it
    ({"n": "5"}, {"n": 5}, target_schema(("n", pa.int64())), ["n"]),
    ({"n": True}, {"n": 1}, target_schema(("n", pa.int64())), ["n"]),
    ({"b": "ab"}, {"b": b"ab"}, target_schema(("b", pa.binary())), ["b"]),
    ({"n": 2.0}, {"n": 2}, target_schema(("n", pa.int64())), ["n"]),
    # undeclared attributes kept in the target's _extra JSON (schema_drift=keep)
    ({"u": 1, "w": b"\x00\xff"}, {"_extra": '{"u":1,"w":{"$binary":"AP8="}}'},
     target_schema(("_extra", pa.string())), []),
    ({"u": 1}, {"_extra": '{"u":1.0}'}, target_schema(("_extra", pa.string())), ["u"]),
    ({"u": 1}, {"_extra": '{"u":2}'}, target_schema(("_extra", pa.string())), ["u"]),
    # an _extra attribute that has a column on this pair compares with the column
    ({"s": "x"}, {"_extra": '{"s":"x"}'}, target_schema(("s", pa.string()),
                                                        ("_extra", pa.string())), []),
    # a NaN equals a NaN; the key column's integer width does not matter
    ({"d": float("nan")}, {"d": float("nan")}, target_schema(("d", pa.float64())), []),
    ({"d": 1.0}, {"d": 1.0}, pa.schema([pa.field("id", pa.int32()), ("d", pa.float32())]), []),
])
def test_value_rules(source: dict[str, Any], target: dict[str, Any], schema: pa.Schema,
                     differ: list[str]) -> None:
    assert compare_rows(source, target, schema) == differ


# --- over the emulator (GetRange with the official SDK) -------------------------------------------

INSTANCE, KEY_ID, SECRET = "rec", "rec-key", "rec-secret-never-shown"


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("tablestore")
    from tablestore_emulator.server import EmulatorServer

    store = make_store(tmp_path / "wire.db", changes=700)
    store.close()
    with EmulatorServer(str(tmp_path / "wire.db"), INSTANCE, KEY_ID, SECRET) as server:
        yield server


def test_over_the_emulator_the_six_differences_are_found(emulator: Any, tmp_path: Path,
                                                         target: Target) -> None:
    from tablestore import OTSClient, Row

    from tablestore_cdc.demo.writer import _SdkRows

    writes = _SdkRows(emulator)  # more changes through the official SDK
    for i in range(20):
        writes.put_row("t", {"id": 1000 + i}, {"name": f"sdk{i}", "qty": i})
    writes.delete_row("t", {"id": 1000})
    client = OTSClient(emulator.url, KEY_ID, SECRET, INSTANCE)
    client.update_row("t", Row([("id", 1001)], {"PUT": [("price", 0.5)]}), None)
    endpoint = f"{emulator.url}?instance={INSTANCE}"
    options = {"access.key.id": KEY_ID, "access.key.secret": SECRET,
               "meta.store": f"sqlite://{tmp_path}/meta.db"}
    wire = (f"{emulator.url}?instance={INSTANCE}&access_key_id={KEY_ID}"
            f"&access_key_secret={SECRET}")
    apply_stream(wire, "t", open_apply_sink(target.uri), batch_records=150)
    spec = SourceSpec(endpoint, "t", options=options)
    assert reconcile_table(spec, target.uri).comparison.differences == []
    deleted, changed, added = six_changes(target)
    report = reconcile_table(spec, target.uri)
    assert found(report) == {"MISSING": set(deleted), "EXTRA": {added},
                             "DIFFERENT": set(changed), "IN-FLIGHT": set()}
    assert report.source.startswith(emulator.url)


# --- DynamoDB (Scan on a moto server) -------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    pytest.importorskip("moto")
    from testkit.aws import threaded_moto_server

    with threaded_moto_server() as url:
        yield url


def test_a_dynamodb_source_is_scanned_and_its_six_differences_found(
        moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    from testkit.aws import AWS_TEST_ENV

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(name, AWS_TEST_ENV[name])
    ddb = boto3.client("dynamodb", endpoint_url=moto_url, region_name="us-east-1")
    ddb.create_table(TableName="orders", BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                     StreamSpecification={"StreamEnabled": True,
                                          "StreamViewType": "NEW_AND_OLD_IMAGES"})
    rng = random.Random(2)
    for i in range(400):
        key = {"id": {"S": f"k{rng.randrange(120):03d}"}}
        if rng.random() < 0.15:
            ddb.delete_item(TableName="orders", Key=key)
        else:
            ddb.put_item(TableName="orders", Item={**key, "qty": {"N": str(i)},
                                                  "note": {"S": f"n{i}"},
                                                  "tags": {"SS": ["a", f"t{i % 3}"]}})
    endpoint = (f"dynamodb-streams://?checkpoint_table=cdc-rec&region=us-east-1"
                f"&endpoint_url={moto_url}&create_table=true")
    delta = f"delta://{tmp_path}/orders"
    apply_stream(endpoint, "orders", open_apply_sink(delta, schema_drift="keep"))
    spec = SourceSpec(endpoint, "orders", options={"meta.store": f"sqlite://{tmp_path}/meta.db"})
    assert reconcile_table(spec, delta).comparison.differences == []
    table = deltalake.DeltaTable(f"{tmp_path}/orders")
    keys = sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist())
    deleted, changed, added = keys[:3], keys[3:5], "zzz-added"
    table.delete(f"id IN ({', '.join(repr(k) for k in deleted)})")
    extra = json.dumps({"note": "by hand", "qty": 1.0})
    deltalake.DeltaTable(f"{tmp_path}/orders").update(
        predicate=f"id IN ({', '.join(repr(k) for k in changed)})",
        updates={"_extra": repr(extra)})
    deltalake.write_deltalake(f"{tmp_path}/orders", pa.table({
        "id": pa.array([added]), "_extra": pa.array([extra])}), mode="append")
    report = reconcile_table(spec, delta)
    assert found(report) == {"MISSING": set(deleted), "EXTRA": {added},
                             "DIFFERENT": set(changed), "IN-FLIGHT": set()}
    difference = next(d for d in report.comparison.differences if d.kind == "DIFFERENT")
    assert set(difference.columns) == {"note", "qty", "tags"}


# --- docs/reconcile.md ----------------------------------------------------------------------------


def test_the_reconcile_doc_snippet_runs_as_written(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """docs/reconcile.md's Python snippet, with ``/data`` a temporary directory holding the
    README's ``orders`` table and its copy as ``replicate --output /data/out`` makes it."""
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "reconcile.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    with LocalTablestore(tmp_path / "shop.db") as store:
        store.create_table("orders", primary_key=[("order_id", "INTEGER")],
                           columns=[("customer", "STRING"), ("amount", "DOUBLE")])
        for i in range(50):
            store.put_row("orders", {"order_id": i}, {"customer": f"c{i % 7}", "amount": i / 2})
        store.delete_row("orders", {"order_id": 3})
    apply_stream(f"local://{tmp_path}/shop.db", "orders",
                 open_apply_sink(f"delta://{tmp_path}/out/orders"))
    exec(compile(block.replace("/data", str(tmp_path)), "docs/reconcile.md", "exec"), {})
    assert capsys.readouterr().out == ("True {'MISSING': 0, 'EXTRA': 0, 'DIFFERENT': 0, "
                                       "'IN-FLIGHT': 0}\n")
