"""``tablestore-cdc replicate`` end to end on the embedded store, against the source's own rate.

What is measured, in one run (issue 39 item 5, issue 55): one embedded store table of
``channels`` channels holding ``records`` pre-written changes (``benchmarks.common.fill``:
70 % PUT, 20 % UPDATE, 10 % DELETE over ``keys`` keys, so the first PUTs are of new keys), then

- ``replicate_e2e_source_changes_s``: the source's own rate, a Spark streaming read of that
  table into the ``noop`` sink with ``Trigger.AvailableNow``, in a process of its own started
  as the command starts its session (``benchmarks.source_run``: a short run's JVM options and
  class archive), ``maxOffsetsPerChannel`` at its default, as the command reads: the changes
  after its first batch / the seconds from the end of that batch to the end of the last one
  (the mtimes of the checkpoint's first and last commit files);
- ``replicate_e2e_changes_s``: ``tablestore-cdc replicate --store ... --table ... --target
  delta://... --once`` started as its own process (as a user starts it), measured over the
  same span: the changes after the query's first batch (the rows of
  ``changelog/batch-000000000000.parquet``) / the seconds from the end of that batch to the
  end of the last one (``OUTPUT/_checkpoints/replicate/commits/``: a batch ends after its
  target commit). The command runs the default one-cycle pipeline: one query reads, logs and
  applies each batch. (Its ``--cycle two`` runs two queries one after the other, source ->
  change log, then change log -> target; ``_spans`` then measures from the change-log
  query's batch 0 to the apply query's last.)
  The first batch is left out on both sides: a process's first batch starts PySpark's Python
  worker daemons and compiles the JVM's first paths, ~3 s that neither side's steady rate
  shows; the costs left out are reported beside it, not hidden:
  ``replicate_e2e_changes_s_from_first_batch`` (every change over the span from the first
  batch's offsets, ``.../replicate/offsets/0``), ``replicate_e2e_first_batch_s``,
  ``replicate_e2e_wall_s`` (process start to exit: interpreter, JVM and SparkSession start,
  the pipeline's set-up, the batches, the shutdown) and ``replicate_e2e_changes_s_wall`` =
  changes / that wall time;
- ``replicate_e2e_ratio`` = ``replicate_e2e_changes_s`` / ``replicate_e2e_source_changes_s``
  (target >= 0.6): two new processes started alike, measured alike;
- ``replicate_e2e_session_changes_s`` and ``replicate_e2e_ratio_session``: the same read in
  the benchmark's own long-lived session (``throughput.run_noop``: rows / the summed
  ``triggerExecution`` of the batches, query start excluded, after a warm-up read of a small
  store), and the command's rate over it: the figure before issue 55's like-with-like
  measure, kept beside it. That session's JVM runs the default JIT (C2) and warms round by
  round, which no command's new process does, so this ratio falls from round to round.

Like with like: the sides run in the same window, ``rounds`` times interleaved (the read in
the session, the read in its own process, the command, then again ...), each with its own
tunnel and output directories over the same store; every figure is the median over the
rounds, each round's ratios and the machine's load average before it are listed beside
(``ratio_rounds``, ``ratio_session_rounds``, ``load_rounds`` in the details). CPU-seconds
beside wall time: ``replicate_e2e_cpu_s``, the command's whole process tree (driver, JVM,
Python workers; ``common.TreeCpuSampler``), ``replicate_e2e_source_cpu_s`` the source
process's, and ``replicate_e2e_session_cpu_s``, the benchmark process tree's CPU during the
session's read.

Before anything is measured, one ``replicate --once`` of a small store: the first short run
of a Java and Spark writes the JVM's class archive at its exit (``connector.jvm_archive``),
so every measured run starts as a user's second and later runs do (the old settings run
without it, as they did).

Sanity: after each command, the Delta table's rows (key and attributes) must equal the
store's live rows, else the benchmark fails. The benchmark's idle SparkSession stays up while
the command runs.

``python -m benchmarks.replicate_e2e --ab --repeat 3`` measures the command's start settings
instead: ``replicate --once`` of the same store, interleaved, with the settings before the
workers' import and JVM changes (``pyspark.zip`` on the workers' path, the JVM's default JIT
and collector) and with the current ones (``--sides old,workers,new``: also with the
workers' import alone; ``two``: the current settings in the two-cycle pipeline, which the
others but ``new`` run too); wall and CPU-seconds per run and their medians
(docs/performance.md, "A start without avoidable warm-up").
"""

