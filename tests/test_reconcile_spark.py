"""``tablestore-cdc reconcile`` against the real pipeline (``tablestore_cdc.pipeline``:
the source into a change log, the change log applied into Delta or Iceberg) on a real local
Spark, while a writer makes inserts, updates and deletes with channel splits and a merge.

Run during the write load, reconcile labels the rows the stream has yet to apply IN-FLIGHT and
finds no other difference; once the pipeline has caught up it finds none; after three rows are
deleted, two changed and one added in the target behind the product's back, it finds exactly
those six, none in flight."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytest.importorskip("polars")

from connector.local import LocalTablestore  # noqa: E402
from tablestore_cdc.demo.writer import DEMO_TABLE, DemoWriter  # noqa: E402
from tablestore_cdc.pipeline import ApplySettings, start_pipeline  # noqa: E402
from tablestore_cdc.reconcile import SourceSpec, reconcile_table  # noqa: E402
from tablestore_cdc.reconcile.errors import TargetMissingError  # noqa: E402
from testkit.reconcile import OrdersTarget, Target, found, settle  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow


def _tamper_orders(target: Target, keys: list[int]) -> tuple[list[int], list[int], int]:
    picked = random.Random(3).sample(keys, 5)
    deleted, changed, added = picked[:3], picked[3:], max(keys) + 100_000
    target.tamper(deleted, changed, added)
    return deleted, changed, added


@pytest.mark.parametrize("kind", ["delta", pytest.param("iceberg", marks=pytest.mark.extended)])
def test_reconcile_during_a_write_load_then_after_tampering(spark: Any, tmp_path: Path,
                                                            kind: str) -> None:
    store_path = tmp_path / "store.db"
    with LocalTablestore(store_path) as store:
        store.create_table(DEMO_TABLE, primary_key=[("order_id", "INTEGER")],
                           columns=[("customer", "STRING"), ("amount", "DOUBLE"),
                                    ("status", "STRING")], channels=4)
    target: Target = (OrdersTarget.delta(tmp_path) if kind == "delta"
                      else OrdersTarget.iceberg(tmp_path))
    endpoint = f"local://{store_path}"
    pipeline = start_pipeline(spark, endpoint, DEMO_TABLE, "replicate", tmp_path / "out",
                              ApplySettings(target.uri), trigger_ms=500)
    spec = SourceSpec(endpoint, DEMO_TABLE)
    with LocalTablestore(store_path) as store:  # a first row, applied before the load starts
        store.put_row(DEMO_TABLE, {"order_id": 0}, {"status": "first"})
    wait_until("the first batch applied", pipeline.applied_batch,
               lambda batch: batch is not None, timeout=180, query=pipeline.state_query)
    writer = DemoWriter(store_path, changes=3000, duration_s=30, seed=9)
    try:
        writer.start()
        in_flight_seen = runs = 0
        while writer.is_alive():
            pipeline.check()
            try:
                report = reconcile_table(spec, target.uri)
            except TargetMissingError:  # before the first batch is applied
                time.sleep(0.5)
                continue
            runs += 1
            assert report.ok, [d for d in report.comparison.differences if not d.in_flight]
            in_flight_seen += report.counts()["IN-FLIGHT"]
            if report.comparison.differences:
                assert report.in_flight is not None and report.in_flight.determined, \
                    report.in_flight
        assert writer.error is None
        assert runs >= 3 and in_flight_seen > 0, (runs, in_flight_seen)
        settle(pipeline, store_path)
        with LocalTablestore(store_path) as store:
            keys = sorted(pk["order_id"] for pk, _ in store.scan(DEMO_TABLE)
                          if pk["order_id"] < 10_000_000)
        report = reconcile_table(spec, target.uri)
        assert report.comparison.differences == [], report.comparison.differences
        assert report.comparison.source_rows == len(keys) + 2
        deleted, changed, added = _tamper_orders(target, keys)
        report = reconcile_table(spec, target.uri)
        assert found(report) == {"MISSING": set(deleted), "EXTRA": {added},
                                 "DIFFERENT": set(changed), "IN-FLIGHT": set()}
        assert report.in_flight is not None and report.in_flight.determined
        assert not report.ok
    finally:
        pipeline.stop()
