"""A multi-table query without Spark (connector.multiplex, tablestore_cdc.pipeline.multi_table):
the selection's globs, the options, the composite offset over a real store file (tables
joining, a dropped one frozen), the generic rows typed back, the command's flags."""

from __future__ import annotations

import base64
import json
import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from connector import generic_rows
from connector.errors import OptionError
from connector.local import LocalTablestore
from connector.multiplex import MultiTableStreamReader
from connector.schema import output_schema
from connector.spark_compat import arrow_schema
from connector.table_selection import MultiTableOptions, TableSelection
from connector.table_state import State, TableState
from connector.tunnel.base import ColumnSpec, TableSchema
from tablestore_cdc.commands.app import app
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.table_config import TableConfigError, load_table_config


def test_the_selection_keeps_names_matching_an_include_glob_and_no_exclude_glob() -> None:
    selection = TableSelection.parse("orders_*, users", "orders_tmp*,orders_old")
    names = ["orders_eu", "orders_old", "orders_tmp1", "users", "users2", "Orders_us"]
    assert selection.select(names) == ["orders_eu", "users"]


@pytest.mark.parametrize(("options", "option"), [
    ({"tables": "a,,b"}, "tables"),
    ({"tables": " "}, "tables"),
    ({"tables": "a", "exclude": "x,"}, "exclude"),
    ({"tables": "a", "table.name": "a"}, "table.name"),
    ({"tables": "a", "tables.refreshIntervalMs": "soon"}, "tables.refreshIntervalMs"),
    ({"tables": "a", "maxOffsetsPerChannel": "0"}, "maxOffsetsPerChannel"),
    ({"tables": "a", "tables.maxPartitions": "0"}, "tables.maxPartitions"),
    ({"tables": "a", "tables.maxPartitions": "many"}, "tables.maxPartitions"),
])
def test_a_bad_multi_table_option_is_refused_naming_it(tmp_path: Path, options: dict,
                                                       option: str) -> None:
    base = {"endpoint": f"local://{tmp_path}/s.db", "tunnel.name": "t"}
    with pytest.raises(OptionError) as raised:
        MultiTableOptions.from_spark({**base, **options})
    assert raised.value.fields["option"] == option


def _store(path: Path) -> LocalTablestore:
    store = LocalTablestore(path)
    store.create_table("a", [("id", "INTEGER")], [("v", "STRING"), ("b", "BINARY")], channels=2)
    store.create_table("b", [("k", "STRING")], [("n", "DOUBLE")], channels=1)
    store.create_table("c", [("k", "STRING")], [], channels=1)
    return store


def _tables_read(partitions: Sequence[Any]) -> set[str]:
    return {read.table for partition in partitions for read in partition.reads}


def test_tables_join_with_their_initial_offset_and_a_dropped_one_is_frozen(
        tmp_path: Path) -> None:
    with _store(tmp_path / "s.db") as store:
        store.put_row("a", {"id": 1}, {"v": "x", "b": b"\x00\xff"})
        store.put_row("b", {"k": "q"}, {"n": 1.5})
        reader = MultiTableStreamReader(MultiTableOptions.from_spark({
            "endpoint": f"local://{tmp_path}/s.db", "tables": "a,b*", "tunnel.name": "t",
            "tables.refreshIntervalMs": "0"}))
        start = reader.initialOffset()
        assert sorted(start["tables"]) == ["a", "b"]  # c is not selected
        end = reader.latestOffset(start, None)
        partitions = reader.partitions(start, end)
        assert _tables_read(partitions) == {"a", "b"}
        executor = pickle.loads(pickle.dumps(reader))  # as Spark sends it
        rows = [r for p in partitions for b in executor.read(pickle.loads(pickle.dumps(p)))
                for r in b.to_pylist()]
        reader.commit(end)
        assert sorted((r["_table"], r["_key"]) for r in rows) == [("a", '{"id":1}'),
                                                                 ("b", '{"k":"q"}')]
        store.create_table("b2", [("k", "STRING")], [], channels=1)
        store.put_row("b2", {"k": "z"}, {})
        store.drop_table("b")
        joined = reader.latestOffset(end, None)
        assert joined["tables"]["b"] == end["tables"]["b"]  # frozen
        assert reader.table_states == {"a": TableState(State.STREAMING),
                                       "b": TableState(State.DROPPED),
                                       "b2": TableState(State.NEW)}
        assert reader.partitions(end, joined) == []  # b2 joins: read from the next batch
        reader.commit(joined)
        after = reader.latestOffset(joined, None)
        assert _tables_read(reader.partitions(joined, after)) == {"b2"}
        report = reader.reportLatestOffset()
        assert report["tables"]["b"] == "dropped" and "b" not in report["lag"]
        store.put_row("a", {"id": 2}, {"v": "y"})  # one record behind the batch planned next
        assert report["lag"]["a"]["recordsBehind"] == 0
        reader._reporters.clear()  # a fresh measurement
        assert reader.reportLatestOffset()["lag"]["a"]["recordsBehind"] == 1
        reader.stop()


