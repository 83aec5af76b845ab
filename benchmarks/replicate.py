"""Many tables in one application: ``tablestore-cdc replicate --tables`` over N tables x 4 channels.

What is measured (docs/performance.md, "Many tables"): an embedded store with ``tables`` tables
of ``channels`` channels each, one row each; the command started as its own process (as a user
starts it), into Delta targets from a template. Then:

- ``replicate_start_s``: from the start until every table's target exists (Spark's start, the
  first listing, every table's join batch and first batch, every first target commit);
- ``replicate_rss_mb``: the resident memory of the whole application summed over its process
  tree (the driver JVM, the command's Python, Spark's planning process and Python workers;
  psutil), once every table has been applied, and its peak over the run;
- ``replicate_idle_cpu_cores``: CPU seconds of the whole tree per wall second over
  ``idle_s`` with no writes (the planning loop polling every table);
- ``replicate_freshness_p50_ms`` / ``_p99_ms``: from a write to one table (a row changed, the
  tables taken in turn) until its target shows it, one write at a time;
- ``replicate_new_table_s``: from creating a table (with one row) until its target holds it
  (bounded by ``tables.refreshIntervalMs`` plus a batch).

``python -m benchmarks.replicate [--tables N]`` runs it alone and prints the figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import median

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ReplicateConfig:
    tables: int = 100
    channels: int = 4
    idle_s: float = 20.0
    freshness_writes: int = 20
    refresh_ms: int = 5_000
    trigger_ms: int = 500


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _rss_mb(pid: int) -> float:
    total = 0
    for p in _tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def _cpu_s(pid: int) -> float:
    total = 0.0
    for p in _tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _target_value(lake: Path, table: str, key: int) -> Any:
    import deltalake

    if not (lake / table / "_delta_log").exists():
        return None
    rows = deltalake.DeltaTable(str(lake / table)).to_pyarrow_table().to_pylist()
    return next((r["v"] for r in rows if r["id"] == key), None)


def _wait(what: str, probe: Any, timeout: float, app: subprocess.Popen) -> float:
    began = time.monotonic()
    while not probe():
        if app.poll() is not None:
            raise RuntimeError(f"the application exited ({app.returncode}) waiting for {what}")
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - began


def run(config: ReplicateConfig, root: Path, log: Any = print) -> dict[str, Any]:
    from connector.local import LocalTablestore

    root.mkdir(parents=True, exist_ok=True)
    store_path, out = root / "store.db", root / "out"
    lake = out / "lake"
    names = [f"t{i:03d}" for i in range(config.tables)]
    with LocalTablestore(store_path) as store:
        for name in names:
            store.create_table(name, [("id", "INTEGER")], [("v", "STRING")],
                               channels=config.channels)
            store.put_row(name, {"id": 0}, {"v": "first"})
    args = ["replicate", "--store", str(store_path), "--tables", "t*", "--output", str(out),
            "--target", f"delta://{lake}/{{table}}", "--trigger-ms", str(config.trigger_ms),
            "--option", f"tables.refreshIntervalMs={config.refresh_ms}"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "TABLESTORE_CDC_LOG_LEVEL": "WARNING"}
    with open(root / "replicate.log", "ab") as sink:
        app = subprocess.Popen([sys.executable, "-c", "from tablestore_cdc.cli import app; app()",
                                *args], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                               env=env, start_new_session=True)
    try:
        peak = 0.0
        began = time.monotonic()

        def all_applied() -> bool:
            nonlocal peak
            peak = max(peak, _rss_mb(app.pid))
            return all((lake / n / "_delta_log").exists() for n in names)

        start_s = _wait("every table applied", all_applied, 1800, app)
        log(f"replicate: {config.tables} tables applied after {start_s:.1f} s")
        rss = _rss_mb(app.pid)
        time.sleep(config.idle_s / 4)  # the last batches settle
        cpu0, t0 = _cpu_s(app.pid), time.monotonic()
        time.sleep(config.idle_s)
        idle = (_cpu_s(app.pid) - cpu0) / (time.monotonic() - t0)
        log(f"replicate: idle {idle:.2f} core(s), {rss:.0f} MB")
        latencies = []
        with LocalTablestore(store_path) as store:
            for i in range(config.freshness_writes):
                table = names[(i * 7) % len(names)]
                store.put_row(table, {"id": 0}, {"v": f"w{i}"})
                latencies.append(_wait(f"write {i}", lambda t=table, v=f"w{i}":
                                       _target_value(lake, t, 0) == v, 300, app))
                peak = max(peak, _rss_mb(app.pid))
            store.create_table("t_new", [("id", "INTEGER")], [("v", "STRING")],
                               channels=config.channels)
            store.put_row("t_new", {"id": 0}, {"v": "new"})
        new_s = _wait("the new table", lambda: _target_value(lake, "t_new", 0) == "new", 300,
                      app)
        latencies.sort()
        return {
            "tables": config.tables, "channels": config.channels,
            "replicate_start_s": round(start_s, 1),
            "replicate_rss_mb": round(rss), "replicate_peak_rss_mb": round(max(peak, rss)),
            "replicate_processes": len(_tree(app.pid)),
            "replicate_idle_cpu_cores": round(idle, 3),
            "replicate_freshness_p50_ms": round(median(latencies) * 1000),
            "replicate_freshness_p99_ms": round(latencies[min(len(latencies) - 1,
                                                              int(len(latencies) * 0.99))]
                                                * 1000),
            "replicate_new_table_s": round(new_s, 1),
            "wall_s": round(time.monotonic() - began, 1),
        }
    finally:
        from testkit.processes import kill_tree

        kill_tree(app.pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replicate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=ReplicateConfig.tables)
    parser.add_argument("--idle-s", type=float, default=ReplicateConfig.idle_s)
    parser.add_argument("--writes", type=int, default=ReplicateConfig.freshness_writes)
    args = parser.parse_args(argv)
    config = ReplicateConfig(tables=args.tables, idle_s=args.idle_s,
                             freshness_writes=args.writes)
    with tempfile.TemporaryDirectory(prefix="tablestore-bench-replicate-") as root:
        results = run(config, Path(root), log=lambda m: print(m, file=sys.stderr, flush=True))
    for key, value in results.items():
        print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