from __future__ import annotations

import argparse
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

from benchmarks.common import (
    TABLE,
    TreeCpuSampler,
    commit_times,
    create_bench_table,
    fill,
    load_average,
    median,
    read_bench_table,
    tree_cpu_s,
)
from benchmarks.throughput import run_noop
from connector.jvm_archive import ARCHIVE_ENV
from connector.local import LocalTablestore

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ReplicateE2EConfig:
    records: int = 200_000
    channels: int = 4
    keys: int = 50_000
    #: source read and command, interleaved this many times; figures are the medians
    rounds: int = 3


def _warm_up(spark: Any, workdir: Path) -> None:
    """A small read first: the session's Python workers import the connector, not counted."""
    warm = workdir / "warm.db"
    with LocalTablestore(warm) as store:
        create_bench_table(store, 4)
        fill(store, 2000)
    run_noop(spark, read_bench_table(spark, warm), workdir / "ckpt-warm")


def _source_rate(spark: Any, store_path: Path, checkpoint: Path,
                 expected: int) -> dict[str, Any]:
    """The source's rate into noop, and the benchmark process tree's CPU-seconds meanwhile."""
    cpu = tree_cpu_s()
    result = run_noop(spark, read_bench_table(spark, store_path), checkpoint)
    result["cpu_s"] = tree_cpu_s() - cpu
    if result["rows"] != expected:
        raise RuntimeError(f"the source read {result['rows']} rows, expected {expected}")
    return result


#: how the command is started: with the current settings, or with those before the workers'
#: import and the short run's JVM options (``--ab``: the old side), or with the workers' import
#: only (``--sides old,workers,new``: what each change gives)
LAUNCH = {
    "new": "from tablestore_cdc.commands.app import app; app()",
    "workers": ("import connector.spark as s; s.SHORT_RUN_JVM_OPTIONS = ''; "
                "from tablestore_cdc.commands.app import app; app()"),
    "old": ("import connector.spark as s; s.WORKER_SITE = {empty!r}; "
            "s.SHORT_RUN_JVM_OPTIONS = ''; from tablestore_cdc.commands.app import app; app()"),
}
LAUNCH["two"] = LAUNCH["new"]
#: the settings before issue 55 had no class archive (``connector.jvm_archive``)
ENV_OF = {"old": {ARCHIVE_ENV: "off"}, "workers": {ARCHIVE_ENV: "off"}}
#: each side's ``replicate --cycle``: the current settings in the default one-cycle pipeline
#: ("new"), in the two-cycle one ("two"), and the older settings, which ran two cycles
CYCLE_OF = {"new": "one", "two": "two", "workers": "two", "old": "two"}