def test_a_batch_of_many_channels_is_dealt_into_at_most_max_partitions(tmp_path: Path) -> None:
    """Five tables of two channels, ``tables.maxPartitions=3``: ten channel reads in three
    Spark partitions, a table's two channels in different ones; every row is read once, and
    the batch read again (a retried task, a replay) gives the same rows."""
    with LocalTablestore(tmp_path / "s.db") as store:
        for t in range(5):
            store.create_table(f"t{t}", [("id", "INTEGER")], [("v", "STRING")], channels=2)
            for i in range(6):
                store.put_row(f"t{t}", {"id": i}, {"v": f"{t}.{i}"})
        options = MultiTableOptions.from_spark({
            "endpoint": f"local://{tmp_path}/s.db", "tables": "t*", "tunnel.name": "t",
            "tables.maxPartitions": " 3.0 "})  # as leniently as any integer option
        reader = MultiTableStreamReader(options)
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        partitions = reader.partitions(start, end)
        assert len(partitions) == 3
        assert sum(len(p.reads) for p in partitions) == 10
        for t in range(5):  # a busy table is still read in parallel
            holding = [i for i, p in enumerate(partitions) if f"t{t}" in p.tables]
            assert len(holding) == 2

        def read_all(parts: Sequence[Any]) -> list[tuple[str, str]]:
            executor = pickle.loads(pickle.dumps(reader))  # as Spark sends it
            return sorted((r["_table"], r["_row"]) for p in parts
                          for b in executor.read(pickle.loads(pickle.dumps(p)))
                          for r in b.to_pylist())

        rows = read_all(partitions)
        assert rows == sorted((f"t{t}", f'{{"v":"{t}.{i}"}}') for t in range(5)
                              for i in range(6))
        assert read_all(partitions) == rows
        reader.stop()
        replay = MultiTableStreamReader(options)  # a restart plans the logged batch again
        assert read_all(replay.partitions(start, end)) == rows
        replay.stop()


def test_generic_rows_are_typed_again_with_the_tables_declared_columns(tmp_path: Path) -> None:
    with _store(tmp_path / "s.db") as store:
        store.put_row("a", {"id": 7}, {"v": "seven", "b": b"\x01\x02"})
        store.delete_row("a", {"id": 7})
        reader = MultiTableStreamReader(MultiTableOptions.from_spark({
            "endpoint": f"local://{tmp_path}/s.db", "tables": "a", "tunnel.name": "t"}))
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
        reader.stop()
    changes, keys = generic_rows.decode(pa.Table.from_batches(batches))
    assert keys == ("id",)
    assert changes.schema.field("id").type == pa.int64()
    assert changes.select(["id", "v", "b", "_op"]).to_pylist() == [
        {"id": 7, "v": "seven", "b": b"\x01\x02", "_op": "PUT"},
        {"id": 7, "v": None, "b": None, "_op": "DELETE"}]


