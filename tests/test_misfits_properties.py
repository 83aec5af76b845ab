"""Property tests: random sequences of typed values per attribute (the official SDK's five types:
INTEGER, DOUBLE, STRING, BOOLEAN, BINARY) through the source's value -> column path
(``records_to_page`` and ``RecordBatchBuilder.project``, as an executor runs them) and then
through the apply sink's planner, under every policy of each: the documented result
(docs/schema.md, "Values of another type"; docs/lakehouse.md, "Schema drift"), and nothing
raised but the product's typed errors. No Spark session: fast.

The expected placement is written here from the documentation's rules, not from the code's
lattice, so a change of either shows.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from cdc_common.schema_change import ALIASES, POLICIES
from connector.errors import SchemaChangeError
from connector.schema import METADATA_FIELDS, RecordBatchBuilder
from connector.tunnel.page import json_value, records_to_page
from connector.tunnel.types import Op, Record
from tablestore_cdc.lakehouse.errors import LakehouseError
from tablestore_cdc.lakehouse.plan import ApplyOptions, plan_batch
from testkit.lakehouse import upserts

#: a value of each of the SDK's five types
VALUES = {
    "INTEGER": st.one_of(st.integers(-(2 ** 63), 2 ** 63 - 1), st.sampled_from(
        [0, 2 ** 53, 2 ** 53 + 1, -(2 ** 53) - 1])),
    "DOUBLE": st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                        st.sampled_from([4.0, -0.0, 2.0 ** 63, 1e300])),
    "STRING": st.text(max_size=6),
    "BOOLEAN": st.booleans(),
    "BINARY": st.binary(max_size=6),
}
SPARK = {"bigint": LongType(), "double": DoubleType(), "string": StringType(),
         "boolean": BooleanType(), "binary": BinaryType()}


def kind(value: Any) -> str:
    return {bool: "BOOLEAN", int: "INTEGER", float: "DOUBLE", str: "STRING",
            bytes: "BINARY"}[type(value)]


def documented_fit(value: Any, column: str) -> bool:
    """docs/schema.md, "Values of another type": the rules, as written there."""
    k = kind(value)
    if column == "bigint":
        return k == "INTEGER" or (k == "DOUBLE" and value.is_integer()
                                  and -(2 ** 63) <= value < 2 ** 63)
    if column == "double":
        return k == "DOUBLE" or (k == "INTEGER" and abs(value) <= 2 ** 53)
    return {"string": "STRING", "boolean": "BOOLEAN", "binary": "BINARY"}[column] == k


@st.composite
def attribute_histories(draw: Any) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Output columns of random types for attributes a, b, c, and a sequence of changes each
    writing a random subset of a, b, c and the undeclared u, each value of a random type."""
    columns = {name: draw(st.sampled_from(sorted(SPARK))) for name in ("a", "b", "c")}
    changes = []
    for _ in range(draw(st.integers(1, 12))):
        row = {}
        for name in ("a", "b", "c", "u"):
            if draw(st.booleans()):
                row[name] = draw(VALUES[draw(st.sampled_from(sorted(VALUES)))])
        changes.append(row)
    return columns, changes


def source_batch(columns: dict[str, str], changes: list[dict[str, Any]],
                 policy: str) -> tuple[pa.RecordBatch, RecordBatchBuilder]:
    schema = StructType([StructField("id", LongType(), False),
                         *(StructField(n, SPARK[t]) for n, t in columns.items()),
                         *METADATA_FIELDS])
    builder = RecordBatchBuilder(schema, policy=policy, table="t")
    records = [Record(Op.PUT, {"id": i}, row, None, f"{i + 1:020d}",
                      1_767_225_600_000_000 + i, "ch-0") for i, row in enumerate(changes)]
    return builder.project(records_to_page(records, builder.layout), "ch-0"), builder


def same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, float) and math.isnan(want):
        return math.isnan(got)
    return got == want and type(got) is type(want)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=attribute_histories(), policy=st.sampled_from([*POLICIES, *ALIASES]))
