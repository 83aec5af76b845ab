"""``before.format=struct``: ``_before`` as a typed struct of the output's attribute columns
(connector/schema.py), through the embedded store and the stream reader's ``read()``; the JSON
text stays the default."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from connector.errors import OptionError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.schema import check_user_schema, output_schema
from connector.source import TablestoreDataSource, TablestoreStreamReader


@pytest.fixture
def store(tmp_path):
    s = LocalTablestore(tmp_path / "store.db")
    s.create_table("t", primary_key=[("id", "INTEGER")],
                   columns=[("name", "STRING"), ("qty", "INTEGER")], channels=1)
    s.put_row("t", {"id": 1}, {"name": "a", "qty": 2, "colour": "red"})
    s.update_row("t", {"id": 1}, {"qty": 3, "name": None})
    s.delete_row("t", {"id": 1})
    s.put_row("t", {"id": 2}, {"name": "b"})
    yield s
    s.close()


def read(store: LocalTablestore, **extra: str) -> list[dict]:
    spark_options = {"endpoint": f"local://{store.path}", "table.name": "t",
                     "tunnel.name": "q", **extra}
    source = TablestoreDataSource(spark_options)
    schema = source.schema()
    options = SourceOptions.from_spark(spark_options)
    proto = StreamProtocol(options)
    start = proto.initial_offset()
    (part,) = proto.plan(start, proto.latest_offset(start, None))
    reader = TablestoreStreamReader(options, schema)
    try:
        rows = pa.Table.from_batches(list(reader.read(part))).to_pylist()
    finally:
        proto.close()
    return rows


def test_json_text_is_the_default(store):
    rows = read(store)
    assert [r["_before"] for r in rows] == [
        None, '{"colour":"red","name":"a","qty":2}', '{"colour":"red","qty":3}', None]


def test_struct_holds_the_attribute_columns_with_their_types(store):
    schema = output_schema(store.table_schema("t"), "struct")
    assert schema["_before"].dataType == StructType([
        StructField("name", StringType(), True), StructField("qty", LongType(), True)])
    rows = read(store, **{"before.format": "STRUCT"})
    assert [r["_before"] for r in rows] == [
        None, {"name": "a", "qty": 2}, {"name": None, "qty": 3}, None]
    assert [r["_op"] for r in rows] == ["PUT", "UPDATE", "DELETE", "PUT"]


def test_a_user_schema_must_give_the_struct_of_its_own_attribute_columns(store):
    table = store.table_schema("t")
    good = StructType([StructField("id", LongType(), False), StructField("qty", LongType()),
                       StructField("_before", StructType([StructField("qty", LongType())]))])
    assert check_user_schema(good, table, "struct") is good
    with pytest.raises(OptionError, match="column _before must be struct<qty:bigint>"):
        check_user_schema(StructType([*good.fields[:2], StructField("_before", StringType())]),
                          table, "struct")


def test_an_unknown_format_is_refused_naming_the_option(store):
    with pytest.raises(OptionError, match="option 'before.format'"):
        SourceOptions.from_spark({"endpoint": f"local://{store.path}", "table.name": "t",
                                  "tunnel.name": "q", "before.format": "avro"})


@pytest.mark.slow
def test_spark_reads_the_struct(spark, store, tmp_path):
    rows: list = []
    query = (spark.readStream.format("tablestore").option("endpoint", f"local://{store.path}")
             .option("table.name", "t").option("tunnel.name", "q")
             .option("before.format", "struct").load()
             .writeStream.foreachBatch(lambda df, _: rows.extend(
                 df.selectExpr("id", "_op", "_before.qty AS before_qty").collect()))
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted((r.id, r._op, r.before_qty) for r in rows) == [
        (1, "DELETE", 3), (1, "PUT", None), (1, "UPDATE", 2), (2, "PUT", None)]
