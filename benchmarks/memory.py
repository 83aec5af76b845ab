"""Peak memory of one Python worker reading one large partition, against the rows' Arrow size.

What is measured: a store with one channel of ``records`` changes (``benchmarks.common.fill``);
the driver protocol (``StreamProtocol``) plans one batch holding the whole channel in one
partition, in this process; then a fresh Python process (``python -m benchmarks.memory CTX
OUT``), importing what a Spark Python worker imports for this source, runs the source's
``TablestoreStreamReader.read`` on that partition exactly as a worker does and drops each yielded
batch, as a worker does once it has written the batch to the JVM. That process reports:

- ``peak_rss_mb``: its peak resident set over the whole run (``VmHWM``, the high-water mark of
  its own memory: ``ru_maxrss`` would not do, as Linux carries it over ``fork`` and ``exec``, so
  a child of a larger parent reports the parent's size);
- ``baseline_rss_mb``: its resident set after the imports (pyspark, pyarrow, the connector, and
  pandas if it is installed: pyarrow loads it on its first conversion of a Python list), before
  reading;
- ``arrow_mb``: the summed ``nbytes`` of the yielded Arrow batches (the rows' Arrow size);
- ``peak_over_arrow``: ``peak_rss_mb / arrow_mb`` (the issue's target: <= 2.5).

Spark itself is not started: the figure is the Python worker's, and a worker's other memory
(Spark's serializer buffers) does not depend on the source.

``wire``: the same over the Tablestore wire -- the store served by the emulator's routes
(``benchmarks.wire_server``, its own process), the partition planned over ``http://``, and the
measured process reading it with the Tablestore client, prefetch on (its default): the pages it
holds until the claim, the response being decoded and the next one read ahead. Same figures
(``memory_wire_*`` in the summary).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import TABLE, create_bench_table, fill

#: the repository root: the measured process imports ``benchmarks`` from here
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class MemoryConfig:
    records: int = 1_000_000
    #: also read the partition over the Tablestore wire (prefetch on)
    wire: bool = True


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    """This process's peak resident set since its ``exec`` (``VmHWM``, in KiB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run(config: MemoryConfig, workdir: Path) -> dict[str, Any]:
    """Fill, plan one partition, read it in a fresh process (and over the wire); returns the
    figures above."""
    from connector.local import LocalTablestore

    workdir.mkdir(parents=True, exist_ok=True)
    store = LocalTablestore(workdir / "memory.db")
    create_bench_table(store, channels=1)
    fill_rate = fill(store, config.records)
    store.close()
    options = {"table.name": TABLE, "tunnel.name": "memory",
               "maxOffsetsPerChannel": str(config.records)}
    result = _measure({"endpoint": f"local://{workdir / 'memory.db'}", **options},
                      workdir / "local")
    result.update(records=config.records, fill_writes_s=round(fill_rate))
    if config.wire:
        from benchmarks.common import INSTANCE, KEY_ID, SECRET
        from benchmarks.wire_server import WireServerProcess

        with WireServerProcess(workdir / "memory.db", workdir / "server.log", INSTANCE, KEY_ID,
                               SECRET) as server:
            result["wire"] = _measure({
                "endpoint": server.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
                "access.key.secret": SECRET, "meta.store": f"sqlite://{workdir / 'wire.meta.db'}",
                **options}, workdir / "wire")
    return result


def _measure(spark_options: dict[str, str], workdir: Path) -> dict[str, Any]:
    """Plan the one partition in this process, read it in a fresh one; its figures."""
    from connector.options import SourceOptions
    from connector.protocol import StreamProtocol

    workdir.mkdir(parents=True, exist_ok=True)
    options = SourceOptions.from_spark(spark_options)
    protocol = StreamProtocol(options)
    start = protocol.initial_offset()
    (partition,) = protocol.plan(start, protocol.latest_offset(start, None))
    protocol.close()
    context, out = workdir / "partition.pkl", workdir / "memory.json"
    context.write_bytes(pickle.dumps({"options": options, "partition": partition}))
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "benchmarks.memory", str(context), str(out)],
                   check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    result: dict[str, Any] = json.loads(out.read_text())
    result["read_s"] = round(time.perf_counter() - began, 2)
    return result


def worker(context_path: str, out_path: str) -> None:
    """The measured process: read the partition like a Spark Python worker."""
    import pyarrow
    import pyspark.sql.datasource  # noqa: F401

    from connector.schema import output_schema
    from connector.source import TablestoreStreamReader
    from connector.tunnel import open_tunnel_service

    context = pickle.loads(Path(context_path).read_bytes())
    options, partition = context["options"], context["partition"]
    with open_tunnel_service(options.endpoint) as tunnel:
        schema = output_schema(tunnel.table_schema(options.table_name))
    reader = TablestoreStreamReader(options, schema)
    pyarrow.array([0])  # pyarrow loads pandas (if installed) on its first conversion of a list
    baseline = _rss_mb()
    rows = nbytes = batches = 0
    for batch in reader.read(partition):
        rows += batch.num_rows
        nbytes += batch.nbytes
        batches += 1
        del batch
    peak = _peak_rss_mb()
    arrow = nbytes / 2**20
    Path(out_path).write_text(json.dumps({
        "rows": rows, "batches": batches, "arrow_mb": round(arrow, 1),
        "baseline_rss_mb": round(baseline, 1), "peak_rss_mb": round(peak, 1),
        "peak_over_arrow": round(peak / arrow, 2) if arrow else 0.0,
        "growth_over_arrow": round((peak - baseline) / arrow, 2) if arrow else 0.0,
    }))


if __name__ == "__main__":
    worker(*sys.argv[1:3])
