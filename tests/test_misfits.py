"""Values of another type than their output column, under each ``schema.change.behavior``
(connector/misfits.py; no Spark session): through the embedded store, the stream reader's
``read()`` and the meta store, so the claim-before-refusal rule is checked on the real read."""

from __future__ import annotations

import json
import pickle
import re

import pyarrow as pa
import pytest
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from cdc_common.schema_change import ALIASES, POLICIES
from connector.errors import OptionError, SchemaChangeError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.partition import ChannelPartition
from connector.protocol import StreamProtocol
from connector.schema import METADATA_FIELDS, RecordBatchBuilder, UndeclaredValuesError
from connector.source import TablestoreStreamReader
from connector.tunnel.page import json_value
from meta_store import open_meta_store

#: the table declares only its key: every attribute is schemaless
KEY_ONLY: dict = {"primary_key": [("id", "INTEGER")], "columns": [], "channels": 1}


def schema_of(*fields: StructField, extra: bool = True) -> StructType:
    meta = [f for f in METADATA_FIELDS if extra or f.name != "_extra"]
    return StructType([StructField("id", LongType(), False), *fields, *meta])


WITH_QTY = schema_of(StructField("qty", LongType()), StructField("ok", BooleanType()))


def _write_drift(store: LocalTablestore) -> None:
    """qty: INTEGER, then STRING, then DOUBLE 2.5, then a whole DOUBLE (fits bigint), then
    INTEGER again; colour is never declared."""
    store.create_table("t", **KEY_ONLY)
    store.put_row("t", {"id": 1}, {"qty": 1, "ok": True})
    store.put_row("t", {"id": 2}, {"qty": "3", "ok": False, "colour": "red"})
    store.put_row("t", {"id": 3}, {"qty": 2.5})
    store.put_row("t", {"id": 4}, {"qty": 4.0, "ok": 1})
    store.update_row("t", {"id": 1}, {"qty": 5})


def _read(store: LocalTablestore, schema: StructType,
          policy: str | None = None) -> tuple[pa.Table, TablestoreStreamReader, ChannelPartition]:
    """One batch of the channel through the stream reader's ``read()`` (the executor's path)."""
    extra = {} if policy is None else {"schema.change.behavior": policy}
    options = SourceOptions.from_spark({"endpoint": f"local://{store.path}", "table.name": "t",
                                        "tunnel.name": "q", **extra})
    proto = StreamProtocol(options)
    start = proto.initial_offset()
    (part,) = proto.plan(start, proto.latest_offset(start, None))
    reader = TablestoreStreamReader(options, schema)
    try:
        return pa.Table.from_batches(list(reader.read(part)), reader_schema(reader)), reader, part
    finally:
        proto.close()


def reader_schema(reader: TablestoreStreamReader) -> pa.Schema:
    return RecordBatchBuilder(reader.schema).arrow_schema


@pytest.fixture
def drift_store(tmp_path):
    store = LocalTablestore(tmp_path / "store.db")
    _write_drift(store)
    yield store
    store.close()


def extras(table: pa.Table) -> list[dict | None]:
    return [None if t is None else {k: json_value(v) for k, v in json.loads(t).items()}
            for t in table.column("_extra").to_pylist()]


def test_lenient_is_the_default_and_keeps_each_value_with_its_own_type(drift_store):
    rows, reader, _ = _read(drift_store, WITH_QTY)
    assert rows.column("qty").to_pylist() == [1, None, None, 4, 5]
    assert rows.column("ok").to_pylist() == [True, False, None, None, True]
    assert extras(rows) == [None, {"colour": "red", "qty": "3"}, {"qty": 2.5}, {"ok": 1}, None]
    # the value's type survives: a STRING "3" is not the INTEGER 3, a DOUBLE stays a double
    texts = rows.column("_extra").to_pylist()
    assert '"qty":"3"' in texts[1] and '"qty":2.5' in texts[2] and '"ok":1' in texts[3]


@pytest.mark.parametrize("policy", ["try_evolve", "lenient", "LENIENT"])
def test_try_evolve_is_lenient_at_the_source(drift_store, policy):
    rows, _, _ = _read(drift_store, WITH_QTY, policy)
    assert extras(rows)[1:4] == [{"colour": "red", "qty": "3"}, {"qty": 2.5}, {"ok": 1}]


def test_ignore_drops_the_values_that_do_not_fit_and_keeps_undeclared_ones(drift_store):
    rows, _, _ = _read(drift_store, WITH_QTY, "keep")  # the alias of ignore
    assert rows.column("qty").to_pylist() == [1, None, None, 4, 5]
    assert extras(rows) == [None, {"colour": "red"}, None, None, None]


