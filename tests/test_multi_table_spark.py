"""Many tables in one application (real Spark, real SQLite, real Delta tables): tables picked by
globs, a table created and one dropped while it runs, splits and a merge, a restart; a table
whose target refuses a batch fails alone and resumes exactly after a restart with the fixed
setting (docs/multi-table.md)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from connector.local import LocalTablestore
from connector.table_state import State, TableState
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.metrics import TableMetrics
from tablestore_cdc.pipeline.multi_table import (
    Pipeline,
    start_pipeline,
)
from testkit.waiting import wait_until

pytestmark = pytest.mark.slow
deltalake = pytest.importorskip("deltalake")


def _target_rows(path: Path, keys: tuple[str, ...], columns: tuple[str, ...]) -> dict:
    table = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    return {tuple(r[k] for k in keys): {c: r.get(c) for c in columns}
            for r in table.to_pylist()}


def _source_rows(store: LocalTablestore, table: str, keys: tuple[str, ...],
                 columns: tuple[str, ...]) -> dict:
    return {tuple(pk[k] for k in keys): {c: attrs.get(c) for c in columns}
            for pk, attrs in store.scan(table)}


def _write(store: LocalTablestore, table: str, first: int, count: int) -> None:
    for i in range(first, first + count):
        store.put_row(table, {"id": i}, {"v": f"{table}-{i}", "n": i * 1.5})
    for i in range(first, first + count, 3):
        store.update_row(table, {"id": i}, {"v": f"updated-{i}"})
    for i in range(first + 1, first + count, 5):
        store.delete_row(table, {"id": i})


def _applied(pipeline: Pipeline, table: str, store_path: Path, out: Path) -> bool:
    """Is every row of ``table`` in its target?"""
    target = out / "lake" / table
    if not (target / "_delta_log").exists():
        return False
    with LocalTablestore(store_path) as store:
        expected = _source_rows(store, table, ("id",), ("v", "n"))
    return _target_rows(target, ("id",), ("v", "n")) == expected


def _scrape(pipeline: Pipeline) -> str:
    metrics = TableMetrics()
    metrics.update(pipeline.table_statuses("out", "t*,other"))
    port = metrics.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return answer.read().decode()
    finally:
        metrics.close()


def _start(spark: Any, store_path: Path, out: Path, drift: str = "lenient",
           options: dict[str, str] | None = None) -> Pipeline:
    return start_pipeline(
        spark, f"local://{store_path}", "t*,other", "replicate", out,
        ApplySettings(f"delta://{out}/lake/{{table}}", schema_drift=drift), exclude="tx*",
        options={"tables.refreshIntervalMs": "1000", **(options or {})}, trigger_ms=300)


#: the restart reads ``qty`` as an INTEGER column (the vendor's catalog), ``other`` dropping
#: the values of another type (its own ``schema.change.behavior``), the others keeping them
#: in ``_extra`` (the default, lenient)
RESTART_OPTIONS = {"catalog": '{"columns": {"id": {"type": "long"}, "qty": {"type": "long"}}}',
                   "tables.options": json.dumps({"other": {"schema.change.behavior": "ignore"}})}


def _misfit_row(out: Path, table: str) -> dict | None:
    """The target's row 999, whose ``qty`` is a STRING in the source (None: not applied)."""
    target = out / "lake" / table
    table_rows = deltalake.DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    return next((r for r in table_rows if r["id"] == 999), None)


