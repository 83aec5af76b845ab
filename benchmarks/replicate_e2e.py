"""``tablestore-cdc replicate`` end to end on the embedded store, against the source's own rate.

What is measured, in one run (issue 39 item 5): one embedded store table of ``channels``
channels holding ``records`` pre-written changes (``benchmarks.common.fill``: 70 % PUT, 20 %
UPDATE, 10 % DELETE over ``keys`` keys, so the first PUTs are of new keys), then

- ``replicate_e2e_source_changes_s``: the source's own rate, a Spark streaming read of that
  table into the ``noop`` sink with ``Trigger.AvailableNow`` in the benchmark's session
  (``throughput.run_noop``: rows / the summed ``triggerExecution`` of the batches, query
  start excluded), after a warm-up read of a small store; ``maxOffsetsPerChannel`` at its
  default, as the command reads;
- ``replicate_e2e_changes_s``: ``tablestore-cdc replicate --store ... --table ... --target
  delta://... --once`` started as its own process (as a user starts it), the changes after
  the change-log query's first batch / the seconds **from the end of that batch to the last
  commit** (the mtime of ``OUTPUT/_checkpoints/changelog/commits/0`` to that of the target's
  last Delta log entry; the batch's changes: the rows of the files Spark's file sink lists for
  batch 0). With ``--once`` the command's two queries run one after the other: source ->
  change log, then change log -> target; the span holds the rest of the first and all of the
  second, its start included. The first batch is left out as the source's figure leaves out
  its warm-up: a process's first batch starts PySpark's Python worker daemons (each compiles
  pyspark from the ``pyspark.zip`` PySpark puts on the workers' path: no bytecode cache), ~3-4
  s the source's warm-up read pays before its figure starts. So the ratio compares a warm
  process with a warm session; the costs left out are reported beside it, not hidden:
  ``replicate_e2e_changes_s_from_first_batch`` (every change over the span from the first
  batch's offsets, ``.../changelog/offsets/0``), ``replicate_e2e_first_batch_s``,
  ``replicate_e2e_wall_s`` (process start to exit: interpreter, JVM and SparkSession start,
  the pipeline's set-up, the batches, the shutdown) and ``replicate_e2e_changes_s_wall`` =
  changes / that wall time;
- ``replicate_e2e_ratio`` = ``replicate_e2e_changes_s`` / ``replicate_e2e_source_changes_s``
  (target >= 0.3).

Sanity: after the command exits, the Delta table's rows (key and attributes) must equal the
store's live rows, else the benchmark fails. The source read runs while the command's process
is not yet started; the benchmark's idle SparkSession stays up during the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.parquet as pq

from benchmarks.common import TABLE, create_bench_table, fill
from benchmarks.throughput import run_noop
from connector.local import LocalTablestore

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ReplicateE2EConfig:
    records: int = 200_000
    channels: int = 4
    keys: int = 50_000


def _source_rate(spark: Any, store_path: Path, workdir: Path, expected: int) -> dict[str, Any]:
    def read(path: Path) -> Any:
        return (spark.readStream.format("tablestore").option("endpoint", f"local://{path}")
                .option("table.name", TABLE)
                .option("tunnel.name", f"bench-{uuid.uuid4().hex[:8]}").load())

    warm = workdir / "warm.db"  # Python workers import the connector, not counted
    with LocalTablestore(warm) as store:
        create_bench_table(store, 4)
        fill(store, 2000)
    run_noop(spark, read(warm), workdir / "ckpt-warm")
    result = run_noop(spark, read(store_path), workdir / "ckpt-source")
    if result["rows"] != expected:
        raise RuntimeError(f"the source read {result['rows']} rows, expected {expected}")
    return result


def _replicate(store_path: Path, out: Path, lake: Path) -> float:
    """Run the command to its exit; returns its wall seconds."""
    args = ["replicate", "--store", str(store_path), "--table", TABLE, "--output", str(out),
            "--target", f"delta://{lake}", "--once"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TABLESTORE_CDC_LOG_LEVEL": "WARNING"}
    began = time.monotonic()
    with open(out.parent / "replicate.log", "ab") as sink:
        code = subprocess.run(
            [sys.executable, "-c", "from tablestore_cdc.cli import app; app()", *args],
            cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=1800).returncode
    wall = time.monotonic() - began
    if code != 0:
        raise RuntimeError(f"replicate exited {code}: see {out.parent / 'replicate.log'}")
    return wall


def _spans(out: Path, lake: Path) -> tuple[float, float, int]:
    """(seconds from the change-log query's first batch to the target's last commit, seconds
    from the end of that batch to it, the batch's changes). The command runs two queries:
    source -> change log (checkpoint "changelog"), then change log -> target ("apply")."""
    checkpoint = out / "_checkpoints" / "changelog"
    last = max(p.stat().st_mtime for p in (lake / "_delta_log").glob("*.json"))
    first_rows = 0
    for line in (out / "changelog" / "_spark_metadata" / "0").read_text().splitlines()[1:]:
        entry = json.loads(line)
        if entry.get("action") == "add":
            first_rows += pq.ParquetFile(urlparse(entry["path"]).path).metadata.num_rows
    return (last - (checkpoint / "offsets" / "0").stat().st_mtime,
            last - (checkpoint / "commits" / "0").stat().st_mtime, first_rows)


def _check_equal(store_path: Path, lake: Path) -> int:
    """The target's rows must be the store's live rows; returns their number."""
    import deltalake

    with LocalTablestore(store_path) as store:
        source = {pk["id"]: (attrs.get("name"), attrs.get("qty"))
                  for pk, attrs in store.scan(TABLE)}
    rows = deltalake.DeltaTable(str(lake)).to_pyarrow_table(
        columns=["id", "name", "qty"]).to_pylist()
    target = {r["id"]: (r["name"], r["qty"]) for r in rows}
    if len(rows) != len(target) or target != source:
        missing = len(source.keys() - target.keys())
        extra = len(target.keys() - source.keys())
        differ = sum(1 for k in source.keys() & target.keys() if source[k] != target[k])
        raise AssertionError(f"the target is not the source: {len(rows)} target rows, "
                             f"{len(source)} source rows, {missing} missing, {extra} extra, "
                             f"{differ} differ")
    return len(source)


def run(spark: Any, config: ReplicateE2EConfig, workdir: Path,
        log: Any = print) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    store_path, out = workdir / "store.db", workdir / "out"
    lake = workdir / "lake" / TABLE
    with LocalTablestore(store_path) as store:
        create_bench_table(store, config.channels)
        fill(store, config.records, keys=config.keys)
    source = _source_rate(spark, store_path, workdir, config.records)
    log(f"replicate_e2e: source {source['rows_s']:,.0f} changes/s; running replicate --once ...")
    wall = _replicate(store_path, out, lake)
    span, warm_span, first_rows = _spans(out, lake)
    if first_rows >= config.records:
        raise RuntimeError(f"the change log's first batch took all {config.records:,} changes: "
                           "give more records than one batch reads (4 channels x "
                           "maxOffsetsPerChannel)")
    live = _check_equal(store_path, lake)
    changes_s = (config.records - first_rows) / warm_span
    return {
        "records": config.records, "channels": config.channels, "live_rows": live,
        "source_batches": source["batches"], "source_seconds": round(source["seconds"], 2),
        "replicate_e2e_source_changes_s": round(source["rows_s"]),
        "replicate_e2e_changes_s": round(changes_s),
        "replicate_e2e_ratio": round(changes_s / source["rows_s"], 3),
        "replicate_e2e_seconds": round(warm_span, 2),
        "replicate_e2e_changes_s_from_first_batch": round(config.records / span),
        "replicate_e2e_first_batch_s": round(span - warm_span, 2),
        "replicate_e2e_wall_s": round(wall, 1),
        "replicate_e2e_changes_s_wall": round(config.records / wall),
    }
