"""Recovery after a SIGKILL of the Spark driver tree: time to the first new batch, records re-read.

What is measured: a query runs in its own process (``testkit.runner``: ``local[2]``, an
``ExactlyOnceParquetSink``, ``maxOffsetsPerChannel`` small so it runs many batches) over a
pre-filled embedded store. Once ``batches_before_kill`` batches are in the sink, the whole
process tree is SIGKILLed at that arbitrary moment (``testkit.processes.kill_tree``), and the
runner is started again on the same checkpoint.

- ``recovery_s``: from the restart (process start) to the first sink batch with an id above every
  batch stored before the kill. It includes the new driver's JVM and SparkSession start
  (``query_started_s``: restart to the runner's "query started" line), and ``cold_start_s``
  (first start to first batch, nothing to recover) shows the same path without a crash.
  The kill is placed half a batch interval after a batch landed in the sink, i.e. mid-batch.
- ``recovery_rereads``: records the restarted query reads a second time. After a kill, Spark
  replays the last batch of its offset log if its commit log lacks it; every channel whose end
  was claimed in the meta table by the killed run is re-read exactly to that end (records
  replayed from claimed ends), the others are read for the first time. So the figure is the sum
  of the claimed ``records`` under that batch's end UUID, read from the meta table ~1.5 s after
  the kill (a leftover worker may still claim for about a second). Zero when the kill fell
  between batches.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import TABLE, create_bench_table, fill, median
from connector.local import LocalTablestore
from connector.options import SourceOptions
from meta_store import open_meta_store
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from testkit.processes import kill_tree, start_runner
from testkit.waiting import wait_until

TUNNEL = "recovery"


@dataclass(frozen=True)
class RecoveryConfig:
    trials: int = 1
    channels: int = 4
    max_per_channel: int = 500
    batches_before_kill: int = 3
    timeout_s: float = 300.0


def _last_batch(checkpoint: Path, log: str) -> int | None:
    ids = [int(p.name) for p in (checkpoint / log).glob("*") if p.name.isdigit()]
    return max(ids) if ids else None


def in_flight_rereads(checkpoint: Path, options: SourceOptions) -> tuple[int | None, int]:
    """(Spark batch id that will be replayed or None, records claimed for it in the meta table)."""
    planned = _last_batch(checkpoint, "offsets")
    committed = _last_batch(checkpoint, "commits")
    if planned is None or (committed is not None and committed >= planned):
        return None, 0
    lines = (checkpoint / "offsets" / str(planned)).read_text().splitlines()
    end_uuid = json.loads(lines[-1])["uuid"]
    with open_meta_store(options.meta_store) as meta:
        ends = meta.get_end_checkpoints(options.source_identity, end_uuid)
    return planned, sum(e.records for e in ends.values())


def _started_lines(log: Path) -> int:
    """How many times a runner wrote to ``log`` that its query started."""
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text(errors="replace").splitlines()
               if line.startswith("runner: query") and line.endswith("started"))


def run(config: RecoveryConfig, workdir: Path) -> dict[str, Any]:
    """Cold start, then ``trials`` kill/restart cycles of one query; medians over the trials."""
    workdir.mkdir(parents=True, exist_ok=True)
    store_path = workdir / "recovery.db"
    store = LocalTablestore(store_path)
    create_bench_table(store, config.channels)
    per_batch = config.channels * config.max_per_channel
    fill(store, per_batch * (config.trials * (config.batches_before_kill + 3) + 4))
    store.close()
    sink = ExactlyOnceParquetSink(workdir / "sink")
    checkpoint = workdir / "ckpt"
    log = workdir / "runner.log"
    args = ["--store", str(store_path), "--table", TABLE, "--tunnel", TUNNEL,
            "--checkpoint", str(checkpoint), "--sink", str(sink.path),
            "--stop-file", str(workdir / "stop"),
            "--option", f"maxOffsetsPerChannel={config.max_per_channel}"]
    options = SourceOptions.from_spark({"endpoint": f"local://{store_path.resolve()}",
                                        "table.name": TABLE, "tunnel.name": TUNNEL})

    def newest() -> int:
        return max(sink.committed_batches(), default=-1)

    def wait_batch_above(n: int, what: str, interval: float = 0.2) -> None:
        wait_until(f"{what} (a sink batch above {n})", newest, lambda batch: batch > n,
                   timeout=config.timeout_s, interval=interval, process=runner)

    trials: list[dict[str, Any]] = []
    started = time.monotonic()
    runner = start_runner(args, log)
    try:
        wait_batch_above(-1, "first batch")
        cold_start_s = time.monotonic() - started
        for _ in range(config.trials):
            target = newest() + config.batches_before_kill
            wait_batch_above(target - 1, "batches before kill", interval=0.02)
            seen = time.monotonic()
            wait_batch_above(target, "one more batch", interval=0.02)
            # land the kill in the middle of the next batch, where it costs the most
            time.sleep((time.monotonic() - seen) / 2)
            kill_tree(runner.pid)
            stored_at_kill = newest()
            time.sleep(1.5)  # a leftover worker may still claim for about a second
            replayed, rereads = in_flight_rereads(checkpoint, options)
            starts = _started_lines(log)
            restarted = time.monotonic()
            runner = start_runner(args, log)
            wait_until("query started after restart", lambda: _started_lines(log),
                       lambda lines, starts=starts: lines > starts,
                       timeout=config.timeout_s, interval=0.05,
                       process=runner)
            query_started_s = time.monotonic() - restarted
            wait_batch_above(stored_at_kill, "first new batch after restart", interval=0.05)
            trials.append({"recovery_s": round(time.monotonic() - restarted, 2),
                           "query_started_s": round(query_started_s, 2),
                           "rereads": rereads, "replayed_batch": replayed,
                           "stored_batches_at_kill": stored_at_kill + 1})
        (workdir / "stop").touch()
        runner.wait(120)
    finally:
        kill_tree(runner.pid)
    replays = sink.replays()
    return {
        "recovery_s": median([t["recovery_s"] for t in trials]),
        "rereads": int(median([t["rereads"] for t in trials])),
        "query_started_s": median([t["query_started_s"] for t in trials]),
        "cold_start_s": round(cold_start_s, 2),
        "trials": trials,
        "rows_per_batch": per_batch,
        "sink_replays_identical": all(r["identical"] for r in replays),
    }