def _replicate(store_path: Path, out: Path, lake: Path,
               settings: str = "new") -> tuple[float, float]:
    """Run the command to its exit, through a tunnel of its own (a run after another over the
    same store starts from the table's first row again), with ``settings`` (a side of
    ``LAUNCH``, and its ``CYCLE_OF``); returns its wall seconds and its process tree's
    CPU-seconds."""
    args = ["replicate", "--store", str(store_path), "--table", TABLE, "--output", str(out),
            "--target", f"delta://{lake}", "--tunnel", f"bench-{uuid.uuid4().hex[:8]}",
            "--once", "--cycle", CYCLE_OF[settings],
            # the changes themselves, as the source's read takes them: a new tunnel's default
            # first copy (a snapshot of the table's live rows) would deliver far fewer
            "--initial", "none"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TABLESTORE_CDC_LOG_LEVEL": "WARNING",
           **ENV_OF.get(settings, {})}
    empty = out.parent / "no-worker-site"
    empty.mkdir(parents=True, exist_ok=True)
    code = LAUNCH[settings].format(empty=str(empty))
    with open(out.parent / "replicate.log", "ab") as sink:
        wall, cpu, returncode = _measured([sys.executable, "-c", code, *args], env, sink)
    if returncode != 0:
        raise RuntimeError(f"replicate exited {returncode}: see {out.parent / 'replicate.log'}")
    return wall, cpu


def _measured(argv: list[str], env: dict[str, str], stdout: Any) -> tuple[float, float, int]:
    """Run ``argv`` from the project's root to its exit, its output into ``stdout`` (a file);
    returns its wall seconds, its process tree's CPU-seconds and its exit code."""
    began = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=stdout, stderr=subprocess.STDOUT, env=env)
    sampler = TreeCpuSampler(proc.pid)
    try:  # ended but not reaped: its last CPU reading is still there
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    finally:
        cpu = sampler.stop()
        returncode = proc.wait(1800)
    return time.monotonic() - began, cpu, returncode