def test_tables_come_and_go_in_one_query_and_a_restart_resumes_them(spark: Any,
                                                                     tmp_path: Path) -> None:
    store_path, out = tmp_path / "store.db", tmp_path / "out"
    with LocalTablestore(store_path) as store:
        for name in ("t1", "t2", "t3", "other", "tx_skipped"):
            store.create_table(name, [("id", "INTEGER")], [("v", "STRING"), ("n", "DOUBLE")],
                               channels=2)
            _write(store, name, 0, 40)
        children = store.split_channel("t1", store.list_channels("t1")[0].channel_id)
    pipeline = _start(spark, store_path, out)
    try:
        for table in ("t1", "t2", "t3", "other"):
            wait_until(f"{table} applied", lambda t=table: _applied(pipeline, t, store_path, out),
                       lambda ok: ok, timeout=180, query=pipeline.state_query)
        assert not (out / "lake" / "tx_skipped").exists()  # excluded
        with LocalTablestore(store_path) as store:
            _write(store, "t1", 40, 30)  # after a split: children then a merge
            store.merge_channels("t1", *children)
            _write(store, "t1", 70, 20)
            store.create_table("t4", [("id", "INTEGER")], [("v", "STRING"), ("n", "DOUBLE")],
                               channels=2)
            _write(store, "t4", 0, 30)  # existing rows before the query sees the table
            t3_before_drop = _source_rows(store, "t3", ("id",), ("v", "n"))
            store.drop_table("t3")
        for table in ("t1", "t4"):
            wait_until(f"{table} applied", lambda t=table: _applied(pipeline, t, store_path, out),
                       lambda ok: ok, timeout=180, query=pipeline.state_query)
        wait_until("t3 reported dropped", pipeline.table_states,
                   lambda states: states.get("t3") == TableState(State.DROPPED), timeout=60)
    finally:
        pipeline.stop()
    # a restart resumes every table; the dropped one stays stopped, its target kept
    with LocalTablestore(store_path) as store:
        _write(store, "t2", 100, 20)
        _write(store, "t4", 100, 20)
        for table in ("t2", "other"):  # a value of another type than its (catalog) column
            store.put_row(table, {"id": 999}, {"v": "misfit", "n": 9.5, "qty": "many"})
    pipeline = _start(spark, store_path, out, options=RESTART_OPTIONS)
    try:
        for table in ("t1", "t2", "t4", "other"):
            wait_until(f"{table} applied", lambda t=table: _applied(pipeline, t, store_path, out),
                       lambda ok: ok, timeout=180, query=pipeline.state_query)
        pipeline.drain()
        assert _target_rows(out / "lake" / "t3", ("id",), ("v", "n")) == t3_before_drop
        assert pipeline.table_states().get("t3") == TableState(State.DROPPED)
        kept, dropped = _misfit_row(out, "t2"), _misfit_row(out, "other")
        assert kept is not None and dropped is not None
        # lenient: the STRING reaches the target (the table had no qty column: a new string
        # column holds it); ignore, other's own policy: the value is gone
        assert kept["qty"] == "many" and kept["v"] == "misfit"
        assert dropped["v"] == "misfit" and "many" not in str(dropped)
    finally:
        pipeline.stop()


def test_a_table_refused_by_its_target_fails_alone_and_resumes_after_a_fixed_restart(
        spark: Any, tmp_path: Path) -> None:
    store_path, out = tmp_path / "store.db", tmp_path / "out"
    with LocalTablestore(store_path) as store:
        for name in ("t_good", "t_drifts"):
            store.create_table(name, [("id", "INTEGER")], [("v", "STRING"), ("n", "DOUBLE")],
                               channels=2)
            _write(store, name, 0, 20)
    pipeline = _start(spark, store_path, out, drift="exception")
    try:
        for table in ("t_good", "t_drifts"):
            wait_until(f"{table} applied", lambda t=table: _applied(pipeline, t, store_path, out),
                       lambda ok: ok, timeout=180, query=pipeline.state_query)
        with LocalTablestore(store_path) as store:  # an attribute the target has no column for
            store.put_row("t_drifts", {"id": 500}, {"v": "new", "colour": "red"})
            _write(store, "t_drifts", 20, 10)
        wait_until("t_drifts failed", pipeline.table_states,
                   lambda states: _state(states, "t_drifts") is State.FAILED, timeout=120,
                   query=pipeline.state_query)
        with LocalTablestore(store_path) as store:  # the other table keeps delivering
            _write(store, "t_good", 20, 20)
            _write(store, "t_drifts", 30, 10)
        wait_until("t_good applied", lambda: _applied(pipeline, "t_good", store_path, out),
                   lambda ok: ok, timeout=180, query=pipeline.state_query)
        pipeline.drain()
        assert not _applied(pipeline, "t_drifts", store_path, out)
        assert "colour" in (pipeline.table_states()["t_drifts"].reason or "")
        scraped = _scrape(pipeline)  # the operator's view: Prometheus over HTTP
        assert 'tablestore_cdc_table_state{state="failed",table="t_drifts"} 1.0' in scraped
        assert 'tablestore_cdc_table_state{state="streaming",table="t_good"} 1.0' in scraped
        assert 'tablestore_cdc_table_rows_applied_total{table="t_good"}' in scraped
        # a number (the lag the last progress report carried: it may trail the drain)
        assert re.search(r'tablestore_cdc_table_lag_records\{table="t_good"\} \d', scraped)
    finally:
        pipeline.stop()
    pipeline = _start(spark, store_path, out, drift="lenient")  # the fixed setting
    try:
        assert pipeline.apply.tables["t_drifts"].state == "streaming"
        wait_until("t_drifts resumed", lambda: _applied(pipeline, "t_drifts", store_path, out),
                   lambda ok: ok, timeout=180, query=pipeline.state_query)
        table = deltalake.DeltaTable(str(out / "lake" / "t_drifts")).to_pyarrow_table()
        assert {r["id"]: r["colour"] for r in table.to_pylist()}[500] == "red"
        assert not list((out / "_held" / "t_drifts").glob("*.parquet"))
    finally:
        pipeline.stop()


def _state(states: dict[str, TableState], table: str) -> State | None:
    """``table``'s state's name in ``Pipeline.table_states`` (None: not there)."""
    known = states.get(table)
    return None if known is None else known.state
