"""The Spark engine on a selection of tables (``replicate --tables --engine spark``): the
multi-table pipeline's generic rows typed by Spark (lakehouse/spark_rows.py) and merged by
delta-spark or Iceberg's runtime (lakehouse/spark_merge.py), three tables of an embedded store
(two into the Delta template, one into an ``iceberg:///WAREHOUSE?table=cdc.{table}`` target of
its own, as ``--config`` gives it), two batches and a replayed one, a table refused by its
target (another job's) held and resumed by Spark after a restart that adopts it; each table
equal to the source and to the embedded engine's table row for row, the Iceberg ones read back
by pyiceberg from the SQLite catalog both engines share.

The pipeline runs in a process of its own (testkit/spark_merge_run.py), as tests/
test_spark_merge.py explains, on the PySpark of ``.venv-spark-merge`` (4.1: both jars, one
session). The embedded engine's tables are written here from the same change log, without
Spark."""

from __future__ import annotations

import base64
import json
import re
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
pytest.importorskip("pyiceberg")

#: each table's key and declared columns
TABLES = {"t1": (("id",), ("s", "d", "b", "bin")), "t2": (("region", "n"), ("v",)),
          "t3": (("k",), ("s", "x"))}
#: the table whose target is Iceberg (``[tables.t3] target``), the others Delta
ICEBERG_TABLE = "t3"


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
       ["t2", "put", {"region": "ap", "n": 7}, {"v": "ap7"}]]
    + [["t3", "update", {"k": f"k{i}"}, {"x": i * 10.0}] for i in (0, 3)]
    + [["t3", "delete", {"k": k}, None] for k in ("k1", "k4", "nope")]
    + [["t3", "put", {"k": "k4"}, {"s": "again"}], ["t3", "put", {"k": "k9"}, {"x": -0.5}]],
]
WRITES[0] += [["t3", "put", {"k": f"k{i}"}, {"s": f"v{i}", "x": i / 4}] for i in range(6)]


#: t2's target is another job's at first: its batch 0 is held; the restart adopts it
PHASES = [{"writes": WRITES[0]}, {"writes": WRITES[1], "adopt_target": True}]


