"""Schema drift on the target side (tablestore_cdc.lakehouse.drift): the lattice, the five
policies on real Delta and Iceberg tables, schema changes recorded, and a crash between a
schema change and its batch's data commit (a real SIGKILL at the sink's crash point)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")

from deltalake import DeltaTable  # noqa: E402

from cdc_common.schema_change import fits, join, promotion, type_fits  # noqa: E402
from tablestore_cdc.lakehouse.drift import iceberg_promotions  # noqa: E402
from tablestore_cdc.lakehouse.errors import (  # noqa: E402
    ColumnTypeConflictError,
    SchemaDriftError,
)
from tablestore_cdc.verify import table_state  # noqa: E402
from testkit.crash_points import environment as crash_environment  # noqa: E402
from testkit.lakehouse import Delta, Iceberg  # noqa: E402
from testkit.processes import REPO  # noqa: E402

UTC = dt.UTC
#: a table created with only a primary key: every attribute arrives in _extra
PK_ONLY = pa.schema([
    pa.field("id", pa.int64(), False),
    pa.field("_op", pa.string(), False), pa.field("_channel_id", pa.string(), False),
    pa.field("_sequence", pa.string(), False), pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_before", pa.string()), pa.field("_extra", pa.string()),
])


def _json(value: Any) -> Any:
    return {"$binary": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def change(op: str, seq: int, id_: int, **attributes: Any) -> dict[str, Any]:
    extra = {k: _json(v) for k, v in attributes.items() if v is not None}
    return {"id": id_, "_op": op, "_channel_id": "c", "_sequence": f"{seq:020d}",
            "_commit_ts": dt.datetime.fromtimestamp(seq, UTC), "_before": None,
            "_extra": json.dumps(extra, sort_keys=True) if extra and op != "DELETE" else None}


def batch(*rows: dict[str, Any], schema: pa.Schema = PK_ONLY) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=schema)


# --- the lattice -------------------------------------------------------------------------------


def test_the_lattice_widens_losslessly_only() -> None:
    i8, i16, i32, i64 = pa.int8(), pa.int16(), pa.int32(), pa.int64()
    f32, f64 = pa.float32(), pa.float64()
    assert all(type_fits(a, b) for a, b in ((i8, i16), (i16, i32), (i32, i64), (i8, i64),
                                            (f32, f64), (i32, f64), (i16, f32)))
    assert not any(type_fits(a, b) for a, b in ((i64, i32), (f64, f32), (i64, f64),
                                                (i32, f32), (f64, i64), (pa.string(), i64),
                                                (i64, pa.string()), (pa.bool_(), i8)))
    assert type_fits(i64, pa.string(), widen_to_string=True)
    # the large variants (Iceberg's Arrow schema) hold what the plain ones hold
    assert type_fits(pa.binary(), pa.large_binary()) and type_fits(pa.string(), pa.large_string())
    # values: an integer into a double column while it is exact there (2^53), not beyond
    assert fits(2 ** 53, f64) and fits(-(2 ** 53), f64) and not fits(2 ** 53 + 1, f64)
    assert fits(2 ** 24, f32) and not fits(2 ** 24 + 1, f32)
    assert fits(127, i8) and not fits(128, i8) and fits(-(2 ** 31), i32)
    assert not fits(3.0, i64) and not fits(True, i64) and not fits(1, pa.bool_())
    assert fits(0.5, f32) and not fits(0.1, f32) and fits(0.1, f64)
    assert not fits(7, pa.string()) and fits(7, pa.string(), widen_to_string=True)
    assert not fits("7", i64) and not fits(b"x", pa.string())
    # the narrowest wider column a value fits
    assert promotion(2 ** 40, i32) == i64 and promotion(300, i8) == i16
    assert promotion(0.5, i32) == f64 and promotion(0.5, i64) is None
    assert promotion(0.1, f32) == f64 and promotion("x", i64) is None
    assert join([i64, f64]) == f64 and join([i32, i64]) == i64 and join([i64, pa.string()]) is None
    # what Iceberg promotes in place; Delta (delta-rs) nothing
    assert iceberg_promotions(i32, i64) and iceberg_promotions(f32, f64)
    assert not iceberg_promotions(i64, f64) and not iceberg_promotions(i32, f64)


# --- the policies on real tables --------------------------------------------------------------


STREAM = [
    # a primary-key-only table: qty changes type twice (INTEGER, STRING, DOUBLE), three
    # attributes appear mid-stream, one stops appearing, one is deleted from a row
    [change("PUT", 1, 1, qty=1, name="a"), change("PUT", 2, 2, qty=2, name="b")],
    [change("PUT", 3, 3, qty="three", name="c", colour="red"),
     change("UPDATE", 4, 1, qty=4, name="a", size=7, flag=True)],
    [change("PUT", 5, 4, qty=5.5, blob=b"\x00\x01", colour="blue"),
     change("UPDATE", 6, 2, qty=6),  # name deleted from the row: null in the target
     change("DELETE", 7, 3)],
    [change("PUT", 8, 5, qty=2 ** 60, size=9)],  # colour no longer appears
]


def expected_state() -> dict[str, dict[str, Any]]:
    state: dict[int, dict[str, Any]] = {}
    for rows in STREAM:
        for row in rows:
            if row["_op"] == "DELETE":
                state.pop(row["id"], None)
            else:
                values = json.loads(row["_extra"])
                state[row["id"]] = {k: (base64.b64decode(v["$binary"]) if isinstance(v, dict)
                                        else v) for k, v in values.items()}
    return {json.dumps({"id": k}): v for k, v in state.items()}


def _state(target: Delta | Iceberg) -> dict[str, dict[str, Any]]:
    state = table_state(target.rows(), ["id"])
    for values in state.values():
        if isinstance(values.get("blob"), dict):  # _extra's typed JSON form of BINARY
            values["blob"] = base64.b64decode(values["blob"]["$binary"])
    return state


@pytest.mark.parametrize("scd", [1, 2])
def test_the_default_replicates_a_primary_key_only_table_with_every_value(target, scd) -> None:
    """Default policy (lenient): the first batch creates columns for the attributes, values of
    another type are kept typed in _extra, nothing is dropped, nothing fails."""
    sink = target.sink(scd=scd)
    results = [sink.apply(batch(*rows), "q", i) for i, rows in enumerate(STREAM)]
    assert _state(target) == expected_state()
    rows = target.rows()
    columns = set(rows[0])
    assert {"qty", "name", "colour", "size", "flag", "blob", "_extra"} <= columns
    live = {r["id"]: r for r in rows if r.get("__END_AT") is None}
    assert live[1]["qty"] == 4 and live[1]["size"] == 7 and live[1]["flag"] is True
    assert live[2]["name"] is None and live[2]["qty"] == 6  # deleted attribute: null
    assert json.loads(live[4]["_extra"]) == {"qty": 5.5}  # a double in a long column
    assert live[5]["qty"] == 2 ** 60 and live[5]["_extra"] is None  # int64 holds it
    assert live[5]["colour"] is None
    assert results[0].schema_changes == ()  # created with its columns, not evolved
    assert results[1].schema_changes == (
        "add column colour string", "add column flag bool", "add column size int64",
        "add column _extra string")
    assert results[1].values_in_extra == 1 and results[2].values_in_extra == 1
    assert results[2].schema_changes == ("add column blob binary",)
    assert results[3].schema_changes == ()  # colour stopped appearing: kept, never dropped


def test_exception_and_evolve_fail_naming_the_change_and_change_nothing(target) -> None:
    sink = target.sink(schema_drift="exception")
    sink.apply(batch(*STREAM[0]), "q", 0)  # the new table takes the first batch's attributes
    before = (target.commits(), target.rows())
    with pytest.raises(SchemaDriftError, match=r"at 00000000000000000003 carries new "
                       r"column\(s\) \['colour'\] .*schema_drift=exception"):
        sink.apply(batch(*STREAM[1]), "q", 1)
    evolve = target.sink(schema_drift="evolve")
    with pytest.raises(ColumnTypeConflictError, match=(
            "column 'qty' is int64 but the change in channel 'c' at 00000000000000000003 "
            "carries string .'three'., .*schema_drift=evolve")):
        evolve.apply(batch(*STREAM[1]), "q", 1)
    assert (target.commits(), target.rows()) == before
    # a replay of the same batch under lenient delivers it (the restart with another policy)
    assert target.sink().apply(batch(*STREAM[1]), "q", 1).committed


def test_ignore_keeps_the_columns_and_every_other_value_in_extra(target) -> None:
    sink = target.sink(schema_drift="ignore")
    for i, rows in enumerate(STREAM):
        assert sink.apply(batch(*rows), "q", i).schema_changes == ()
    assert _state(target) == expected_state()
    assert set(target.rows()[0]) == {"id", "_extra"}


WIDE = pa.schema([PK_ONLY.field("id"), pa.field("n", pa.int32()), pa.field("x", pa.float32()),
                  *[f for f in PK_ONLY if f.name != "id"]])


def wide_change(seq: int, id_: int, n: int, x: float) -> dict[str, Any]:
    return {**change("PUT", seq, id_), "n": n, "x": x}


def test_iceberg_promotes_int_to_long_and_float_to_double_delta_keeps_them_in_extra(
        target) -> None:
    """Declared int32/float32 columns, then values only a long / a double holds."""
    sink = target.sink()
    sink.apply(batch(wide_change(1, 1, 5, 0.5), schema=WIDE), "q", 0)
    wider = pa.schema([pa.field("n", pa.int64()) if f.name == "n" else
                       pa.field("x", pa.float64()) if f.name == "x" else f for f in WIDE])
    result = sink.apply(batch(wide_change(2, 2, 2 ** 40, 0.1), schema=wider), "q", 1)
    rows = {r["id"]: r for r in target.rows()}
    if target.name == "iceberg":
        assert result.schema_changes == ("widen column n int32 -> int64",
                                         "widen column x float -> double")
        assert (rows[2]["n"], rows[2]["x"], rows[1]["n"]) == (2 ** 40, 0.1, 5)
    else:  # delta-rs cannot widen a column: the values wait, typed, in _extra
        assert result.schema_changes == ("add column _extra string",)
        assert (rows[2]["n"], json.loads(rows[2]["_extra"])) == (None, {"n": 2 ** 40, "x": 0.1})
        with pytest.raises(ColumnTypeConflictError, match="cannot widen the column in place"):
            target.sink(schema_drift="evolve").apply(
                batch(wide_change(3, 3, 2 ** 40, 0.5), schema=wider), "q", 2)
    assert table_state(target.rows(), ["id"])['{"id": 2}'] == {"n": 2 ** 40, "x": 0.1}


def test_integers_go_into_a_double_column_while_exact(target) -> None:
    sink = target.sink()
    sink.apply(batch(change("PUT", 1, 1, price=1.5)), "q", 0)
    sink.apply(batch(change("PUT", 2, 2, price=3), change("PUT", 3, 3, price=2 ** 53 + 1)),
               "q", 1)
    rows = {r["id"]: r for r in target.rows()}
    assert rows[2]["price"] == 3.0 and rows[2]["_extra"] is None
    assert rows[3]["price"] is None and json.loads(rows[3]["_extra"]) == {"price": 2 ** 53 + 1}


def test_any_value_into_a_string_column_only_when_asked(target) -> None:
    sink = target.sink(widen_to_string=True)
    sink.apply(batch(change("PUT", 1, 1, tag="x")), "q", 0)
    sink.apply(batch(change("PUT", 2, 2, tag=5), change("PUT", 3, 3, tag=True, mixed=1),
                     change("PUT", 4, 4, mixed="m")), "q", 1)
    rows = {r["id"]: r for r in target.rows()}
    assert [rows[i]["tag"] for i in (1, 2, 3)] == ["x", "5", "true"]
    assert (rows[3]["mixed"], rows[4]["mixed"]) == ("1", "m")  # a new column of mixed kinds
    assert all(r.get("_extra") is None for r in rows.values())


def test_schema_changes_are_recorded_in_the_tables_history_and_logged(target, caplog) -> None:
    sink = target.sink()
    sink.apply(batch(*STREAM[0]), "q", 0)
    with caplog.at_level(logging.INFO, logger="tablestore_cdc.lakehouse"):
        sink.apply(batch(*STREAM[1]), "q", 1)
    lines = [r.getMessage() for r in caplog.records if "schema change" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith(
        "schema change by batch 1: add column colour string; add column flag bool; add column "
        "size int64; add column _extra string")
    recorded = "add column colour string; add column flag bool; add column size int64; " \
               "add column _extra string"
    if target.name == "delta":
        history = DeltaTable(target.path).history()
        changes = [h for h in history if "tablestore-cdc.schema-changes" in h]
        assert [(h["tablestore-cdc.schema-changes"], h["tablestore-cdc.schema-change-of-batch"])
                for h in changes] == [(recorded, "q/1")]
        # only the data commit names the batch as applied (reconcile reads that)
        assert "tablestore-cdc.batch-id" not in changes[0]
    else:
        from pyiceberg.catalog import load_catalog

        table = load_catalog("tablestore_cdc", **target.properties).load_table("cdc.orders")
        summaries = [s.summary for s in table.metadata.snapshots]
        # the batch's snapshots (its delete and its append) are one catalog commit
        assert {s.get("tablestore-cdc.schema-changes") for s in summaries
                if s.get("tablestore-cdc.schema-changes")} == {recorded}


# --- a crash between the schema change and the data ------------------------------------------

APPLY_SCRIPT = """
import sys, pyarrow as pa
from testkit.lakehouse import Delta, Iceberg
from pathlib import Path
target = (Delta if sys.argv[1] == "delta" else Iceberg)(Path(sys.argv[2]))
batch = pa.ipc.open_file(sys.argv[3]).read_all()
target.sink().apply(batch, "q", 1)
"""


def test_a_kill_between_the_schema_change_and_the_data_commit_replays_exactly(
        target, tmp_path) -> None:
    """SIGKILL at the sink's ``after_schema_change`` crash point (Delta: after the schema
    commit, before the data's; Iceberg: both are one catalog commit), then the batch again."""
    sink = target.sink()
    sink.apply(batch(*STREAM[0]), "q", 0)
    second = batch(*STREAM[1])
    path = tmp_path / "batch.arrow"
    with pa.ipc.new_file(path, second.schema) as writer:
        writer.write_table(second)
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / "arm-after_schema_change").write_text("park")
    env = {**os.environ, **crash_environment(faults, str(REPO))}
    process = subprocess.Popen([sys.executable, "-c", APPLY_SCRIPT, target.name,
                                str(tmp_path), str(path)], cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (faults / "hit-after_schema_change").exists():
            assert process.poll() is None, "the apply ended before its crash point"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    columns = set(target.rows()[0])
    assert ("colour" in columns) == (target.name == "delta")  # Delta: the schema commit is in
    assert sink.committed_batch("q") == 0
    result = sink.apply(second, "q", 1)  # Spark's replay of the batch
    assert result.committed
    state = _state(target)
    assert state == {'{"id": 1}': {"qty": 4, "name": "a", "size": 7, "flag": True},
                     '{"id": 2}': {"qty": 2, "name": "b"},
                     '{"id": 3}': {"qty": "three", "name": "c", "colour": "red"}}
    assert sink.apply(second, "q", 1).committed is False  # and once only
