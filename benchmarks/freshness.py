"""Freshness: how long a write takes to become visible in a ``foreachBatch`` sink.

What is measured: a writer thread in the benchmark (driver) process puts rows into an embedded
store at a steady rate, each stamped with its own wall-clock time (``time.time()`` just before
the write); a ``format("tablestore")`` query with ``trigger(processingTime="0 seconds")`` (the
default options otherwise) delivers them to a ``foreachBatch`` function, which runs in the same
driver process, collects the batch and records ``time.time() - stamp`` for every row. One
warm-up row is delivered first (Python workers start, first plan) and not counted.

So a figure covers: the write's commit, Spark noticing new data (``latestOffset`` polls with
``has_new_data``), the offset log, planning, the executor read and claim, and the sink's
``collect()`` back on the driver.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import percentile, progress_breakdown
from connector.local import LocalTablestore
from testkit.waiting import wait_until

TABLE = "fresh"


@dataclass(frozen=True)
class FreshnessConfig:
    seconds: float = 20.0
    writes_per_second: float = 10.0
    channels: int = 4
    timeout_s: float = 120.0


def run(spark: Any, config: FreshnessConfig, workdir: Path) -> dict[str, Any]:
    """Run the writer and the query side by side; latency percentiles in milliseconds."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"fresh-{uuid.uuid4().hex[:8]}.db"
    store = LocalTablestore(path)
    store.create_table(TABLE, primary_key=[("id", "INTEGER")], columns=[("stamp", "DOUBLE")],
                       channels=config.channels)
    latencies: list[float] = []
    batches: list[int] = []
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        rows = df.select("stamp").collect()
        now = time.time()
        with lock:
            latencies.extend(now - r.stamp for r in rows)
            batches.append(len(rows))

    query = (spark.readStream.format("tablestore").option("endpoint", f"local://{path}")
             .option("table.name", TABLE).option("tunnel.name", "fresh").load()
             .writeStream.foreachBatch(sink).trigger(processingTime="0 seconds")
             .option("checkpointLocation", str(workdir / f"ckpt-{uuid.uuid4().hex}")).start())
    try:
        store.put_row(TABLE, {"id": -1}, {"stamp": time.time()})  # warm-up, not counted
        wait_until("the warm-up write delivered", lambda: len(latencies), lambda n: n >= 1,
                   timeout=config.timeout_s, interval=0.05, query=query)
        with lock:
            latencies.clear()
            batches.clear()
        writes = max(1, int(config.seconds * config.writes_per_second))
        writer = threading.Thread(target=_write, args=(store, writes, config.writes_per_second))
        writer.start()
        writer.join()
        wait_until(f"all {writes} writes delivered", lambda: len(latencies),
                   lambda n: n >= writes, timeout=config.timeout_s, interval=0.05, query=query)
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        query.stop()
        store.close()
    samples = [x * 1000 for x in latencies]
    return {
        "p50_ms": round(percentile(samples, 0.5), 1),
        "p99_ms": round(percentile(samples, 0.99), 1),
        "max_ms": round(max(samples), 1),
        "writes": len(samples),
        "writes_per_second": config.writes_per_second,
        "batches": len(batches),
        "rows_per_batch": round(len(samples) / max(1, len(batches)), 2),
        "batch_ms": progress_breakdown(progress),
    }


def _write(store: LocalTablestore, writes: int, rate: float) -> None:
    started = time.monotonic()
    for i in range(writes):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        store.put_row(TABLE, {"id": i}, {"stamp": time.time()})