def _iceberg(warehouse: Path, table: str) -> Any:
    """``table`` in the SQLite catalog of ``iceberg:///WAREHOUSE`` (pyiceberg's own SQL
    catalog, named as the embedded sink's and the Spark engine's: ``tablestore_cdc``)."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("tablestore_cdc", uri=f"sqlite:///{warehouse}/catalog.db",
                         warehouse=f"file://{warehouse}")
    return catalog.load_table(f"cdc.{table}")


def _rows(path: Path, table: str) -> list[dict[str, Any]]:
    """``table``'s rows: the Delta table at ``path``, or the Iceberg one of warehouse
    ``path``."""
    keys, columns = TABLES[table]
    rows = (_iceberg(path, table).scan().to_arrow() if table == ICEBERG_TABLE
            else deltalake.DeltaTable(str(path)).to_pyarrow_table()).to_pylist()
    return sorted(({c: r.get(c) for c in (*keys, *columns)} for r in rows),
                  key=lambda r: tuple(r[k] for k in keys))


def _source(store_path: Path, table: str) -> list[dict[str, Any]]:
    keys, columns = TABLES[table]
    with LocalTablestore(store_path) as store:
        rows = [{**pk, **{c: attrs.get(c) for c in columns}} for pk, attrs in store.scan(table)]
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


@pytest.mark.slow
@pytest.mark.xdist_group("spark_merge")
@pytest.mark.extended  # the default suite's Spark engine: test_spark_merge, row for row
@pytest.mark.parametrize("cycle", ["two", "one"])
def test_spark_engine_applies_a_selection_of_tables_as_the_embedded_engine(
        tmp_path: Path, cycle: str) -> None:
    """``cycle`` ``one``: the batch the source reads is applied by Spark in the same query and
    logged as ``changelog/batch-<id>/`` (a folder of Spark's part files). Its replay is
    the crash-point tests' (the commit log is written before the source's commit, so a
    batch is never replayed once the source has committed it)."""
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
        store.create_table("t3", [("k", "STRING")], [("s", "STRING"), ("x", "DOUBLE")],
                           channels=2)
    foreign = Marker("local://elsewhere#t2", "another-job", ("region", "n"))
    deltalake.DeltaTable.create(
        str(out / "lake" / "t2"), pa.schema([("region", pa.string()), ("n", pa.int64()),
                                             ("v", pa.string())]),
        configuration=foreign.properties(), raise_if_key_not_exists=False)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"pipeline": {
        "store": str(store_path), "out": str(out), "tables": "t1,t2,t3",
        "target": f"delta://{out}/lake/{{table}}", "phases": PHASES,
        "replay": cycle == "two", "cycle": cycle,
        "config": {ICEBERG_TABLE: {"target": f"iceberg://{out}/wh?table=cdc.{{table}}"}}}}))
    proc = subprocess.run([SPARK_MERGE_PYTHON, "-m", "testkit.spark_merge_run", str(spec)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    first, second, *replayed = json.loads(proc.stdout.strip().splitlines()[-1])
    replay = replayed[0] if replayed else second  # one cycle: no replay, its figures stay
    assert first["t1"]["state"] == "streaming" and first["t1"]["last_batch"] == 0
    assert first["t1"]["rows_applied"] > 0
    assert first["t2"]["state"] == "failed" and first["t2"]["rows_applied"] == 0
    assert list((out / "_held" / "t2").iterdir()) == []  # applied by the restart, removed
    query_id = _apply_query_id(out)
    for table in TABLES:
        assert second[table]["state"] == "streaming" and second[table]["last_batch"] == 1
        assert second[table]["rows_applied"] > 0
        # the replayed batch 1 is skipped by the table's own record (Delta's txn, Iceberg's
        # snapshot summary)
        assert replay[table]["last_batch"] == 1
        assert replay[table]["rows_applied"] == (0 if replayed else second[table]["rows_applied"])
        if table == ICEBERG_TABLE:
            snapshots = _iceberg(out / "wh", table).snapshots()
            assert second[table]["version"] == snapshots[-1].snapshot_id
            marked = [s.summary.additional_properties for s in snapshots]
            assert [int(m["tablestore-cdc.batch-id"]) for m in marked
                    if m.get("tablestore-cdc.query-id") == query_id] == [0, 1]
            continue
        target = out / "lake" / table
        assert deltalake.DeltaTable(str(target)).version() == second[table]["version"]
        assert deltalake.DeltaTable(str(target)).transaction_version(
            _apply_query_id(out)) == 1
    assert list((out / "_tables").iterdir()) == []  # t2 failed no longer
    assert deltalake.DeltaTable(str(out / "lake" / "t2")).metadata().configuration[
        JOB_PROPERTY] == _apply_query_id(out)  # adopted
    if cycle == "one":  # a folder per batch the query read, nothing else
        logged = sorted(p.name for p in (out / "changelog").iterdir())
        assert len(logged) >= 2 and all(re.fullmatch(r"batch-\d{12}", n) for n in logged), logged
    # the embedded engine on the same change log (every batch as one) gives the same tables
    log = pq.read_table(out / "changelog")
    log = log.select(MULTI_TABLE_SCHEMA.fieldNames()).cast(arrow_schema(MULTI_TABLE_SCHEMA))
    settings = ApplySettings(f"delta://{tmp_path}/embedded/{{table}}")
    iceberg = ApplySettings(f"iceberg://{tmp_path}/embedded/wh?table=cdc.{{table}}")
    embedded = MultiTableApply(settings, "local://store", tmp_path / "embedded",
                               per_table=lambda t: (iceberg if t == ICEBERG_TABLE
                                                    else settings, None))
    embedded.apply_batch(log, "embedded", 0)
    for table in TABLES:
        iceberg_table = table == ICEBERG_TABLE
        merged = _rows(out / "wh" if iceberg_table else out / "lake" / table, table)
        assert merged == _source(store_path, table)
        assert merged == _rows(tmp_path / "embedded" / ("wh" if iceberg_table else table),
                               table)
    t1 = {r["id"]: r for r in _rows(out / "lake" / "t1", "t1")}
    assert 1 not in t1 and t1[5]["s"] == "back" and t1[5]["bin"] is None
    assert t1[3]["s"] == "updated 3" and t1[3]["bin"] is None and t1[3]["d"] == 1.5
    assert t1[4]["bin"] == bytes([4, 251]) and t1[20]["bin"] == b""
    t3 = {r["k"]: r for r in _rows(out / "wh", "t3")}
    assert sorted(t3) == ["k0", "k2", "k3", "k4", "k5", "k9"]
    assert t3["k3"] == {"k": "k3", "s": "v3", "x": 30.0}
    assert t3["k4"] == {"k": "k4", "s": "again", "x": None}
    assert _iceberg(out / "wh", "t3").properties[JOB_PROPERTY] == query_id


def _apply_query_id(out: Path) -> str:
    from tablestore_cdc.pipeline.queries import checkpoint_query_id

    query_id = checkpoint_query_id(out)
    assert query_id is not None
    return query_id