def test_the_generic_rows_codec_gives_back_a_tables_own_output_rows_of_every_type() -> None:
    """``generic_rows.decode(encode(rows))`` is the single-table output of the same changes:
    its types (one type table: the single-table schema's Arrow form), values (binary, 64-bit
    integers, nulls) and change columns, a DELETE keeping only its key."""
    key = (ColumnSpec("k", "STRING"), ColumnSpec("n", "INTEGER"))
    columns = tuple(ColumnSpec(f"c_{t.lower()}", t)
                    for t in ("INTEGER", "DOUBLE", "BOOLEAN", "STRING", "BINARY"))
    schema = output_schema(TableSchema("t", key, columns))
    big = 2**63 - 1
    typed = pa.RecordBatch.from_pylist([
        {"k": "a", "n": big, "c_integer": -big, "c_double": 1.5, "c_boolean": True,
         "c_string": "é", "c_binary": b"\x00\xff", "_op": "PUT", "_channel_id": "ch",
         "_sequence": "1", "_commit_ts": None, "_before": None, "_extra": '{"x": 1}'},
        {"k": "a", "n": big, "c_integer": None, "c_double": None, "c_boolean": None,
         "c_string": None, "c_binary": None, "_op": "DELETE", "_channel_id": "ch",
         "_sequence": "2", "_commit_ts": None, "_before": '{"c_integer": 3}', "_extra": None},
    ], schema=arrow_schema(schema))
    encoded = generic_rows.encode(typed, "t", key, columns)
    assert encoded.schema == arrow_schema(generic_rows.MULTI_TABLE_SCHEMA)
    decoded, keys = generic_rows.decode(pa.Table.from_batches([encoded]))
    assert keys == ("k", "n")
    assert [(f.name, f.type) for f in decoded.schema] == [(f.name, f.type) for f in typed.schema]
    assert decoded.to_pylist() == typed.to_pylist()


def test_replicate_takes_table_or_tables_not_both_and_a_template_target(tmp_path: Path) -> None:
    _store(tmp_path / "s.db").close()
    runner = CliRunner()
    for args, flag in ((["--table", "a", "--tables", "a*"], "--tables"), ([], "--table"),
                       (["--tables", "a*", "--target", "delta:///lake/one"], "target")):
        result = runner.invoke(app, ["replicate", "--output", str(tmp_path), "--store",
                                     str(tmp_path / "s.db"), *args])
        assert result.exit_code == 2
        assert flag in result.stderr and len(result.stderr.splitlines()) == 1


def test_per_table_settings_layer_over_the_defaults_and_under_given_flags(
        tmp_path: Path) -> None:
    path = tmp_path / "tables.toml"
    path.write_text('[defaults]\nschema_drift = "exception"\n\n[tables.orders]\nscd = 2\n'
                    'target = "iceberg:///wh?table=cdc.{table}"\nkeys = ["a", "b"]\n')
    config = load_table_config(path)
    base = ApplySettings("delta:///lake/{table}")
    assert config.for_table("users", base) == (
        ApplySettings("delta:///lake/{table}", schema_drift="exception"), None)
    assert config.for_table("orders", base) == (
        ApplySettings("iceberg:///wh?table=cdc.{table}", scd=2, schema_drift="exception"),
        ("a", "b"))
    given = ApplySettings("delta:///lake/{table}", schema_drift="lenient")
    assert config.for_table("orders", given, frozenset({"schema_drift"}))[0].schema_drift \
        == "lenient"