def test_the_source_places_every_value_as_documented(
        history: tuple[dict[str, str], list[dict[str, Any]]], policy: str) -> None:
    columns, changes = history
    canonical = ALIASES.get(policy, policy)
    first_misfit = next(((i, n) for i, row in enumerate(changes) for n, v in sorted(row.items())
                         if n in columns and not documented_fit(v, columns[n])), None)
    try:
        batch, builder = source_batch(columns, changes, policy)
    except SchemaChangeError as error:
        assert canonical in ("exception", "evolve") and first_misfit is not None
        assert error.fields["column"] in columns and error.fields["table"] == "t"
        assert error.fields["value_type"] in VALUES
        return
    assert canonical not in ("exception", "evolve") or first_misfit is None
    rows = batch.to_pylist()
    for row, change in zip(rows, changes, strict=True):
        extra = {k: json_value(v) for k, v in json.loads(row["_extra"] or "{}").items()}
        if "u" in change:  # undeclared: always in _extra, as it was
            assert same(extra.pop("u"), change["u"])
        for name, typ in columns.items():
            value = change.get(name)
            if value is None:
                assert row[name] is None and name not in extra
            elif documented_fit(value, typ):
                stored = float(value) if typ == "double" else (
                    int(value) if typ == "bigint" else value)
                assert same(row[name], stored) and name not in extra
            else:
                assert row[name] is None
                if canonical == "ignore":
                    assert name not in extra
                else:  # kept with its own type
                    assert same(extra.pop(name), value)
        assert not extra or canonical == "ignore" or set(extra) <= set(columns)
    counted = builder.misfits.dropped if canonical == "ignore" else builder.misfits.kept
    assert sum(counted.values()) == sum(
        1 for change in changes for n, v in change.items()
        if n in columns and not documented_fit(v, columns[n]))


def delivered(value: Any, column: str | None) -> Any:
    """A value as the source delivers it: in its column's type where it fits, else as it is."""
    if column is not None and documented_fit(value, column):
        return float(value) if column == "double" else int(value) if column == "bigint" \
            else value
    return value


def as_change_table(batch: pa.RecordBatch) -> pa.Table:
    """The source's batch as the apply sink receives it (a micro-batch's rows)."""
    return pa.Table.from_batches([batch])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=attribute_histories(),
       apply_policy=st.sampled_from(["lenient", "try_evolve", "ignore", "evolve", "exception"]),
       new_table=st.booleans())
def test_every_value_reaches_the_target_or_a_typed_error(
        history: tuple[dict[str, str], list[dict[str, Any]]], apply_policy: str,
        new_table: bool) -> None:
    """The source's default (lenient) output through the apply planner (SCD 2: a version per
    change): under lenient, try_evolve and ignore every value of every change is in the target
    row, in a column or in ``_extra`` with its own type; evolve and exception either do the same
    or raise a ``LakehouseError``; nothing else is ever raised."""
    columns, changes = history
    batch, _ = source_batch(columns, changes, "lenient")
    changes = [{name: delivered(value, columns.get(name)) for name, value in change.items()}
               for change in changes]
    options = ApplyOptions(("id",), scd=2, schema_drift=apply_policy)
    target = None if new_table else pa.schema(
        [pa.field("id", pa.int64(), False), pa.field("a", pa.int32()),
         pa.field("b", pa.float64()), pa.field("c", pa.string()),
         *options.system_fields()])
    try:
        plan = plan_batch(as_change_table(batch), target, options, "t")
    except LakehouseError:
        assert apply_policy in ("evolve", "exception")
        return
    rows = {row["id"]: row for row in upserts(plan)}
    assert len(rows) == len(changes)
    for i, change in enumerate(changes):
        row = rows[i]
        extra = {k: json_value(v) for k, v in json.loads(row.get("_extra") or "{}").items()}
        for name, value in change.items():
            if name in extra:
                assert same(extra[name], value), (name, value, row)
                assert row.get(name) is None
            else:
                assert row.get(name) is not None, (name, value, row)
                stored = row[name]
                if isinstance(stored, float) and isinstance(value, int):
                    assert stored == value and abs(value) <= 2 ** 53
                else:
                    assert same(stored, value), (name, value, row)

