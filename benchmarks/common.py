"""Shared pieces of the benchmarks: machine facts, store filling, timing helpers.

Nothing here measures anything by itself; the benchmark modules call these helpers in the main
benchmark process (the Spark driver when a benchmark needs Spark).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from connector.local import LocalTablestore
from connector.tunnel.local.channels import KEY_SPACE
from connector.tunnel.local.values import dumps_values, key_hash
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # the emulator's test instance and keys

#: the row shape every Spark benchmark reads: key, a short string, an integer
TABLE = "bench"
PRIMARY_KEY = [("id", "INTEGER")]
COLUMNS = [("name", "STRING"), ("qty", "INTEGER")]

#: rows per ``batch_write`` call when pre-filling a store
FILL_CHUNK = 2000


def machine_facts() -> dict[str, Any]:
    """What the figures were measured on (cores, interpreter, PySpark, load)."""
    import pyarrow
    import pyspark

    load = os.getloadavg()
    return {
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "pyspark": pyspark.__version__,
        "pyarrow": pyarrow.__version__,
        "platform": platform.platform(),
        "load_avg_1_5_15": [round(x, 2) for x in load],
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def tree_cpu_s(pid: int | None = None) -> float:
    """CPU-seconds (user + system) of process ``pid`` (this one by default) and every live
    descendant, with what their waited-for children used: for the benchmark's own process that
    is the driver, its JVM and the Python workers, also those that ended."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class TreeCpuSampler:
    """The CPU-seconds of a process tree that starts and ends while this samples it: every
    ``every`` seconds (a thread of the benchmark process), each process's cumulative CPU
    (``psutil``, with its waited-for children's); ``stop()`` returns the sum of the last
    readings. A process's last ``every`` seconds before it ends can be missed, and a process
    whose parent ended before it (the JVM orphaned at the driver's exit) is followed no more:
    a small undercount, the same for every run compared."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self._root = pid
        self._every = every
        self._seen: dict[tuple[int, float], float] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        try:
            root = psutil.Process(self._root)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            try:
                with proc.oneshot():
                    t = proc.cpu_times()
                    key = (proc.pid, proc.create_time())
            except psutil.NoSuchProcess:
                continue
            self._seen[key] = t.user + t.system + t.children_user + t.children_system

    def _loop(self) -> None:
        while not self._done.is_set():
            self._sample()
            self._done.wait(self._every)

    def stop(self) -> float:
        self._sample()
        self._done.set()
        self._thread.join()
        return sum(self._seen.values())


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]) of a non-empty sample."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed wall time in seconds."""
    out: list[float] = []
    started = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - started)


def create_bench_table(store: LocalTablestore, channels: int, table: str = TABLE,
                       columns: Sequence[tuple[str, str]] = COLUMNS) -> None:
    store.create_table(table, primary_key=PRIMARY_KEY, columns=list(columns), channels=channels)


def channel_index(key: int, channels: int) -> int:
    """Which of ``channels`` equal hash ranges (as ``create_table`` cuts them) owns ``id=key``."""
    step = KEY_SPACE // channels
    return min(key_hash(dumps_values({"id": key})) // step, channels - 1)


def keys_per_channel(channels: int, per_channel: int) -> list[list[int]]:
    """For each channel of a freshly created table, ``per_channel`` integer keys it owns."""
    found: list[list[int]] = [[] for _ in range(channels)]
    missing = channels
    key = 0
    while missing:
        bucket = found[channel_index(key, channels)]
        if len(bucket) < per_channel:
            bucket.append(key)
            if len(bucket) == per_channel:
                missing -= 1
        key += 1
    return found


def fill(store: LocalTablestore, records: int, table: str = TABLE, keys: int = 50_000) -> float:
    """Append ``records`` changes (PUT 70 %, UPDATE 20 %, DELETE 10 %, over ``keys`` keys) in
    chunks of ``FILL_CHUNK``; returns the writes per second achieved."""
    started = time.perf_counter()
    for lo in range(0, records, FILL_CHUNK):
        ops: list[Any] = []
        for i in range(lo, min(records, lo + FILL_CHUNK)):
            key = {"id": i % keys}
            kind = i % 10
            if kind == 9:
                ops.append(("delete", key, None))
            elif kind in (3, 6):
                ops.append(("update", key, {"qty": i}))
            else:
                ops.append(("put", key, {"name": f"name-{i:08d}", "qty": i}))
        store.batch_write(table, ops)
    return records / (time.perf_counter() - started)


def progress_breakdown(progress: Sequence[Any]) -> dict[str, float]:
    """Median milliseconds per phase (Spark's ``durationMs``: latestOffset, queryPlanning,
    walCommit, addBatch, commitOffsets, triggerExecution, ...) over the given progress reports."""
    keys = sorted({k for p in progress for k in p["durationMs"]})
    return {k: median([p["durationMs"].get(k, 0) for p in progress]) for k in keys}


def read_bench_table(spark: Any, store: Path) -> Any:
    """A streaming read of the embedded store's benchmark table through a new tunnel, with
    the source's default options (what ``replicate`` reads)."""
    return (spark.readStream.format("tablestore").option("endpoint", f"local://{store}")
            .option("table.name", TABLE)
            .option("tunnel.name", f"bench-{uuid.uuid4().hex[:8]}").load())


def commit_times(checkpoint: Path) -> dict[int, float]:
    """A streaming query's committed batches and when each ended: batch id -> the mtime of
    its file in the checkpoint's commit log."""
    return {int(p.name): p.stat().st_mtime for p in (checkpoint / "commits").iterdir()
            if p.name.isdigit()}


class EmulatorProcess:
    """``tablestore-cdc emulator`` over ``store`` in its own process on 127.0.0.1 (a free port),
    as a user starts it; ``url`` once it listens, ``pid`` for its CPU, ``stop()`` ends it."""

    def __init__(self, store: Path, log: Path, channels: int = 4) -> None:
        cli = str(Path(sys.executable).with_name("tablestore-cdc"))
        with open(log, "ab") as errors:
            self.proc = subprocess.Popen(
                [cli, "emulator", "--store", str(store), "--instance", INSTANCE,
                 "--access-key-id", KEY_ID, "--access-key-secret", SECRET,
                 "--host", "127.0.0.1", "--port", "0", "--channels", str(channels)],
                stdout=subprocess.PIPE, stderr=errors, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"emulator did not start: {line!r} (see {log})")
        self.url = line.removeprefix("listening on ")
        self.pid = self.proc.pid

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
