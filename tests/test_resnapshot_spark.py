"""A re-snapshot repairs the target while the stream runs (``tablestore_cdc.resnapshot``), on
the real pipeline (a real local Spark, the embedded store, Delta or Iceberg) under a write
load: three rows deleted, two changed and one added in the target behind the product's back are
repaired by the job between two of its batches; reconcile then reports zero differences."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytest.importorskip("polars")

from connector.local import LocalTablestore  # noqa: E402
from meta_store.signals import Signal, SignalState  # noqa: E402
from tablestore_cdc.demo.writer import DEMO_TABLE, DemoWriter  # noqa: E402
from tablestore_cdc.pipeline import ApplySettings, start_pipeline  # noqa: E402
from tablestore_cdc.reconcile import SourceSpec, reconcile_table  # noqa: E402
from tablestore_cdc.resnapshot.command import open_board  # noqa: E402
from testkit.reconcile import BASE, OrdersTarget, found, make_orders, settle  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow

@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_resnapshot_during_a_write_load_repairs_six_differences(spark: Any, tmp_path: Path,
                                                                   kind: str) -> None:
    store_path = tmp_path / "store.db"
    make_orders(store_path)
    target = OrdersTarget.delta(tmp_path) if kind == "delta" else OrdersTarget.iceberg(tmp_path)
    endpoint = f"local://{store_path}"
    pipeline = start_pipeline(spark, endpoint, DEMO_TABLE, "replicate", tmp_path / "out",
                              ApplySettings(target.uri), trigger_ms=500)
    spec = SourceSpec(endpoint, DEMO_TABLE)
    try:
        wait_until("the first rows applied", pipeline.applied_batch,
                   lambda batch: batch is not None, timeout=180, query=pipeline.state_query)
        settle(pipeline, store_path)
        deleted, changed, added = [BASE + 1, BASE + 2, BASE + 3], [BASE + 5, BASE + 6], BASE + 99
        target.tamper(deleted, changed, added)
        report = reconcile_table(spec, target.uri)
        assert found(report) == {"MISSING": set(deleted), "EXTRA": {added},
                                 "DIFFERENT": set(changed), "IN-FLIGHT": set()}
        writer = DemoWriter(store_path, changes=1200, duration_s=15, seed=5)
        writer.start()
        time.sleep(2.0)  # the load runs: the repair's comparison sees rows in flight
        with open_board(spec) as board:
            signal = board.add(Signal(table=DEMO_TABLE))
            done = wait_until(
                "the job ran the resnapshot",
                lambda: next(s for s in board.signals() if s.id == signal.id),
                lambda s: s.finished, timeout=180, query=pipeline.state_query)
        assert done.state is SignalState.DONE, done
        counts = done.counts  # the six tampered rows, and the writer's keys in flight
        assert counts["upserts"] + counts["deletes"] == counts["differences"], done
        assert counts["differences"] - counts["in_flight"] == 6 and counts["deletes"] >= 1, done
        assert writer.is_alive() or writer.written == 1200
        writer.join()
        assert writer.error is None
        settle(pipeline, store_path)
        report = reconcile_table(spec, target.uri)
        assert report.comparison.differences == [], report.comparison.differences
        assert report.in_flight is None  # no difference: no in-flight read needed
    finally:
        pipeline.stop()


@pytest.mark.parametrize("policy", ["resnapshot", "fail"])
def test_a_stream_restarted_after_its_changes_were_trimmed(spark: Any, tmp_path: Path,
                                                           policy: str) -> None:
    """Stopped, its source changed and the change log trimmed, restarted: with
    ``onDataLoss=resnapshot`` the source records a signal and goes on, the job repairs the
    target, reconcile reports zero; with ``fail`` the query stops on the typed error."""
    store_path = tmp_path / "store.db"
    make_orders(store_path)
    target = OrdersTarget.delta(tmp_path)
    endpoint = f"local://{store_path}"
    spec = SourceSpec(endpoint, DEMO_TABLE)
    first = start_pipeline(spark, endpoint, DEMO_TABLE, "replicate", tmp_path / "out",
                           ApplySettings(target.uri), trigger_ms=500)
    try:
        wait_until("the first rows applied", first.applied_batch,
                   lambda batch: batch is not None, timeout=180, query=first.state_query)
        first.drain()
    finally:
        first.stop()
    with LocalTablestore(store_path) as store:  # while the stream is stopped
        for key in (BASE + 1, BASE + 2, BASE + 3):
            store.delete_row(DEMO_TABLE, {"order_id": key})
        for key in (BASE + 5, BASE + 6):
            store.update_row(DEMO_TABLE, {"order_id": key}, {"status": "changed"})
        store.put_row(DEMO_TABLE, {"order_id": BASE + 99}, {"status": "added"})
        assert store.trim_history(DEMO_TABLE, keep_last=0) > 0
        store.put_row(DEMO_TABLE, {"order_id": BASE + 200}, {"status": "after the trim"})
    pipeline = start_pipeline(spark, endpoint, DEMO_TABLE, "replicate", tmp_path / "out",
                              ApplySettings(target.uri), options={"onDataLoss": policy},
                              trigger_ms=500)
    try:
        if policy == "fail":
            error = wait_until("the query to stop on the lost records",
                               pipeline.changelog.exception, lambda e: e is not None,
                               timeout=180)
            assert "change(s) are lost" in str(error) and "TrimmedDataError" in str(error)
            return
        with open_board(spec) as board:
            done = wait_until("the job ran the resnapshot the source recorded",
                              board.signals, lambda s: bool(s) and s[0].finished,
                              timeout=180, query=pipeline.state_query)[0]
        assert done.state is SignalState.DONE and done.origin == "data-loss", done
        assert "every difference repaired" in done.note, done
        settle(pipeline, store_path)
        report = reconcile_table(spec, target.uri)
        assert report.comparison.differences == [], report.comparison.differences
    finally:
        pipeline.stop()
