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
from testkit.reconcile import DeltaTarget, IcebergTarget, Target, found  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow


def _tamper_orders(target: Target, keys: list[int]) -> tuple[list[int], list[int], int]:
    picked = random.Random(3).sample(keys, 5)
    deleted, changed, added = picked[:3], picked[3:], max(keys) + 100_000
    target.tamper(deleted, changed, added)
    return deleted, changed, added


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
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
        pipeline.drain()
        # the target's applied position trails its newest batch by up to one apply batch: a
        # write to a new key, applied, twice, moves it past every change of the load
        with LocalTablestore(store_path) as store:
            for extra in (1, 2):
                store.put_row(DEMO_TABLE, {"order_id": 10_000_000 + extra}, {"status": "x"})
                pipeline.drain()
                time.sleep(1.0)
                pipeline.drain()
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


class OrdersTarget:
    """The test targets of tests/test_reconcile.py on the demo's ``orders`` table."""

    @staticmethod
    def delta(root: Path) -> Target:
        return _Orders(DeltaTarget(root))

    @staticmethod
    def iceberg(root: Path) -> Target:
        target = IcebergTarget(root)
        target.uri = target.uri.replace("cdc.t", "cdc.orders")
        target.table = _iceberg_table(target)  # type: ignore[method-assign]
        return _Orders(target)


def _iceberg_table(target: IcebergTarget) -> Any:
    def table() -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("tablestore_cdc", **target.props).load_table("cdc.orders")
    return table


class _Orders(Target):
    """A test target whose key is ``order_id`` and whose columns are the demo's: the delete,
    change and add of ``Target.tamper`` done with those names."""

    def __init__(self, inner: Target) -> None:
        super().__init__(inner.uri)
        self.inner = inner

    def tamper(self, deleted: list[int], changed: list[int], added: int) -> None:
        import deltalake
        import pyarrow as pa

        inner = self.inner
        if isinstance(inner, DeltaTarget):
            deltalake.DeltaTable(inner.path).delete(
                f"order_id IN ({', '.join(map(str, deleted))})")
            deltalake.DeltaTable(inner.path).update(predicate=f"order_id = {changed[0]}",
                                                    updates={"amount": "-1.0"})
            deltalake.DeltaTable(inner.path).update(predicate=f"order_id = {changed[1]}",
                                                    updates={"status": "'by hand'"})
            schema = pa.schema(deltalake.DeltaTable(inner.path).schema().to_arrow())
            row = {f.name: None for f in schema} | {"order_id": added, "status": "by hand"}
            deltalake.write_deltalake(inner.path, pa.Table.from_pylist([row], schema=schema),
                                      mode="append")
            return
        from pyiceberg.expressions import EqualTo, In

        assert isinstance(inner, IcebergTarget)
        inner.table().delete(In("order_id", set(deleted)))
        for key, column, value in ((changed[0], "amount", -1.0),
                                   (changed[1], "status", "by hand")):
            rows = inner.table().scan(row_filter=EqualTo("order_id", key)).to_arrow()
            row = rows.to_pylist()[0] | {column: value}
            inner.table().overwrite(pa.Table.from_pylist([row], schema=rows.schema),
                                    overwrite_filter=EqualTo("order_id", key))
        schema = inner.table().schema().as_arrow()
        row = {f.name: None for f in schema} | {"order_id": added, "status": "by hand"}
        inner.table().append(pa.Table.from_pylist([row], schema=schema))
