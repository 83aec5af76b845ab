"""The Spark engine's decode of generic rows (tablestore_cdc/lakehouse/spark_rows.py) against the
embedded one (connector.generic_rows.decode): the same rows of every declared type, typed the
same, on the suite's real Spark; only the (_table, _schema) pairs reach the driver."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_type

from connector import generic_rows
from connector.schema import TABLESTORE_TO_SPARK, output_schema
from connector.spark_compat import arrow_schema
from connector.tunnel.page import TABLESTORE_TO_ARROW
from connector.tunnel.types import ColumnSpec, TableSchema
from tablestore_cdc.lakehouse.spark_rows import declared_schemas, decode

KEY = (ColumnSpec("id", "INTEGER"), ColumnSpec("part.name", "STRING"))
COLUMNS = (ColumnSpec("d", "DOUBLE"), ColumnSpec("b", "BOOLEAN"), ColumnSpec("s", "STRING"),
           ColumnSpec("bin", "BINARY"), ColumnSpec("n", "INTEGER"))
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _change(i: int, op: str, **values: Any) -> dict[str, Any]:
    image = {c.name: values.get(c.name) for c in COLUMNS}
    return {"id": i, "part.name": f"p-{i}", **image, "_op": op, "_channel_id": "c1",
            "_sequence": f"{i:04d}", "_commit_ts": None if i == 4 else T0, "_before": None,
            "_extra": '{"x":1}' if i == 3 else None}


ROWS = [_change(1, "PUT", d=1.5, b=True, s="naïve ✓ \"quoted\"", bin=b"\x00\xff\n", n=2 ** 62),
        _change(2, "UPDATE", d=math.inf, b=False, s="", bin=b"", n=-(2 ** 63)),
        _change(3, "PUT", d=-0.0, s="\\back\\slash", n=0),
        _change(4, "DELETE"),
        _change(5, "PUT", d=float("nan"))]


def _generic(table: str, rows: list[dict[str, Any]], columns: tuple[ColumnSpec, ...]
             ) -> pa.RecordBatch:
    schema = arrow_schema(output_schema(TableSchema(table, KEY, columns)))
    typed = pa.RecordBatch.from_pylist(rows, schema=schema)
    return generic_rows.encode(typed, table, KEY, columns)


def test_the_spark_type_table_is_the_embedded_decodes() -> None:
    """One type table: the Spark types of the source's output are the embedded decode's Arrow
    types, as PySpark converts them."""
    assert set(TABLESTORE_TO_SPARK) == set(TABLESTORE_TO_ARROW)
    for name, arrow in TABLESTORE_TO_ARROW.items():
        assert from_arrow_type(arrow) == TABLESTORE_TO_SPARK[name]


@pytest.mark.slow
def test_spark_decodes_generic_rows_as_the_embedded_decode(spark: Any) -> None:
    batch = pa.Table.from_batches([_generic("t1", ROWS, COLUMNS)])
    # another table, and t1 again with fewer declared columns at an older commit time
    older = pa.Table.from_batches([_generic(
        "t1", [{**_change(6, "PUT", d=2.0), "_commit_ts": datetime(2025, 1, 1, tzinfo=UTC)}],
        COLUMNS[:1])])
    other = pa.Table.from_batches([_generic("t2", [_change(7, "PUT", s="x")], COLUMNS)])
    frame = spark.createDataFrame(pa.concat_tables([older, batch, other]))
    declared = declared_schemas(frame)
    assert set(declared) == {"t1", "t2"}
    assert declared["t1"] == batch.column("_schema")[0].as_py()  # the newest change's
    t1 = frame.where("_table = 't1'")
    changes, keys = decode(t1, declared["t1"])
    assert keys == ("id", "part.name")
    expected, expected_keys = generic_rows.decode(pa.concat_tables([older, batch]))
    assert keys == expected_keys
    got = changes.toArrow()
    assert got.column_names == expected.column_names
    for name in expected.column_names:
        assert got.schema.field(name).type == expected.schema.field(name).type, name
    ordered = sorted(got.to_pylist(), key=lambda r: r["id"])
    wanted = sorted(expected.to_pylist(), key=lambda r: r["id"])
    assert math.isnan(ordered[4]["d"]) and math.isnan(wanted[4]["d"])
    for row in (ordered[4], wanted[4]):
        row["d"] = "nan"
    assert ordered == wanted
    assert ordered[3]["s"] is None and ordered[3]["_op"] == "DELETE"  # a DELETE: key only
    assert ordered[0]["bin"] == b"\x00\xff\n" and ordered[1]["n"] == -(2 ** 63)
