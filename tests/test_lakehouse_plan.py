"""The columnar planner (``plan.plan_batch``) against the per-change reference
(``tests/lakehouse_reference.py``) on random change batches with channel splits and merges,
attributes whose type changes, every drift policy, SCD 1 and 2: the same plan, or the same
error."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.schema import to_json
from tablestore_cdc.lakehouse.errors import LakehouseError
from tablestore_cdc.lakehouse.plan import ApplyOptions, ApplyPlan, plan_batch
from testkit.lakehouse import closes, deletes, upserts
from tests import lakehouse_reference as reference

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), False), pa.field("name", pa.string()), pa.field("qty", pa.int64()),
    pa.field("_op", pa.string(), False), pa.field("_channel_id", pa.string(), False),
    pa.field("_sequence", pa.string(), False), pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_before", pa.string()), pa.field("_extra", pa.string()),
])
#: undeclared attributes and the kinds of value each may take
EXTRA_VALUES = {
    "colour": st.sampled_from(["red", "blue", "2024-01-01"]),
    "size": st.one_of(st.integers(-(2 ** 62), 2 ** 62), st.floats(allow_nan=False,
                                                                   allow_infinity=False),
                      st.sampled_from(["large", "7"]), st.just(2 ** 53 + 1)),
    "flag": st.booleans(),
    "blob": st.binary(max_size=4),
}
#: values of another type than the declared column qty (bigint) the source keeps in _extra
MISFITS = st.one_of(st.sampled_from(["7", "x"]), st.floats(allow_nan=False, allow_infinity=False),
                    st.booleans(), st.binary(max_size=3))
TARGETS = {
    "new": None,
    "declared": pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()),
                           pa.field("qty", pa.int64())]),
    "narrow": pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()),
                         pa.field("qty", pa.int32()), pa.field("size", pa.float64()),
                         pa.field("_extra", pa.string())]),
    # wider than the source's bigint: a DOUBLE the source kept in _extra fits the column here
    "wide": pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()),
                       pa.field("qty", pa.float64()), pa.field("_extra", pa.string())]),
}
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@st.composite
def change_batches(draw: Any) -> pa.Table:
    """Changes in time order over a channel that splits in two, then merges: parent ``p``,
    children ``c0``/``c1`` (by key), then ``m``; sequences per channel; ties in commit time;
    shuffled, or in key order (distinct keys in order take ``changes.ordered``'s short cut)."""
    n = draw(st.integers(1, 40))
    split_at, merge_at = sorted(draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
    sequences: dict[str, int] = {}
    ts = 0
    rows = []
    for i in range(n):
        key = draw(st.integers(0, 5))
        channel = "p" if i < split_at else f"c{key % 2}" if i < merge_at else "m"
        sequences[channel] = sequences.get(channel, 0) + draw(st.integers(1, 3))
        ts += draw(st.sampled_from([0, 1, 1, 2]))
        op = draw(st.sampled_from(["PUT", "UPDATE", "DELETE"]))
        extra = {} if op == "DELETE" else {
            name: draw(values) for name, values in EXTRA_VALUES.items() if draw(st.booleans())}
        qty = None if op == "DELETE" else draw(st.sampled_from([None, 1, 2 ** 40]))
        if op != "DELETE" and qty is None and draw(st.booleans()):
            # a value of another type than the declared column, as the source sends it: the
            # column null, the value in _extra with its own type (docs/schema.md)
            extra["qty"] = draw(MISFITS)
        rows.append({
            "id": key, "_op": op, "_channel_id": channel,
            "_sequence": f"{sequences[channel]:020d}",
            "_commit_ts": START + dt.timedelta(seconds=ts), "_before": None,
            "name": None if op == "DELETE" else draw(st.sampled_from([None, "a", "b"])),
            "qty": qty,
            "_extra": to_json(extra) if extra else None})
    random.Random(draw(st.integers(0, 1000))).shuffle(rows)
    if draw(st.booleans()):  # in key order, as a first load read by key ranges comes
        rows.sort(key=lambda row: row["id"])
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def as_rows(table_rows: list[dict[str, Any]], schema: pa.Schema) -> list[dict[str, Any]]:
    rows = pa.Table.from_pylist(table_rows, schema=schema).to_pylist()
    return sorted(rows, key=lambda r: repr(sorted(r.items(), key=lambda kv: kv[0])))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=change_batches(), scd=st.sampled_from([1, 2]),
       policy=st.sampled_from(["lenient", "ignore", "evolve", "exception"]),
       soft_delete=st.booleans(), target=st.sampled_from(sorted(TARGETS)),
       widen=st.booleans())
def test_the_columnar_plan_equals_the_per_change_plan(batch: pa.Table, scd: int, policy: str,
                                                      soft_delete: bool, target: str,
                                                      widen: bool) -> None:
    options = ApplyOptions(("id",), scd=scd, schema_drift=policy, widen_to_string=widen,
                           soft_delete_column="_deleted" if soft_delete and scd == 1 else None)
    schema = TARGETS[target]
    if schema is not None and options.system_fields():
        schema = pa.schema([*schema, *options.system_fields()])
    try:
        expected = reference.plan_batch(batch, schema, options, "t")
    except LakehouseError as exc:
        with pytest.raises(type(exc)):
            plan_batch(batch, schema, options, "t")
        return
    plan: ApplyPlan = plan_batch(batch, schema, options, "t")
    layout = plan.layout
    assert (layout.schema, layout.added, layout.promoted) == (
        expected.layout.schema, expected.layout.added, expected.layout.promoted)
    assert as_rows(upserts(plan), layout.schema) == as_rows(expected.upserts, layout.schema)
    assert sorted(deletes(plan)) == sorted(expected.deletes)
    assert closes(plan) == expected.closes
    assert (plan.changes, plan.values_in_extra) == (expected.changes, expected.values_in_extra)
