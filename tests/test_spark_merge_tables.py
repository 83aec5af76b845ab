"""The Spark engine on a selection of tables (``replicate --tables --engine spark``): the
multi-table pipeline's generic rows typed by Spark (lakehouse/spark_rows.py) and merged by
delta-spark (lakehouse/spark_merge.py), two tables of an embedded store, two batches and a
replayed one, a table refused by its target (another job's) held and resumed by Spark after a
restart that adopts it; each Delta table equal to the source and to the embedded engine's
table row for row.

The pipeline runs in a process of its own (testkit/spark_merge_run.py), as tests/
test_spark_merge.py explains, on the PySpark of ``.venv-spark-merge`` (4.1: both jars, but
replicate's Spark engine writes Delta targets only, so this path is tested on Delta). The
embedded engine's tables are written here from the same change log, without Spark."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connector.generic_rows import MULTI_TABLE_SCHEMA
from connector.local import LocalTablestore
from connector.spark_compat import arrow_schema
from tablestore_cdc.lakehouse.ownership import JOB_PROPERTY, Marker
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.multi_table import MultiTableApply
from testkit.spark_merge_run import ROOT, SPARK_MERGE_PYTHON

deltalake = pytest.importorskip("deltalake")

#: each table's key and declared columns
TABLES = {"t1": (("id",), ("s", "d", "b", "bin")), "t2": (("region", "n"), ("v",))}


def _b64(value: bytes) -> dict[str, str]:
    return {"base64": base64.b64encode(value).decode()}


#: batch 0: new rows; batch 1: updates of some columns, deletes, a key deleted and put again,
#: a delete of a key never written, new keys
WRITES = [
    [["t1", "put", {"id": i}, {"s": f"s{i} ✓", "d": i * 0.5, "b": i % 2 == 0,
                               "bin": _b64(bytes([i, 255 - i]))}] for i in range(12)]
    + [["t2", "put", {"region": r, "n": n}, {"v": f"{r}{n}"}] for r in ("eu", "us")
       for n in range(4)],
    [["t1", "update", {"id": i}, {"s": f"updated {i}", "bin": None}] for i in range(0, 12, 3)]
    + [["t1", "delete", {"id": i}, None] for i in (1, 5, 99)]
    + [["t1", "put", {"id": 5}, {"s": "back", "d": -1.25}],
       ["t1", "put", {"id": 20}, {"s": "new", "b": True, "bin": _b64(b"")}],
       ["t2", "delete", {"region": "eu", "n": 2}, None],
       ["t2", "update", {"region": "us", "n": 0}, {"v": None}],
       ["t2", "put", {"region": "ap", "n": 7}, {"v": "ap7"}]],
]


#: t2's target is another job's at first: its batch 0 is held; the restart adopts it
PHASES = [{"writes": WRITES[0]}, {"writes": WRITES[1], "adopt_target": True}]


def _rows(path: Path, table: str) -> list[dict[str, Any]]:
    keys, columns = TABLES[table]
    rows = deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(({c: r.get(c) for c in (*keys, *columns)} for r in rows),
                  key=lambda r: tuple(r[k] for k in keys))


def _source(store_path: Path, table: str) -> list[dict[str, Any]]:
    keys, columns = TABLES[table]
    with LocalTablestore(store_path) as store:
        rows = [{**pk, **{c: attrs.get(c) for c in columns}} for pk, attrs in store.scan(table)]
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


@pytest.mark.slow
@pytest.mark.xdist_group("spark_merge")
def test_spark_engine_applies_a_selection_of_tables_as_the_embedded_engine(
        tmp_path: Path) -> None:
    if not Path(SPARK_MERGE_PYTHON).exists():
        pytest.skip(f"no {SPARK_MERGE_PYTHON}: make .venv-spark-merge/.jars-stamp "
                    "prepares it")
    store_path, out = tmp_path / "store.db", tmp_path / "out"
    with LocalTablestore(store_path) as store:
        store.create_table("t1", [("id", "INTEGER")], [("s", "STRING"), ("d", "DOUBLE"),
                                                       ("b", "BOOLEAN"), ("bin", "BINARY")],
                           channels=2)
        store.create_table("t2", [("region", "STRING"), ("n", "INTEGER")], [("v", "STRING")],
                           channels=1)
    foreign = Marker("local://elsewhere#t2", "another-job", ("region", "n"))
    deltalake.DeltaTable.create(
        str(out / "lake" / "t2"), pa.schema([("region", pa.string()), ("n", pa.int64()),
                                             ("v", pa.string())]),
        configuration=foreign.properties(), raise_if_key_not_exists=False)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"pipeline": {
        "store": str(store_path), "out": str(out), "tables": "t1,t2",
        "target": f"delta://{out}/lake/{{table}}", "phases": PHASES, "replay": True}}))
    proc = subprocess.run([SPARK_MERGE_PYTHON, "-m", "testkit.spark_merge_run", str(spec)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    first, second, replay = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first["t1"]["state"] == "streaming" and first["t1"]["last_batch"] == 0
    assert first["t1"]["rows_applied"] > 0
    assert first["t2"]["state"] == "failed" and first["t2"]["rows_applied"] == 0
    assert list((out / "_held" / "t2").iterdir()) == []  # applied by the restart, removed
    for table in TABLES:
        assert second[table]["state"] == "streaming" and second[table]["last_batch"] == 1
        assert second[table]["rows_applied"] > 0
        # the replayed batch 1 is skipped by the table's own record (Delta's txn)
        assert replay[table]["last_batch"] == 1 and replay[table]["rows_applied"] == 0
        target = out / "lake" / table
        assert deltalake.DeltaTable(str(target)).version() == second[table]["version"]
        assert deltalake.DeltaTable(str(target)).transaction_version(
            _apply_query_id(out)) == 1
    assert list((out / "_tables").iterdir()) == []  # t2 failed no longer
    assert deltalake.DeltaTable(str(out / "lake" / "t2")).metadata().configuration[
        JOB_PROPERTY] == _apply_query_id(out)  # adopted
    # the embedded engine on the same change log (every batch as one) gives the same tables
    log = pq.read_table(out / "changelog")
    log = log.select(MULTI_TABLE_SCHEMA.fieldNames()).cast(arrow_schema(MULTI_TABLE_SCHEMA))
    embedded = MultiTableApply(ApplySettings(f"delta://{tmp_path}/embedded/{{table}}"),
                               "local://store", tmp_path / "embedded")
    embedded.apply_batch(log, "embedded", 0)
    for table in TABLES:
        merged = _rows(out / "lake" / table, table)
        assert merged == _source(store_path, table)
        assert merged == _rows(tmp_path / "embedded" / table, table)
    t1 = {r["id"]: r for r in _rows(out / "lake" / "t1", "t1")}
    assert 1 not in t1 and t1[5]["s"] == "back" and t1[5]["bin"] is None
    assert t1[3]["s"] == "updated 3" and t1[3]["bin"] is None and t1[3]["d"] == 1.5
    assert t1[4]["bin"] == bytes([4, 251]) and t1[20]["bin"] == b""


def _apply_query_id(out: Path) -> str:
    from tablestore_cdc.pipeline.queries import checkpoint_query_id

    query_id = checkpoint_query_id(out / "_checkpoints" / "apply")
    assert query_id is not None
    return query_id