@pytest.mark.parametrize("policy", ["exception", "fail", "evolve", "add"])
def test_exception_and_evolve_fail_typed_naming_the_change(drift_store, policy):
    with pytest.raises(SchemaChangeError) as info:
        _read(drift_store, WITH_QTY, policy)
    error = info.value
    assert error.fields == {**error.fields, "table": "t", "column": "qty",
                            "column_type": "bigint", "value_type": "STRING", "value": "3",
                            "sequence": "00000000000000000002"}
    assert error.policy in ("exception", "evolve")
    assert re.search(r"table 't': column 'qty' is bigint but the change in channel '[^']+' at "
                     r"00000000000000000002 carries STRING '3'", str(error))
    again = pickle.loads(pickle.dumps(error))  # travels from an executor to the driver
    assert type(again) is SchemaChangeError and str(again) == str(error)


def test_a_refused_batch_replays_exactly_under_another_policy(drift_store):
    options = SourceOptions.from_spark({"endpoint": f"local://{drift_store.path}",
                                        "table.name": "t", "tunnel.name": "q",
                                        "schema.change.behavior": "exception"})
    proto = StreamProtocol(options)
    start = proto.initial_offset()
    end = proto.latest_offset(start, None)
    (part,) = proto.plan(start, end)
    with pytest.raises(SchemaChangeError):
        list(TablestoreStreamReader(options, WITH_QTY).read(part))
    meta = open_meta_store(part.meta_uri)
    claimed = meta.get_end_checkpoint(part.namespace, part.end_uuid, part.channel_id)
    assert claimed is not None and claimed.records == 5
    drift_store.put_row("t", {"id": 9}, {"qty": "later"})  # after the claim: not replayed
    lenient = options.model_copy(update={"schema_change_behavior": "lenient"})
    rows = pa.Table.from_batches(list(TablestoreStreamReader(lenient, WITH_QTY).read(part)))
    assert rows.num_rows == 5 and rows.column("id").to_pylist() == [1, 2, 3, 4, 1]
    assert extras(rows)[1] == {"colour": "red", "qty": "3"}
    proto.close()


def test_lenient_without_an_extra_column_fails_typed(drift_store):
    schema = schema_of(StructField("qty", LongType()), StructField("ok", BooleanType()),
                       StructField("colour", StringType()), extra=False)
    with pytest.raises(SchemaChangeError, match="no _extra column to keep the value in"):
        _read(drift_store, schema)
    rows, _, _ = _read(drift_store, schema, "ignore")  # ignore drops: no _extra needed
    assert rows.column("qty").to_pylist() == [1, None, None, 4, 5]
    assert rows.column("colour").to_pylist() == [None, "red", None, None, None]


def test_undeclared_values_without_extra_are_still_refused_unless_ignored(drift_store):
    schema = schema_of(StructField("qty", StringType()), StructField("ok", BooleanType()),
                       extra=False)
    with pytest.raises((UndeclaredValuesError, SchemaChangeError)):
        _read(drift_store, schema)


def test_a_key_that_does_not_fit_fails_under_every_policy(tmp_path):
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "STRING")], columns=[], channels=1)
    store.put_row("t", {"id": "a"}, {"v": 1})
    schema = StructType([StructField("id", LongType(), False), *METADATA_FIELDS])
    for policy in ("lenient", "ignore"):
        with pytest.raises(SchemaChangeError, match="column 'id' is bigint .* carries STRING "
                           "'a'.*a key column holds only values of its type"):
            _read(store, schema, policy)
    store.close()


def test_an_undeclared_key_that_looks_like_a_column_is_not_a_misfit(tmp_path):
    """``_extra`` is scanned for '"qty":' and the hit confirmed by its JSON: an attribute
    named 'x"qty' matches the scan but is not the column qty."""
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", **KEY_ONLY)
    store.put_row("t", {"id": 1}, {'x"qty': 1, "qty": 2})
    rows, reader, _ = _read(store, WITH_QTY, "exception")
    assert rows.column("qty").to_pylist() == [2]
    assert extras(rows) == [{'x"qty': 1}]
    store.close()


def test_the_option_takes_the_flink_names_and_the_aliases(tmp_path):
    base = {"endpoint": f"local://{tmp_path}/s.db", "table.name": "t", "tunnel.name": "q"}
    assert SourceOptions.from_spark(base).schema_change_behavior == "lenient"
    for name in (*POLICIES, *ALIASES):
        got = SourceOptions.from_spark({**base, "schema.change.behavior": name})
        assert got.schema_change_behavior == ALIASES.get(name, name)
    with pytest.raises(OptionError, match=re.escape(
            "option 'schema.change.behavior': unknown policy (got 'drop'; allowed: exception, "
            "evolve, try_evolve, lenient, ignore (aliases: fail=exception, add=evolve, "
            "keep=ignore))")):
        SourceOptions.from_spark({**base, "schema.change.behavior": "drop"})