@pytest.mark.parametrize(("text", "message"), [
    ("[tables.orders]\nscd = 3\n", "table 'orders': key 'scd'"),
    ("[tables.orders]\ncolour = 1\n", "table 'orders': key 'colour'"),
    ("[defaults]\nschema_drift = \"sometimes\"\n", "[defaults]: key 'schema_drift'"),
    ("[tables\n", "is not TOML"),
])
def test_a_bad_settings_file_is_refused_naming_the_table_and_the_key(
        tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tables.toml"
    path.write_text(text)
    with pytest.raises(TableConfigError, match=re.escape(message)):
        load_table_config(path)


def test_the_tables_are_listed_and_read_over_the_tablestore_wire(tmp_path: Path) -> None:
    """The same query against the emulator: ListTable picks the tables, each is read through
    its own tunnel over HTTP."""
    pytest.importorskip("tablestore")
    from tablestore_emulator.server import EmulatorServer
    from testkit.emulator import INSTANCE, KEY_ID, SECRET

    with _store(tmp_path / "s.db") as store:
        store.put_row("a", {"id": 1}, {"v": "x"})
        store.put_row("b", {"k": "q"}, {"n": 2.5})
        store.put_row("c", {"k": "skipped"}, {})
    emulator = EmulatorServer(str(tmp_path / "s.db"), INSTANCE, KEY_ID, SECRET).start()
    try:
        reader = MultiTableStreamReader(MultiTableOptions.from_spark({
            "endpoint": emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
            "access.key.secret": SECRET, "tables": "*", "exclude": "c", "tunnel.name": "q",
            "meta.store": f"sqlite://{tmp_path}/meta.db"}))
        start = reader.initialOffset()
        assert sorted(start["tables"]) == ["a", "b"]
        end = reader.latestOffset(start, None)
        rows = [r for p in reader.partitions(start, end) for b in reader.read(p)
                for r in b.to_pylist()]
        reader.commit(end)
        reader.stop()
    finally:
        emulator.stop()
    assert sorted((r["_table"], r["_key"], r["_row"]) for r in rows) == [
        ("a", '{"id":1}', '{"v":"x","b":null}'), ("b", '{"k":"q"}', '{"n":2.5}')]


def test_the_query_s_own_meta_table_is_never_selected(tmp_path: Path) -> None:
    """Over the wire the meta table is, by default, a table of the instance the tables are
    listed from: a pattern matching it (``*``) must leave it out, else every batch's
    checkpoints would be changes to read in the next (found by the benchmark over the
    emulator: ``t*`` and ``tablestore_cdc_meta``)."""
    pytest.importorskip("tablestore")
    from connector.table_selection import own_meta_table
    from tablestore_emulator.server import EmulatorServer
    from testkit.emulator import INSTANCE, KEY_ID, SECRET

    with _store(tmp_path / "s.db") as store:
        store.put_row("a", {"id": 1}, {"v": "x"})
    emulator = EmulatorServer(str(tmp_path / "s.db"), INSTANCE, KEY_ID, SECRET).start()
    try:
        wire = {"endpoint": emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
                "access.key.secret": SECRET, "tables": "*", "tunnel.name": "q",
                "tables.refreshIntervalMs": "0"}
        options = MultiTableOptions.from_spark(wire)
        assert options.meta_table == "tablestore_cdc_meta"
        reader = MultiTableStreamReader(options)
        start = reader.initialOffset()
        reader.commit(reader.latestOffset(start, None))
        with LocalTablestore(tmp_path / "s.db") as store:
            assert "tablestore_cdc_meta" in store.list_tables()  # written by the query
        assert reader.listed_tables() == ["a", "b", "c"]
        reader.stop()
        # a meta.store elsewhere leaves every table of the instance selectable
        assert MultiTableOptions.from_spark(
            {**wire, "meta.store": f"sqlite://{tmp_path}/meta.db"}).meta_table is None
        named = {**wire, "meta.store": f"tablestore://{INSTANCE}/cdc_meta?endpoint="
                 f"{emulator.url}"}
        assert own_meta_table(MultiTableOptions.from_spark(named).for_table("a")) == "cdc_meta"
    finally:
        emulator.stop()


@pytest.mark.usefixtures("aws_test_credentials")
def test_the_tables_are_listed_and_read_over_dynamodb_streams(
        tmp_path: Path, moto_url: str, streams_fake: Any) -> None:
    """The same query on a DynamoDB Streams endpoint (a moto server on 127.0.0.1): ListTables
    picks the region's tables but the checkpoint and meta tables, each table is read through
    its own stream, and a table without a stream is reported failed while the others go on."""
    from testkit.tunnel_harnesses import StreamsHarness

    h = StreamsHarness(moto_url, streams_fake)
    for name in ("orders", "users"):
        h.create_table(name, 2)
    h.ddb.create_table(TableName="plain", BillingMode="PAY_PER_REQUEST",
                       KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                       AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}])
    h.put("orders", "o1", 1)
    h.put("users", "u1", 2)
    h.update("orders", "o1", 3)
    meta = f"dynamodb://cdc-meta?region=us-east-1&endpoint_url={moto_url}&create_table=true"
    options = MultiTableOptions.from_spark({
        "endpoint": h.uri, "tables": "*", "tunnel.name": "q", "tables.refreshIntervalMs": "0",
        "meta.store": meta})
    assert options.meta_table == "cdc-meta"
    reader = MultiTableStreamReader(options)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    executor = pickle.loads(pickle.dumps(reader))
    rows = [r for p in reader.partitions(start, end)
            for b in executor.read(pickle.loads(pickle.dumps(p))) for r in b.to_pylist()]
    reader.commit(end)
    listed = reader.listed_tables()
    states = dict(reader.table_states)
    reader.stop()
    checkpoint_table = re.search(r"checkpoint_table=([^&]+)", h.uri).group(1)  # type: ignore
    assert checkpoint_table in h.ddb.list_tables()["TableNames"]  # there, and left out
    assert listed == ["orders", "plain", "users"]
    assert sorted(start["tables"]) == ["orders", "users"]
    assert states["plain"].state is State.FAILED
    assert "stream" in (states["plain"].reason or "").lower()
    assert sorted((r["_table"], r["_key"], r["_op"]) for r in rows) == [
        ("orders", '{"id":"o1"}', "PUT"), ("orders", '{"id":"o1"}', "UPDATE"),
        ("users", '{"id":"u1"}', "PUT")]


