"""The two apply engines side by side: the embedded apply (delta-rs / pyiceberg on the driver)
and the Spark engine (delta-spark's / Iceberg runtime's MERGE), on the same table and change
stream.

For every size N (``sizes``) and format, the benchmark process (the parent) writes the batches
once as parquet files: a first load of N rows (``lakehouse_apply.load_batches``), a stream of
``batches`` batches on hot keys (``lakehouse_apply.stream_batches``: PUTs of new keys, UPDATEs
and DELETEs among the ``hot_keys`` newest) and ``spread_batches`` batches spread over the whole
table (85 % UPDATEs, 15 % DELETEs of keys drawn once each from the older keys). Each engine then
applies all of them, SCD 1, into a new table **in a process of its own** (``python -m
benchmarks.apply_engines SPEC``: the embedded one on this interpreter, with no Spark; the Spark
one on ``testkit.spark_merge_run.SPARK_MERGE_PYTHON`` in ``merge_session``, reading each batch
with ``spark.read.parquet`` as the apply query reads the change log), the engines' runs
interleaved ``repeat`` times (embedded, spark, embedded, spark, ...; figures are the medians).

The child reports (its last stdout line, JSON): the first load's and each stream's seconds and
the process tree's CPU seconds (``/proc``: the Python driver, its JVM and any executor JVMs),
per-batch seconds, the Spark session's start, the peak RSS (``VmHWM``) of the Python driver
and of each JVM, read before the session stops: the driver JVM, which in ``local[n]`` holds the
executor too, and with a ``local-cluster`` master each executor JVM. The child's
module-level imports are the standard library's only: the Spark venv has no numpy or psutil.

``summary`` flattens the figures into ``apply_engines_<format>_<size>_<engine>_<figure>`` and
the ratios spark / embedded (``..._spark_over_embedded_<figure>``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the engines measured: the embedded apply (this interpreter, no Spark), the Spark engine on
#: ``ApplyEnginesConfig.master`` and on ``cluster_master`` (``SPARK_MERGE_PYTHON``)
EMBEDDED, SPARK, SPARK_CLUSTER = "embedded", "spark", "spark_cluster"


@dataclass(frozen=True)
class ApplyEnginesConfig:
    """What ``run`` measures (the benchmark process): sizes, formats (``delta``, ``iceberg``),
    the batches' shape (as ``LakehouseApplyConfig``'s), the runs per engine and the masters."""

    sizes: tuple[int, ...] = (100_000,)
    formats: tuple[str, ...] = ("delta",)
    load_batch: int = 50_000
    channels: int = 4
    #: hot-key batches (new keys, updates and deletes of the newest keys)
    batches: int = 4
    #: batches spread over the whole table's keys
    spread_batches: int = 4
    batch_size: int = 10_000
    hot_keys: int = 50_000
    repeat: int = 1
    #: the Spark engine's master on this machine, and a local-cluster one (None: not run)
    master: str = "local[2]"
    cluster_master: str | None = None
    #: the Spark driver's heap (the JVM's -Xmx, ``spark.driver.memory``)
    driver_memory: str = "2g"
    timeout_s: float = 3600.0


# --- the child: one engine, one table, in a process of its own ---------------------------------

def _proc_tree() -> dict[int, int]:
    """This process and its live descendants: pid -> depth (``/proc``; Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = {}, [(os.getpid(), 0)]
    while todo:
        pid, depth = todo.pop()
        tree[pid] = depth
        todo.extend((child, depth + 1) for child in children.get(pid, []))
    return tree


def _tree_cpu_s() -> float:
    """CPU seconds (user + system, with waited-for children's) of this process tree."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in _proc_tree():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def _peak_rss_mb(pid: int) -> float:
    """A process's peak RSS (``VmHWM``, MB): its own since its ``exec`` (``ru_maxrss`` would
    carry over the forking benchmark process's peak, which holds every batch)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) / 1024


def _jvm_peaks_mb() -> tuple[float, list[float]]:
    """The peak RSS (``VmHWM``) of the driver JVM (the shallowest ``java`` below this process)
    and of every other JVM below it (a local-cluster's executors), in MB."""
    jvms: list[tuple[int, float]] = []
    for pid, depth in _proc_tree().items():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "java":
                    continue
            jvms.append((depth, _peak_rss_mb(pid)))
        except (OSError, StopIteration):
            continue
    if not jvms:
        return 0.0, []
    jvms.sort()
    return jvms[0][1], [mb for _, mb in jvms[1:]]


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Apply SPEC's batches with one engine (the child process; the driver of its engine)."""
    engine, fmt, workdir = spec["engine"], spec["format"], Path(spec["workdir"])
    began = time.perf_counter()
    spark = None
    if engine == EMBEDDED:
        import pyarrow.parquet as pq

        from tablestore_cdc.lakehouse import DeltaApplySink, IcebergApplySink
        from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

        sink: Any = (DeltaApplySink(workdir / "table", key_columns=["id"]) if fmt == "delta"
                     else IcebergApplySink(sqlite_catalog_properties(str(workdir / "warehouse")),
                                           "bench.apply", key_columns=["id"]))
        sink.target_properties()  # the format's library imported before the clock

        def read(path: str) -> Any:
            return pq.read_table(path)
    else:
        from tablestore_cdc.lakehouse.spark_merge import SparkMergeSink
        from testkit.spark_merge_run import merge_session

        spark = merge_session(str(workdir / "warehouse"), master=spec["master"],
                              parallelism=spec["parallelism"],
                              app_name="tablestore-cdc-apply-engines",
                              conf={"spark.driver.memory": spec["driver_memory"]})
        target = str(workdir / "table") if fmt == "delta" else "lake.bench.apply"
        sink = SparkMergeSink(target, format=fmt, key_columns=["id"])

        def read(path: str) -> Any:
            return spark.read.parquet(path)
    out: dict[str, Any] = {"start_s": time.perf_counter() - began}
    batch_id = 0
    try:
        for phase in ("load", "hot", "spread"):
            times = []
            cpu_began = _tree_cpu_s()
            for path in spec[phase]:
                t0 = time.perf_counter()
                sink.apply(read(path), "bench", batch_id)
                times.append(time.perf_counter() - t0)
                print(f"{phase} batch {batch_id}: {times[-1]:.2f} s", file=sys.stderr, flush=True)
                batch_id += 1
            out[f"{phase}_s"] = sum(times)
            out[f"{phase}_cpu_s"] = _tree_cpu_s() - cpu_began
            out[f"{phase}_batch_s"] = times
        out["cpu_s"] = _tree_cpu_s()
        out["driver_rss_mb"] = _peak_rss_mb(os.getpid())
        out["jvm_rss_mb"], out["executor_rss_mb"] = _jvm_peaks_mb()
    finally:
        if spark is not None:
            spark.stop()
    return out


# --- the parent: batches written once, engines interleaved -------------------------------------

def write_batches(size: int, config: ApplyEnginesConfig, directory: Path) -> dict[str, list[str]]:
    """The load, hot-key and spread batches of ``size`` as parquet files (the parent, once)."""
    import numpy as np
    import pyarrow.parquet as pq

    from benchmarks.lakehouse_apply import (
        START,
        LakehouseApplyConfig,
        _changes,
        load_batches,
        stream_batches,
    )

    shape = LakehouseApplyConfig(load_batch=config.load_batch, channels=config.channels,
                                 batches=config.batches, batch_size=config.batch_size,
                                 hot_keys=config.hot_keys)
    rng = np.random.default_rng(3)
    older = rng.permutation(max(1, size - config.hot_keys))  # each spread key changed once
    spread = []
    for b in range(config.spread_batches):
        keys = older[b * config.batch_size:(b + 1) * config.batch_size].astype(np.int64)
        ops = np.where(rng.random(len(keys)) < 0.85, 1, 2)
        channels = keys % config.channels
        sequences = size + 10 ** 8 + b * config.batch_size + np.arange(len(keys))
        spread.append(_changes(keys, ops, channels, sequences,
                               int(START.timestamp() * 1e6) + 2 * 10 ** 9
                               + b * config.batch_size, rng))
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, list[str]] = {}
    for phase, tables in (("load", load_batches(size, shape)),
                          ("hot", stream_batches(size, shape)), ("spread", spread)):
        paths[phase] = []
        for i, table in enumerate(tables):
            path = directory / f"{phase}-{i:04d}.parquet"
            pq.write_table(table, path)
            paths[phase].append(str(path))
    return paths