def _source_process(store_path: Path, workdir: Path) -> dict[str, Any]:
    """The source's read into noop in a new process started as the command starts
    (``benchmarks.source_run``), measured over the same span; its figures, with its rate
    (``rows_s``) and its process tree's CPU-seconds."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with open(workdir / "source.log", "w+b") as output:
        wall, cpu, returncode = _measured(
            [sys.executable, "-m", "benchmarks.source_run", "--store", str(store_path),
             "--checkpoint", str(workdir / "checkpoint")], env, output)
        output.seek(0)
        lines = output.read().decode(errors="replace").splitlines()
    figures = next((json.loads(line) for line in reversed(lines) if line.startswith("{")), None)
    if returncode != 0 or figures is None:
        raise RuntimeError(f"the source's own process exited {returncode}: see "
                           f"{workdir / 'source.log'}")
    if not figures["rows_after_first"] or figures["seconds"] <= 0:
        raise RuntimeError("the source's first batch took every change: give more records "
                           "than one batch reads (4 channels x maxOffsetsPerChannel)")
    return {**figures, "rows_s": figures["rows_after_first"] / figures["seconds"],
            "cpu_s": cpu, "wall_s": wall}


def _spans(out: Path) -> tuple[float, float, int]:
    """(seconds from the source query's first batch to the end of the last batch that
    applied changes, seconds from the end of that first batch to it, the first batch's
    changes). One cycle: one query (checkpoint "replicate") reads, logs and applies each
    batch, so a batch's end (its commit file, as ``benchmarks.source_run`` measures the
    source) is after its commit into the target; two cycles: source -> change log (checkpoint
    "changelog"), then change log -> target ("apply"), which ends last."""
    first_rows = 0
    if (out / "_checkpoints" / "replicate").is_dir():
        checkpoint = out / "_checkpoints" / "replicate"
        logged = out / "changelog" / f"batch-{0:012d}.parquet"
        first_rows = pq.ParquetFile(logged).metadata.num_rows if logged.exists() else 0
        ended = commit_times(checkpoint)
        last = max(ended.values())
    else:
        checkpoint = out / "_checkpoints" / "changelog"
        ended = commit_times(checkpoint)
        last = max(commit_times(out / "_checkpoints" / "apply").values())
        for line in (out / "changelog" / "_spark_metadata" / "0").read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry.get("action") == "add":
                first_rows += pq.ParquetFile(urlparse(entry["path"]).path).metadata.num_rows
    return (last - (checkpoint / "offsets" / "0").stat().st_mtime,
            last - ended[0], first_rows)


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


def _round(spark: Any, config: ReplicateE2EConfig, workdir: Path, store_path: Path,
           i: int, log: Any) -> dict[str, Any]:
    """One source read in the benchmark's session, one in a process of its own, then one
    command, over the same store (each with its own tunnel)."""
    load = load_average()
    session = _source_rate(spark, store_path, workdir / f"ckpt-source-{i}", config.records)
    source = _source_process(store_path, workdir / f"source-{i}")
    if source["rows"] != config.records:
        raise RuntimeError(f"the source read {source['rows']} rows, expected {config.records}")
    log(f"replicate_e2e round {i + 1}: source {source['rows_s']:,.0f} changes/s in its own "
        f"process, {session['rows_s']:,.0f} in the session (load {load[0]}); "
        "running replicate --once ...")
    out, lake = workdir / f"out-{i}", workdir / f"lake-{i}" / TABLE
    wall, cpu = _replicate(store_path, out, lake)
    span, warm_span, first_rows = _spans(out)
    if first_rows >= config.records:
        raise RuntimeError(f"the change log's first batch took all {config.records:,} changes: "
                           "give more records than one batch reads (4 channels x "
                           "maxOffsetsPerChannel)")
    live = _check_equal(store_path, lake)
    changes_s = (config.records - first_rows) / warm_span
    return {
        "load": load[0], "live_rows": live, "source_batches": source["batches"],
        "source_seconds": source["seconds"], "source_changes_s": source["rows_s"],
        "source_cpu_s": source["cpu_s"], "source_wall_s": source["wall_s"],
        "session_changes_s": session["rows_s"], "session_cpu_s": session["cpu_s"],
        "changes_s": changes_s, "ratio": changes_s / source["rows_s"],
        "ratio_session": changes_s / session["rows_s"], "seconds": warm_span,
        "from_first_batch": config.records / span, "first_batch_s": span - warm_span,
        "wall_s": wall, "cpu_s": cpu,
    }


def _warm_class_archive(workdir: Path, log: Any) -> None:
    """One ``replicate --once`` of the warm-up store before anything is measured: the first
    short run of this Java and Spark writes the JVM's class archive at its exit
    (``connector.jvm_archive``), which every run after maps; measured runs start as a
    user's second run does."""
    store_path = workdir / "archive-warm-up.db"
    if not store_path.exists():
        with LocalTablestore(store_path) as store:
            create_bench_table(store, 4)
            fill(store, 2000)
    began = time.monotonic()
    out = workdir / f"archive-warm-up-{uuid.uuid4().hex[:6]}"
    _replicate(store_path, out / "out", out / "lake" / TABLE)
    log(f"replicate_e2e: a first --once run (the class archive written if there was none) "
        f"took {time.monotonic() - began:.1f} s")


def run(spark: Any, config: ReplicateE2EConfig, workdir: Path,
        log: Any = print) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    store_path = workdir / "store.db"
    with LocalTablestore(store_path) as store:
        create_bench_table(store, config.channels)
        fill(store, config.records, keys=config.keys)
    _warm_up(spark, workdir)
    _warm_class_archive(workdir, log)
    rounds = [_round(spark, config, workdir, store_path, i, log) for i in range(config.rounds)]

    def mid(key: str) -> float:
        return median([r[key] for r in rounds])

    return {
        "records": config.records, "channels": config.channels,
        "live_rows": rounds[0]["live_rows"], "rounds": config.rounds,
        "source_batches": rounds[0]["source_batches"],
        "source_seconds": round(mid("source_seconds"), 2),
        "replicate_e2e_source_changes_s": round(mid("source_changes_s")),
        "replicate_e2e_changes_s": round(mid("changes_s")),
        "replicate_e2e_ratio": round(mid("ratio"), 3),
        "ratio_rounds": [round(r["ratio"], 3) for r in rounds],
        "replicate_e2e_session_changes_s": round(mid("session_changes_s")),
        "replicate_e2e_ratio_session": round(mid("ratio_session"), 3),
        "ratio_session_rounds": [round(r["ratio_session"], 3) for r in rounds],
        "load_rounds": [r["load"] for r in rounds],
        "replicate_e2e_seconds": round(mid("seconds"), 2),
        "replicate_e2e_changes_s_from_first_batch": round(mid("from_first_batch")),
        "replicate_e2e_first_batch_s": round(mid("first_batch_s"), 2),
        "replicate_e2e_wall_s": round(mid("wall_s"), 1),
        "replicate_e2e_changes_s_wall": round(config.records / mid("wall_s")),
        "replicate_e2e_cpu_s": round(mid("cpu_s"), 1),
        "replicate_e2e_source_cpu_s": round(mid("source_cpu_s"), 1),
        "replicate_e2e_source_wall_s": round(mid("source_wall_s"), 1),
        "replicate_e2e_session_cpu_s": round(mid("session_cpu_s"), 1),
    }