def test_a_table_dropped_after_its_batch_was_logged_is_passed_over_on_restart(
        tmp_path: Path) -> None:
    with _store(tmp_path / "s.db") as store:
        store.put_row("a", {"id": 1}, {"v": "x"})
        store.put_row("b", {"k": "q"}, {"n": 1.0})
        options = MultiTableOptions.from_spark({
            "endpoint": f"local://{tmp_path}/s.db", "tables": "a,b", "tunnel.name": "t"})
        reader = MultiTableStreamReader(options)
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)  # Spark logs it, then the process dies
        reader.stop()
        store.drop_table("b")
        restarted = MultiTableStreamReader(options)
        assert _tables_read(restarted.partitions(start, end)) == {"a"}
        assert restarted.table_states["b"] == TableState(State.DROPPED)
        restarted.commit(end)
        restarted.stop()


def test_the_retention_headroom_is_a_gauge_per_table_and_warns_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Scraped over HTTP from ``replicate --metrics-port``'s registry: the headroom is the
    retention minus the lag; past 80 % of it one warning line, again only after a recovery."""
    import logging
    import urllib.request

    from tablestore_cdc.pipeline.metrics import TableMetrics
    from tablestore_cdc.table_status import TableStatus

    def status(table: str, seconds_behind: float | None) -> TableStatus:
        return TableStatus(table=table, job="out", selection="*", state="streaming",
                           seconds_behind=seconds_behind)

    metrics = TableMetrics(retention_s=1000.0)
    port = metrics.serve(0)

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            lines = answer.read().decode().splitlines()
        prefix = "tablestore_cdc_table_retention_headroom_seconds{table="
        return {line[len(prefix) + 1:].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in lines if line.startswith(prefix)}

    try:
        with caplog.at_level(logging.WARNING, logger="tablestore_cdc.pipeline"):
            metrics.update({"a": status("a", 100), "b": status("b", None)})
            assert scrape() == {"a": 900.0}  # b's lag is not measured yet
            for behind in (850, 900, 100, 990):
                metrics.update({"a": status("a", behind)})
            assert scrape() == {"a": 10.0}
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 2, warnings  # at 850, and at 990 after the recovery at 100
        assert warnings[0] == ("table a is 850 s behind, past 80 % of the retention (1000 s): "
                               "150 s left before unread changes are trimmed")
    finally:
        metrics.close()


def _written_before(typed: pa.RecordBatch, key: tuple[ColumnSpec, ...],
                    columns: tuple[ColumnSpec, ...]) -> pa.RecordBatch:
    """``typed`` as the codec wrote it before it worked on whole columns: each row's key and
    image by ``json.dumps`` (non-ASCII escaped, ``NaN``, ``-0.0``), binary in base64."""
    def dumps(values: dict) -> str:
        return json.dumps({k: base64.b64encode(v).decode() if isinstance(v, bytes) else v
                           for k, v in values.items()}, separators=(",", ":"))
    new = generic_rows.encode(typed, "t", key, columns)
    rows = typed.to_pylist()
    key_json = [dumps({c.name: r[c.name] for c in key}) for r in rows]
    row_json = [None if r["_op"] == "DELETE" else dumps({c.name: r[c.name] for c in columns})
                for r in rows]
    return new.set_column(1, "_key", pa.array(key_json)).set_column(2, "_row", pa.array(row_json))


def test_the_codec_keeps_every_value_arrow_would_not_write_as_json_does() -> None:
    """Each value the column-wise writer must leave to ``json`` (a string needing escapes, a
    non-finite or negative-zero double, binary), non-ASCII text, extreme integers and nulls,
    each in a batch of its own beside plain values, comes back as it was: from the column-wise
    writer and from rows written by ``json`` (every change log written before); a text Arrow's
    reader refuses (another writer's integer written as ``2.0``) is read by ``json``."""
    key = (ColumnSpec("k", "STRING"), ColumnSpec("n", "INTEGER"))
    columns = tuple(ColumnSpec(f"c_{t.lower()}", t)
                    for t in ("INTEGER", "DOUBLE", "BOOLEAN", "STRING", "BINARY"))
    schema = arrow_schema(output_schema(TableSchema("t", key, columns)))
    plain = {"k": "a", "n": 1, "c_integer": 2, "c_double": 0.1, "c_boolean": True,
             "c_string": "s", "c_binary": b"b", "_op": "PUT", "_channel_id": "ch",
             "_sequence": "1", "_commit_ts": None, "_before": None, "_extra": None}
    cases = [("c_string", v) for v in ('quote "', "back \\ slash", "line\nbreak", "tab\t",
                                        "nul\x00", "\x1f", "é — 漢字 😀", "", "\u2028")]
    cases += [("k", 'key "quoted"'), ("k", "é")]
    cases += [("c_double", v) for v in (float("nan"), float("inf"), float("-inf"), -0.0,
                                        5e-324, 1.5e300, 2.0**53)]
    cases += [("c_integer", v) for v in (-2**63, 2**63 - 1, None)]
    cases += [("n", -2**63), ("c_boolean", None), ("c_binary", b"\x00\xff\n"), ("c_binary", b"")]

    def text(values: list) -> str:  # NaN != NaN: values compared as their texts
        return json.dumps(values, default=repr)

    for column, value in cases:
        typed = pa.RecordBatch.from_pylist(
            [plain, {**plain, column: value, "_sequence": "2"},
             {**plain, "_op": "DELETE", "_sequence": "3"}], schema=schema)
        for batch in (generic_rows.encode(typed, "t", key, columns),
                      _written_before(typed, key, columns)):
            decoded = generic_rows.decode(pa.Table.from_batches([batch]))[0]
            expected = typed.to_pylist()
            expected[2].update({c.name: None for c in columns})  # a DELETE keeps its key
            assert text(decoded.to_pylist()) == text(expected), (column, value)
            assert all("\n" not in t for t in batch.column("_row").to_pylist() if t)
        # any JSON reader (the writer before, the Spark engine's) reads the same values
        new, before = (generic_rows.encode(typed, "t", key, columns),
                       _written_before(typed, key, columns))
        for name in ("_key", "_row"):
            assert text([json.loads(t) for t in new.column(name).to_pylist()[:2]]) == text(
                [json.loads(t) for t in before.column(name).to_pylist()[:2]]), (column, value)
    other_writer = _written_before(typed, key, columns)  # its integers as 2.0: Arrow refuses
    floats = [None if t is None else json.dumps({**json.loads(t), "c_integer": 2.0})
              for t in other_writer.column("_row").to_pylist()]
    decoded = generic_rows.decode(pa.Table.from_batches(
        [other_writer.set_column(2, "_row", pa.array(floats))]))[0]
    assert text(decoded.to_pylist()) == text(expected)


def test_a_column_whose_arrow_type_is_not_its_declared_one_is_still_written_as_json() -> None:
    """A DOUBLE column arriving as integers and a STRING one as integers (a batch typed by
    another hand) are written by ``json``, so each text stays JSON and reads back typed."""
    key = (ColumnSpec("id", "INTEGER"),)
    columns = (ColumnSpec("amount", "DOUBLE"), ColumnSpec("note", "STRING"))
    typed = pa.RecordBatch.from_pydict({
        "id": pa.array([1, 2]), "amount": pa.array([3, None]), "note": pa.array(["a", None]),
        "_op": ["PUT", "PUT"], "_channel_id": ["c", "c"], "_sequence": ["1", "2"],
        "_commit_ts": pa.array([None, None], pa.timestamp("us", "UTC")),
        "_before": pa.array([None, None], pa.string()),
        "_extra": pa.array([None, None], pa.string())})
    encoded = generic_rows.encode(typed.set_column(2, "note", pa.array([7, None])), "t",
                                  key, columns)
    assert [json.loads(t) for t in encoded.column("_row").to_pylist()] == [
        {"amount": 3, "note": 7}, {"amount": None, "note": None}]
    decoded = generic_rows.decode(pa.Table.from_batches(
        [generic_rows.encode(typed, "t", key, columns)]))[0]
    assert decoded.select(["id", "amount", "note"]).to_pylist() == [
        {"id": 1, "amount": 3.0, "note": "a"}, {"id": 2, "amount": None, "note": None}]
