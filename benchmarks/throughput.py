"""Throughput of ``format("tablestore")`` against a trivial Python source, side by side.

What is measured: records per second moved from a source into Spark's ``noop`` sink with
``trigger(availableNow=True)``, in the benchmark's own SparkSession (``local[2]``):

- ``tablestore``: a pre-filled embedded store (``benchmarks.common.fill``: 70 % PUT, 20 % UPDATE,
  10 % DELETE) with ``channels`` channels, read from the beginning through a fresh tunnel; every
  Spark partition is one channel, read on an executor (``read_partition`` + Arrow building);
- ``trivial``: ``benchmarks.trivial_source`` with the same schema, the same rows per channel,
  the same batch/partition structure and the same share of rows with a before-image, yielding
  ready-made Arrow batches.

Rate = rows / the summed ``triggerExecution`` time of the batches that carried rows (Spark's own
progress reports; query start-up is excluded for both, per-batch planning and commit are
included). The two sources run alternately (trivial, tablestore, trivial, ...) after warm-up
queries (tablestore on a small store, trivial at full size), and the ratio is
median(tablestore rates) / median(trivial rates).

Two configurations:
- ``read_path`` (the headline ``throughput_ratio``): ``maxOffsetsPerChannel`` large enough that
  each channel is read in one batch, so Spark's fixed per-batch cost (~0.2-0.3 s) is amortised
  and the figure is bound by the read path;
- ``default_options``: ``maxOffsetsPerChannel`` at its default (10,000), many batches; the
  per-batch cost weighs on both sources, so this ratio is higher and says less about the reader.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import TABLE, create_bench_table, fill, median, progress_breakdown
from connector.local import LocalTablestore

DEFAULT_MAX_OFFSETS_PER_CHANNEL = 10_000


@dataclass(frozen=True)
class ThroughputConfig:
    records: int
    channels: int = 4
    repeats: int = 2
    #: also measure with the default maxOffsetsPerChannel (many batches)
    default_options: bool = True


def run_noop(spark: Any, df: Any, checkpoint: Path) -> dict[str, Any]:
    """Run ``df`` into the noop sink with AvailableNow; rows and times from Spark's progress."""
    query = (df.writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"benchmark query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in progress)
    seconds = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    add_batch = sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000
    shutil.rmtree(checkpoint, ignore_errors=True)
    return {"rows": rows, "seconds": seconds, "add_batch_s": add_batch,
            "batches": len(progress), "rows_s": rows / seconds if seconds else 0.0,
            "batch_ms": progress_breakdown(progress)}


def _tablestore(spark: Any, store: LocalTablestore, max_per_channel: int) -> Any:
    return (spark.readStream.format("tablestore").option("endpoint", f"local://{store.path}")
            .option("table.name", TABLE).option("tunnel.name", f"bench-{uuid.uuid4().hex[:8]}")
            .option("maxOffsetsPerChannel", str(max_per_channel)).load())


def _trivial(spark: Any, channel_rows: list[int], max_per_channel: int,
             before_share: float) -> Any:
    return (spark.readStream.format("bench_trivial")
            .option("channel_rows", ",".join(map(str, channel_rows)))
            .option("max_per_partition", str(max_per_channel))
            .option("before_share", str(before_share)).load())


def before_share(store: LocalTablestore) -> float:
    """The share of the store's change records that carry a before-image."""
    with store.transaction() as conn:
        with_before, total = conn.execute(
            "SELECT count(before), count(*) FROM cdc_changes WHERE table_name = ?", (TABLE,)
        ).fetchone()
    return with_before / total if total else 0.0


def register_trivial(spark: Any) -> None:
    from benchmarks.trivial_source import TrivialDataSource

    spark.dataSource.register(TrivialDataSource)


def _compare(spark: Any, store: LocalTablestore, channel_rows: list[int], max_per_channel: int,
             repeats: int, workdir: Path) -> dict[str, Any]:
    expected = sum(channel_rows)
    share = before_share(store)
    runs: dict[str, list[dict[str, Any]]] = {"trivial": [], "tablestore": []}
    for _ in range(repeats):
        for name in ("trivial", "tablestore"):
            df = (_trivial(spark, channel_rows, max_per_channel, share) if name == "trivial"
                  else _tablestore(spark, store, max_per_channel))
            result = run_noop(spark, df, workdir / f"ckpt-{uuid.uuid4().hex}")
            if result["rows"] != expected:
                raise RuntimeError(f"{name} delivered {result['rows']} rows, expected {expected}")
            runs[name].append(result)
    trivial = median([r["rows_s"] for r in runs["trivial"]])
    tablestore = median([r["rows_s"] for r in runs["tablestore"]])
    return {
        "ratio": tablestore / trivial,
        "tablestore_rows_s": tablestore,
        "trivial_rows_s": trivial,
        "batches": runs["tablestore"][0]["batches"],
        "tablestore_batch_ms": runs["tablestore"][0]["batch_ms"],
        "trivial_batch_ms": runs["trivial"][0]["batch_ms"],
        "tablestore_runs_rows_s": [round(r["rows_s"]) for r in runs["tablestore"]],
        "trivial_runs_rows_s": [round(r["rows_s"]) for r in runs["trivial"]],
        "max_offsets_per_channel": max_per_channel,
    }


def run(spark: Any, config: ThroughputConfig, workdir: Path) -> dict[str, Any]:
    """Fill a store, warm both sources up, then compare them (see the module docstring)."""
    register_trivial(spark)
    workdir.mkdir(parents=True, exist_ok=True)
    store = LocalTablestore(workdir / "throughput.db")
    create_bench_table(store, config.channels)
    fill_rate = fill(store, config.records)
    channel_rows = [c.head_seq for c in store.list_channels(TABLE)]
    # warm-up, not counted: Python workers import the connector on a small store, and the
    # JVM compiles its Arrow-to-row path on a full-size trivial run (the first large run is
    # several times slower than the next ones)
    warm = LocalTablestore(workdir / "warm.db")
    create_bench_table(warm, config.channels)
    fill(warm, 2000)
    run_noop(spark, _tablestore(spark, warm, 10_000), workdir / "ckpt-warm-tablestore")
    warm.close()
    run_noop(spark, _trivial(spark, channel_rows, max(channel_rows), before_share(store)),
             workdir / "ckpt-warm")
    out: dict[str, Any] = {"records": config.records, "channels": config.channels,
                           "fill_writes_s": round(fill_rate)}
    out["read_path"] = _compare(spark, store, channel_rows, max(channel_rows), config.repeats,
                                workdir)
    if config.default_options:
        out["default_options"] = _compare(spark, store, channel_rows,
                                          DEFAULT_MAX_OFFSETS_PER_CHANNEL, 1, workdir)
    store.close()
    return out