def run_ab(config: ReplicateE2EConfig, workdir: Path, repeat: int, log: Any = print,
           sides: tuple[str, ...] = ("old", "new")) -> dict[str, Any]:
    """``replicate --once`` of one store with the old and the new start settings, interleaved
    (old, new, old, new, ...), ``repeat`` runs each; no SparkSession in this process."""
    workdir.mkdir(parents=True, exist_ok=True)
    store_path = workdir / "store.db"
    with LocalTablestore(store_path) as store:
        create_bench_table(store, config.channels)
        fill(store, config.records, keys=config.keys)
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    _warm_class_archive(workdir, log)
    for i in range(repeat):
        for side in sides:
            load = load_average()
            out, lake = workdir / f"{side}-{i}" / "out", workdir / f"{side}-{i}" / "lake" / TABLE
            wall, cpu = _replicate(store_path, out, lake, settings=side)
            _check_equal(store_path, lake)
            runs[side].append({"wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                               "load": load[0]})
            log(f"{side} {i + 1}: wall {wall:.1f} s, CPU {cpu:.1f} s (load {load[0]})")
    result: dict[str, Any] = {"records": config.records, "repeat": repeat, "runs": runs}
    for side, figures in runs.items():
        result[f"{side}_wall_s"] = round(median([r["wall_s"] for r in figures]), 1)
        result[f"{side}_cpu_s"] = round(median([r["cpu_s"] for r in figures]), 1)
    result["cpu_saved"] = round(1 - result["new_cpu_s"] / result["old_cpu_s"], 3)
    result["wall_saved"] = round(1 - result["new_wall_s"] / result["old_wall_s"], 3)
    return result


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.replicate_e2e``: the benchmark alone (its own session), or
    ``--ab`` (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replicate_e2e")
    parser.add_argument("--records", type=int, default=ReplicateE2EConfig.records)
    parser.add_argument("--repeat", type=int, default=3, metavar="N",
                        help="rounds (or, with --ab, runs of each side); medians reported")
    parser.add_argument("--ab", action="store_true",
                        help="the command with the old and the new start settings, interleaved")
    parser.add_argument("--sides", default="old,new",
                        help=f"with --ab, the settings compared, of {sorted(LAUNCH)}")
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    sides = tuple(args.sides.split(","))
    if not set(sides) <= set(LAUNCH) or not {"old", "new"} <= set(sides):
        parser.error(f"--sides takes old, new and optionally workers and two; "
                     f"got {args.sides!r}")
    config = ReplicateE2EConfig(records=args.records, rounds=args.repeat)
    print(f"load average before: {load_average()}", flush=True)
    if args.ab:
        result = run_ab(config, args.workdir, args.repeat, sides=sides)
    else:
        from connector.spark import local_session

        spark = local_session("tablestore-cdc-benchmarks", master="local[2]")
        try:
            result = run(spark, config, args.workdir)
        finally:
            spark.stop()
    print(f"load average after: {load_average()}")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
