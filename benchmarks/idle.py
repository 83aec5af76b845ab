"""The idle cost of a multi-table query: ``python -m benchmarks.idle [--tables N] [--seconds S]``.

A ``format("tablestore")`` query over N tables of one local store (``tables=idle_*``, the
default trigger, a no-op ``foreachBatch`` sink) runs until every table has joined and one
write per table was delivered; then nothing is written for ``--seconds`` and the CPU-seconds
of this process's tree (the driver, its JVM, the planning process and the Python workers:
``common.tree_cpu_s``) over that window are printed, with the cores they amount to and the
triggers Spark ran. Afterwards one write's delivery time is taken (``--probes`` of them, a
second apart): the idle backoff must not make a write wait much longer than its cap. Last,
``--rate`` writes a second spread over the tables for ``--load-seconds``, each write's time to
its batch taken (the issue's freshness load: 10 writes/s over 100 tables).
Figures are this run's on this machine (docs/performance.md, "Idle cost").
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from benchmarks.common import percentile, tree_cpu_s
from connector.local import LocalTablestore
from connector.spark import local_session


def run(tables: int, seconds: float, probes: int, rate: float, load_seconds: float,
        workdir: Path) -> dict[str, Any]:
    """Start the query, wait for it to settle, measure the idle window and the probes."""
    path = workdir / f"idle-{uuid.uuid4().hex[:8]}.db"
    names = [f"idle_{i:04d}" for i in range(tables)]
    with LocalTablestore(path) as store:
        for name in names:
            store.create_table(name, [("id", "INTEGER")], [("stamp", "DOUBLE")], channels=1)
    store = LocalTablestore(path)
    seen: list[float] = []
    arrived: dict[int, float] = {}
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        keys = [r._key for r in df.select("_key").collect()]  # the generic rows' key JSON
        now = time.time()
        with lock:
            seen.extend([now] * len(keys))
            arrived.update((json.loads(k)["id"], now) for k in keys)

    spark = local_session("benchmark-idle", short_run=True)
    query = (spark.readStream.format("tablestore").option("endpoint", f"local://{path}")
             .option("tables", "idle_*").option("tunnel.name", "idle").load()
             .writeStream.foreachBatch(sink).trigger(processingTime="0 seconds")
             .option("checkpointLocation", str(workdir / f"ckpt-{uuid.uuid4().hex}")).start())
    try:
        for i, name in enumerate(names):
            store.put_row(name, {"id": i}, {"stamp": time.time()})
        _wait(lambda: len(seen) >= tables, 300, query)
        time.sleep(5)  # the last batch's commit and the first backed-off rounds
        batches = int(query.lastProgress["batchId"]) if query.lastProgress else 0
        triggers = len(query.recentProgress)
        cpu0, t0 = tree_cpu_s(), time.monotonic()
        time.sleep(seconds)
        cpu, wall = tree_cpu_s() - cpu0, time.monotonic() - t0
        idle_batches = (int(query.lastProgress["batchId"]) if query.lastProgress else 0) - batches
        with lock:
            seen.clear()
        delays: list[float] = []
        for i in range(probes):
            time.sleep(1.0 + 0.137 * i)  # not in step with the backoff's rounds
            before, written = len(seen), time.time()
            store.put_row(names[i % tables], {"id": -1 - i}, {"stamp": written})
            _wait(lambda before=before: len(seen) > before, 60, query)
            delays.append((seen[-1] - written) * 1000)
        written_at: dict[int, float] = {}
        for i in range(int(rate * load_seconds)):
            key = 1_000_000 + i
            written_at[key] = time.time()
            store.put_row(names[(i * 7) % tables], {"id": key}, {"stamp": written_at[key]})
            time.sleep(max(0.0, written_at[key] + 1.0 / rate - time.time()))
        _wait(lambda: set(written_at) <= set(arrived), 120, query)
        load = [(arrived[k] - t) * 1000 for k, t in written_at.items()]
    finally:
        query.stop()
        store.close()
        spark.stop()
    return {"tables": tables, "seconds": round(wall, 1), "cpu_s": round(cpu, 2),
            "cores": round(cpu / wall, 3), "batches_while_idle": idle_batches,
            "progress_events_before": triggers,
            "write_to_batch_ms": {"p50": round(percentile(delays, 0.5), 1),
                                  "max": round(max(delays), 1), "probes": len(delays)},
            "under_load_ms": {"writes_per_second": rate, "writes": len(load),
                              "p50": round(percentile(load, 0.5), 1),
                              "p99": round(percentile(load, 0.99), 1),
                              "max": round(max(load), 1)}}


def _wait(done: Any, timeout: float, query: Any) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError("the query did not deliver in time")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--rate", type=float, default=10.0, help="writes/s of the load phase")
    parser.add_argument("--load-seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    with TemporaryDirectory() as tmp:
        print(json.dumps(run(args.tables, args.seconds, args.probes, args.rate,
                                   args.load_seconds, Path(tmp)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
