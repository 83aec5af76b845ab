"""Output schema derivation, user-schema validation and records -> Arrow (no Spark session)."""

from __future__ import annotations

import json
import re

import pytest
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from connector.errors import OptionError
from connector.schema import (
    RecordBatchBuilder,
    UndeclaredValuesError,
    check_user_schema,
    output_schema,
)
from connector.tunnel import ColumnSpec, Op, Record, TableSchema
from connector.tunnel.page import records_to_page

TYPES = {"long": LongType(), "int": IntegerType(), "string": StringType(), "double": DoubleType()}


def ddl(text: str) -> StructType:
    """'id long, name string' -> StructType (StructType.fromDDL needs a running session)."""
    return StructType([StructField(n, TYPES[t]) for n, t in
                       (part.split() for part in text.split(","))])


TABLE = TableSchema("t", (ColumnSpec("id", "INTEGER"),),
                    (ColumnSpec("name", "STRING"), ColumnSpec("price", "DOUBLE")))


def record(op: Op, seq: int, columns: dict, before: dict | None = None) -> Record:
    return Record(op, {"id": 1}, columns, before, f"{seq:020d}", 1_700_000_000_000_000 + seq,
                  "ch-0000")


def test_default_schema_maps_declared_types_and_adds_metadata():
    schema = output_schema(TABLE)
    assert schema.simpleString() == (
        "struct<id:bigint,name:string,price:double,_op:string,_channel_id:string,"
        "_sequence:string,_commit_ts:timestamp,_before:string,_extra:string>")


@pytest.mark.parametrize(("text", "problem"), [
    ("name string, _op string", "lacks primary-key column(s) ['id']"),
    ("id string, _op string", "column id must be bigint"),
    ("id long, _op int", "column _op must be string"),
])
def test_user_schema_errors_name_the_column(text, problem):
    with pytest.raises(OptionError, match=re.escape(problem)):
        check_user_schema(ddl(text), TABLE)


def test_rows_hold_after_images_and_metadata():
    builder = RecordBatchBuilder(output_schema(TABLE))
    batch = builder.project(records_to_page([
        record(Op.PUT, 1, {"name": "a", "price": 1.5, "colour": "red"}),
        record(Op.UPDATE, 2, {"price": 2.0}, before={"name": "a", "price": 1.5}),
        record(Op.DELETE, 3, {}, before={"name": "a", "price": 2.0}),
    ], builder.layout), "ch-0000")
    rows = batch.to_pylist()
    assert [(r["id"], r["name"], r["price"], r["_op"]) for r in rows] == [
        (1, "a", 1.5, "PUT"), (1, "a", 2.0, "UPDATE"), (1, None, None, "DELETE")]
    assert json.loads(rows[0]["_extra"]) == {"colour": "red"}
    assert rows[1]["_extra"] is None
    assert json.loads(rows[2]["_before"]) == {"name": "a", "price": 2.0}
    assert [r["_sequence"] for r in rows] == sorted(r["_sequence"] for r in rows)
    assert rows[0]["_commit_ts"].timestamp() == pytest.approx(1_700_000_000.000001)


def test_undeclared_values_are_never_dropped_silently():
    narrow = ddl("id long, name string, _op string")
    builder = RecordBatchBuilder(check_user_schema(narrow, TABLE))
    with pytest.raises(UndeclaredValuesError, match=r"\['colour', 'price'\]"):
        builder.project(records_to_page(
            [record(Op.PUT, 1, {"name": "a", "price": 1.0, "colour": "x"})], builder.layout),
            "ch-0000")
