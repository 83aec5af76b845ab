"""``tablestore-cdc reconcile`` on an equal table pair: rows compared per second (no Spark).

What is measured: an embedded store table of ``rows`` rows (key ``id`` INTEGER; STRING,
INTEGER, DOUBLE and BOOLEAN attributes) and a Delta table holding the very same rows
(``write_deltalake`` of them, in record batches of 100,000), built once; then
``reconcile_table`` over the pair, timed: pass 1 reads the source (``LocalTablestore.scan_pages``,
10,000 rows a page), puts it into the compared layout and hashes it, then the target; the pair
is equal, so no bucket differs and nothing is read again. ``reconcile_rows_s`` = source rows /
seconds of the whole call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class ReconcileConfig:
    rows: int = 1_000_000
    write_batch: int = 20_000


def _rows(start: int, stop: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [({"id": i}, {"name": f"customer-{i % 9973}", "qty": i % 1000, "price": i / 8,
                         "paid": i % 3 == 0}) for i in range(start, stop)]


def build(config: ReconcileConfig, workdir: Path) -> tuple[str, str]:
    """The store and the Delta table (same rows); returns (endpoint, target URI)."""
    import deltalake

    from connector.local import LocalTablestore

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "store.db"
    with LocalTablestore(path) as store:
        store.create_table("t", primary_key=[("id", "INTEGER")],
                           columns=[("name", "STRING"), ("qty", "INTEGER"),
                                    ("price", "DOUBLE"), ("paid", "BOOLEAN")], channels=4)
        for start in range(0, config.rows, config.write_batch):
            stop = min(start + config.write_batch, config.rows)
            store.batch_write("t", [("put", pk, attrs) for pk, attrs in _rows(start, stop)])
    schema = pa.schema([pa.field("id", pa.int64(), False), ("name", pa.string()),
                        ("qty", pa.int64()), ("price", pa.float64()), ("paid", pa.bool_())])
    batches = []
    for start in range(0, config.rows, 100_000):
        rows = _rows(start, min(start + 100_000, config.rows))
        batches.append(pa.RecordBatch.from_pylist([{**pk, **attrs} for pk, attrs in rows],
                                                  schema=schema))
    deltalake.write_deltalake(str(workdir / "delta"), pa.Table.from_batches(batches))
    return f"local://{path}", f"delta://{workdir / 'delta'}"


def run(config: ReconcileConfig, workdir: Path) -> dict[str, Any]:
    from tablestore_cdc.reconcile import SourceSpec, reconcile_table

    endpoint, target = build(config, workdir)
    started = time.perf_counter()
    report = reconcile_table(SourceSpec(endpoint, "t"), target)
    seconds = time.perf_counter() - started
    c = report.comparison
    if c.differences or c.source_rows != config.rows or c.target_rows != config.rows:
        raise AssertionError(f"the pair is not equal: {report.counts()}, {c.source_rows} / "
                             f"{c.target_rows} rows")
    return {"rows": config.rows, "seconds": seconds, "rows_s": config.rows / seconds}