def _run_child(engine: str, fmt: str, batches: dict[str, list[str]], config: ApplyEnginesConfig,
               workdir: Path) -> dict[str, Any]:
    """One engine's run in a process of its own; its report, with the process's wall time."""
    from testkit.spark_merge_run import ROOT, SPARK_MERGE_PYTHON

    workdir.mkdir(parents=True)
    master = config.cluster_master if engine == SPARK_CLUSTER else config.master
    cores = int(master.split("[")[1].split(",")[0].rstrip("]*")) if master else 2
    spec = {"engine": engine, "format": fmt, "workdir": str(workdir), "master": master,
            "parallelism": cores, "driver_memory": config.driver_memory, **batches}
    (workdir / "spec.json").write_text(json.dumps(spec))
    python = sys.executable if engine == EMBEDDED else SPARK_MERGE_PYTHON
    began = time.perf_counter()
    with open(workdir / "stderr.log", "wb") as errors:
        proc = subprocess.run([python, "-m", "benchmarks.apply_engines",
                               str(workdir / "spec.json")], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=errors, text=True,
                              timeout=config.timeout_s)
    if proc.returncode != 0:
        tail = (workdir / "stderr.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"apply_engines: the {engine} run failed ({proc.returncode}): {tail}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["process_s"] = time.perf_counter() - began
    return report


def _figures(runs: list[dict[str, Any]], size: int, changes: dict[str, int]) -> dict[str, Any]:
    """The medians over an engine's runs."""
    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    out = {"first_load_rows_s": size / med("load_s"),
           "first_load_cpu_s": med("load_cpu_s"),
           "hot_changes_s": changes["hot"] / med("hot_s"),
           "spread_changes_s": changes["spread"] / med("spread_s"),
           "hot_per_batch_s": float(statistics.median(
               statistics.median(r["hot_batch_s"]) for r in runs)),
           "spread_per_batch_s": float(statistics.median(
               statistics.median(r["spread_batch_s"]) for r in runs)),
           "hot_cpu_s": med("hot_cpu_s"), "spread_cpu_s": med("spread_cpu_s"),
           "cpu_s": med("cpu_s"), "start_s": med("start_s"), "process_s": med("process_s"),
           "driver_rss_mb": med("driver_rss_mb"), "jvm_rss_mb": med("jvm_rss_mb"),
           "executor_rss_mb": float(statistics.median(
               max(r["executor_rss_mb"] or [0.0]) for r in runs))}
    return out


def run(config: ApplyEnginesConfig, workdir: Path,
        log: Any = lambda message: None) -> dict[str, Any]:
    """Every size and format, the engines interleaved ``repeat`` times (the benchmark process)."""
    import pyarrow.parquet as pq

    from benchmarks.common import load_average

    engines = [EMBEDDED, SPARK] + ([SPARK_CLUSTER] if config.cluster_master else [])
    results: dict[str, Any] = {}
    for size in config.sizes:
        batches = write_batches(size, config, workdir / f"batches-{size}")
        changes = {phase: sum(pq.read_metadata(p).num_rows for p in batches[phase])
                   for phase in ("hot", "spread")}
        for fmt in config.formats:
            runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
            failed: dict[str, str] = {}
            for i in range(config.repeat):
                for engine in [e for e in engines if e not in failed]:
                    log(f"apply_engines: {fmt} {size:,} rows, {engine} (run {i + 1}) ...")
                    try:
                        runs[engine].append(_run_child(engine, fmt, batches, config,
                                                       workdir / f"{fmt}-{size}-{engine}-{i}"))
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        if engine != SPARK_CLUSTER:
                            raise
                        failed[engine] = str(exc)[-500:]  # reported, the others still run
                        log(f"apply_engines: {engine} failed: {failed[engine]}")
            figures: dict[str, Any] = {engine: _figures(r, size, changes)
                                       for engine, r in runs.items() if engine not in failed}
            figures.update({f"{engine}_error": error for engine, error in failed.items()})
            figures["load_avg"] = load_average()
            figures["changes"] = changes
            results[f"{fmt}_{size}"] = figures
    return results


#: the figures ``summary`` prints per engine, and those it also gives as spark / embedded
FIGURES = ("first_load_rows_s", "hot_changes_s", "spread_changes_s", "hot_per_batch_s",
           "spread_per_batch_s", "cpu_s", "driver_rss_mb", "jvm_rss_mb", "executor_rss_mb",
           "start_s")
RATIOS = ("first_load_rows_s", "hot_changes_s", "spread_changes_s", "cpu_s")


def summary(details: dict[str, Any]) -> dict[str, Any]:
    """``apply_engines_<format>_<size>_<engine>_<figure>`` and ``..._<engine>_over_embedded_
    <figure>`` (a Spark engine's figure over the embedded one's), plus each size's load."""
    out: dict[str, Any] = {}
    for name, figures in details.items():
        for engine in (EMBEDDED, SPARK, SPARK_CLUSTER):
            if engine not in figures:
                continue
            for key in FIGURES:
                if key == "executor_rss_mb" and engine != SPARK_CLUSTER:
                    continue
                if key in ("jvm_rss_mb", "start_s") and engine == EMBEDDED:
                    continue
                out[f"apply_engines_{name}_{engine}_{key}"] = round(figures[engine][key], 3)
            if engine != EMBEDDED:
                for key in RATIOS:
                    out[f"apply_engines_{name}_{engine}_over_embedded_{key}"] = round(
                        figures[engine][key] / figures[EMBEDDED][key], 3)
        out[f"apply_engines_{name}_load_avg"] = figures["load_avg"]
        if f"{SPARK_CLUSTER}_error" in figures:
            out[f"apply_engines_{name}_{SPARK_CLUSTER}_error"] = figures[f"{SPARK_CLUSTER}_error"]
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    report = json.dumps(child(spec))
    Path(spec["workdir"], "report.json").write_text(report)  # kept beside the run's log
    print(report, flush=True)
