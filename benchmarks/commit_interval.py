"""Throughput on small batches with ``commitInterval`` 1, 10 and 50.

What is measured: records per second of ``format("tablestore")`` into the ``noop`` sink with
``trigger(availableNow=True)`` over a pre-filled store, with a small ``maxOffsetsPerChannel`` so
every batch is small and the per-batch protocol work (meta-store writes, checkpoint pushes to
the tunnel) weighs as much as it can. ``commitInterval=N`` pushes checkpoints to the tunnel
every N committed batches instead of every batch (the meta table is still written per batch).
Rate = rows / the summed ``triggerExecution`` of the batches (Spark's progress reports), one
query per interval, the intervals alternating when repeated; the median per interval is kept.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import TABLE, create_bench_table, fill, median
from benchmarks.throughput import run_noop
from connector.local import LocalTablestore


@dataclass(frozen=True)
class CommitIntervalConfig:
    batches: int = 30
    channels: int = 4
    max_per_channel: int = 50
    intervals: tuple[int, ...] = (1, 10, 50)
    repeats: int = 1


def run(spark: Any, config: CommitIntervalConfig, workdir: Path) -> dict[str, Any]:
    """records/s per commit interval (keys are the intervals as strings)."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = LocalTablestore(workdir / "commit-interval.db")
    create_bench_table(store, config.channels)
    # a few channels get a bit more than the average: the last batches are partial
    fill(store, config.batches * config.channels * config.max_per_channel)
    rates: dict[int, list[float]] = {n: [] for n in config.intervals}
    batches: dict[int, int] = {}
    breakdown: dict[int, dict[str, float]] = {}
    for _ in range(config.repeats):
        for interval in config.intervals:
            df = (spark.readStream.format("tablestore")
                  .option("endpoint", f"local://{store.path}").option("table.name", TABLE)
                  .option("tunnel.name", f"ci-{uuid.uuid4().hex[:8]}")
                  .option("maxOffsetsPerChannel", str(config.max_per_channel))
                  .option("commitInterval", str(interval)).load())
            result = run_noop(spark, df, workdir / f"ckpt-{uuid.uuid4().hex}")
            rates[interval].append(result["rows_s"])
            batches[interval] = int(result["batches"])
            breakdown[interval] = result["batch_ms"]
    store.close()
    return {
        "records_s": {str(n): round(median(v), 1) for n, v in rates.items()},
        "batches": {str(n): b for n, b in batches.items()},
        "rows_per_batch": config.channels * config.max_per_channel,
        "batch_ms": {str(n): b for n, b in breakdown.items()},
    }
