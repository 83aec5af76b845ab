"""Many tables in one application: ``tablestore-cdc replicate --tables`` over N tables x 4 channels.

What is measured (docs/performance.md, "Many tables"): a store with ``tables`` tables of
``channels`` channels each, one row each, read either from the embedded store file
(``--store``, keys ``replicate_*``) or over the Tablestore wire from the emulator
(``tablestore-cdc emulator`` in its own process on 127.0.0.1, serving the same kind of store
file; the meta table in the emulated instance; keys ``replicate_emulator_*``); the command
started as its own process (as a user starts it), into Delta targets from a template. Then:

- ``..._start_s``: from the start until every table's target exists (Spark's start, the
  first listing, every table's join batch and first batch, every first target commit);
- ``..._rss_mb``: the resident memory of the whole application summed over its process
  tree (the driver JVM, the command's Python, Spark's planning process and Python workers;
  psutil), once every table has been applied, and its peak over the run (the emulator, the
  service's stand-in, is not the application's and is not counted);
- ``..._idle_cpu_cores``: CPU seconds of the whole tree per wall second over ``idle_s`` with
  no writes (the planning loop polling every table); over the emulator also
  ``replicate_emulator_service_idle_cpu_cores``, the emulator's CPU answering those polls;
- ``..._freshness_p50_ms`` / ``_p99_ms``: from a write to one table (a row changed, the
  tables taken in turn) until its target shows it, one probe at a time, while a light write
  load is spread over every table (``load_writes_s`` rows a second, each into a random table;
  ``..._load_writes_s`` is the rate reached; ``..._load_cpu_cores`` the application's CPU
  per wall second over the probes, and over the emulator
  ``replicate_emulator_service_load_cpu_cores`` the emulator's, the service's stand-in,
  which shares the machine's two cores with the application);
- ``..._new_table_s``: from creating a table (with one row) until its target holds it
  (bounded by ``tables.refreshIntervalMs`` plus a batch);
- ``..._targets_equal``: the tables whose Delta target was read back equal to the source's
  rows once the writes stopped (the run fails if one is not within 600 s), and
  ``..._equal_after_s`` how long after the new table that took.

Writes go into the store file directly in both variants (the emulator serves that file).

``python -m benchmarks.replicate [--tables N] [--emulator]`` runs one variant alone and prints
its figures.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import INSTANCE, KEY_ID, SECRET, EmulatorProcess, median

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ReplicateConfig:
    tables: int = 100
    channels: int = 4
    idle_s: float = 20.0
    freshness_writes: int = 20
    #: the background write load during the freshness probes, rows a second over all tables
    load_writes_s: float = 20.0
    refresh_ms: int = 5_000
    trigger_ms: int = 500
    #: "local": the embedded store file; "emulator": the Tablestore wire, from the emulator
    backend: str = "local"
    #: ``replicate --cycle``: two queries (change log, then apply) or one
    cycle: str = "two"

    @property
    def prefix(self) -> str:
        """The figures' key prefix: ``replicate_`` or ``replicate_emulator_``."""
        return "replicate_" if self.backend == "local" else f"replicate_{self.backend}_"


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


def _cpu_by_process(pid: int) -> dict[int, tuple[str, float]]:
    """Each process of the application's tree: its kind (the JVM, the command's own Python:
    the driver, Spark's Python processes by module: the streaming source's planning runner,
    the workers' daemon, ...) and its CPU-seconds."""
    processes = {}
    for p in _tree(pid):
        try:
            cmdline, times = p.cmdline(), p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        if p.pid == pid:
            kind = "driver (python)"
        elif cmdline and cmdline[0].endswith("java"):
            kind = "jvm"
        else:
            modules = [a for a in cmdline if a.startswith("pyspark")]
            kind = modules[-1] if modules else " ".join(cmdline[:3])[:60]
        processes[p.pid] = (kind, times.user + times.system)
    return processes


def _cpu_between(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
                 ) -> dict[str, float]:
    """CPU-seconds by kind between two ``_cpu_by_process`` readings: each process alive at the
    second, less what it had used at the first (a process gone by then is left out rather
    than counted negative; its share of the window is lost)."""
    kinds: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        used = cpu - before.get(pid, (kind, 0.0))[1]
        kinds[kind] = kinds.get(kind, 0.0) + used
    return kinds


def _target_value(lake: Path, table: str, key: int) -> Any:
    import deltalake

    if not (lake / table / "_delta_log").exists():
        return None
    rows = deltalake.DeltaTable(str(lake / table)).to_pyarrow_table().to_pylist()
    return next((r["v"] for r in rows if r["id"] == key), None)


def _differing(store_path: Path, lake: Path, names: list[str]) -> list[str]:
    """The tables whose Delta target does not hold exactly the source's rows now."""
    import deltalake

    from connector.local import LocalTablestore

    differing = []
    with LocalTablestore(store_path) as store:
        for name in names:
            source = {pk["id"]: attrs.get("v") for pk, attrs in store.scan(name)}
            if not (lake / name / "_delta_log").exists():
                differing.append(name)
                continue
            rows = deltalake.DeltaTable(str(lake / name)).to_pyarrow_table(
                columns=["id", "v"]).to_pylist()
            if len(rows) != len(source) or {r["id"]: r["v"] for r in rows} != source:
                differing.append(name)
    return differing


def _wait(what: str, probe: Any, timeout: float, app: subprocess.Popen) -> float:
    began = time.monotonic()
    while not probe():
        if app.poll() is not None:
            raise RuntimeError(f"the application exited ({app.returncode}) waiting for {what}")
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - began


def _source(config: ReplicateConfig, root: Path, store_path: Path
            ) -> tuple[list[str], dict[str, str], EmulatorProcess | None]:
    """The command's source arguments, the environment they need, and the emulator serving
    the store (None for the embedded store)."""
    if config.backend == "local":
        return ["--store", str(store_path)], {}, None
    if config.backend != "emulator":
        raise ValueError(f"unknown backend {config.backend!r}: local or emulator")
    from cdc_common.credentials import ALIBABA_ACCESS_KEY_ID, ALIBABA_ACCESS_KEY_SECRET

    emulator = EmulatorProcess(store_path, root / "emulator.log", channels=config.channels)
    # the key pair from the environment, as a user's job takes it: the tunnels and the meta
    # table (tablestore_cdc_meta in the same instance, the default) both read it there
    return (["--endpoint", emulator.url, "--option", f"instance.name={INSTANCE}"],
            {ALIBABA_ACCESS_KEY_ID: KEY_ID, ALIBABA_ACCESS_KEY_SECRET: SECRET}, emulator)


class _WriteLoad:
    """A thread writing ``rate`` rows a second, each into a random table of ``names`` (keys
    from 1: the probes write key 0), from its ``with`` block's start to its end."""

    def __init__(self, store_path: Path, names: list[str], rate: float) -> None:
        self.store_path, self.names, self.interval = store_path, names, 1.0 / max(rate, 0.1)
        self.written, self.rate = 0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="write-load", daemon=True)

    def _run(self) -> None:
        from connector.local import LocalTablestore

        rng = random.Random(7)
        began = time.monotonic()
        with LocalTablestore(self.store_path) as store:
            while not self._stop.is_set():
                store.put_row(rng.choice(self.names), {"id": rng.randrange(1, 1000)},
                              {"v": f"load{self.written}"})
                self.written += 1
                lead = began + self.written * self.interval - time.monotonic()
                if lead > 0:
                    self._stop.wait(lead)
        self.rate = self.written / max(time.monotonic() - began, 1e-9)

    def __enter__(self) -> _WriteLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


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
    source, source_env, emulator = _source(config, root, store_path)
    args = ["replicate", *source, "--tables", "t*", "--output", str(out),
            "--target", f"delta://{lake}/{{table}}", "--trigger-ms", str(config.trigger_ms),
            "--option", f"tables.refreshIntervalMs={config.refresh_ms}",
            "--cycle", config.cycle]
    env = {**os.environ, **source_env, "PYSPARK_PYTHON": sys.executable,
           "TABLESTORE_CDC_LOG_LEVEL": "WARNING"}
    name = f"replicate ({config.backend}, --cycle {config.cycle})"
    try:
        with open(root / "replicate.log", "ab") as sink:
            app = subprocess.Popen(
                [sys.executable, "-c", "from tablestore_cdc.commands.app import app; app()", *args],
                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        try:
            peak = 0.0
            began = time.monotonic()

            def all_applied() -> bool:
                nonlocal peak
                peak = max(peak, _rss_mb(app.pid))
                return all((lake / n / "_delta_log").exists() for n in names)

            start_s = _wait("every table applied", all_applied, 1800, app)
            log(f"{name}: {config.tables} tables applied after {start_s:.1f} s")
            rss = _rss_mb(app.pid)
            time.sleep(config.idle_s / 4)  # the last batches settle
            processes0, t0 = _cpu_by_process(app.pid), time.monotonic()
            service0 = _cpu_s(emulator.pid) if emulator else 0.0
            time.sleep(config.idle_s)
            idle_wall = time.monotonic() - t0
            used = _cpu_between(processes0, _cpu_by_process(app.pid))
            idle = sum(used.values()) / idle_wall
            idle_by_kind = {k: round(v / idle_wall, 3) for k, v in used.items()}
            log(f"{name}: idle cores by process: {idle_by_kind}")
            service_idle = (_cpu_s(emulator.pid) - service0) / idle_wall if emulator else 0.0
            log(f"{name}: idle {idle:.2f} core(s), {rss:.0f} MB")
            latencies = []
            load = _WriteLoad(store_path, names, config.load_writes_s)
            cpu0, t0 = _cpu_s(app.pid), time.monotonic()
            service0 = _cpu_s(emulator.pid) if emulator else 0.0
            with load, LocalTablestore(store_path) as store:
                for i in range(config.freshness_writes):
                    table = names[(i * 7) % len(names)]
                    store.put_row(table, {"id": 0}, {"v": f"w{i}"})
                    latencies.append(_wait(f"write {i}", lambda t=table, v=f"w{i}":
                                           _target_value(lake, t, 0) == v, 300, app))
                    peak = max(peak, _rss_mb(app.pid))
                load_wall = time.monotonic() - t0
                load_cpu = (_cpu_s(app.pid) - cpu0) / load_wall
                service_load = ((_cpu_s(emulator.pid) - service0) / load_wall if emulator
                                else 0.0)
                store.create_table("t_new", [("id", "INTEGER")], [("v", "STRING")],
                                   channels=config.channels)
                store.put_row("t_new", {"id": 0}, {"v": "new"})
            new_s = _wait("the new table", lambda: _target_value(lake, "t_new", 0) == "new",
                          300, app)
            processes = len(_tree(app.pid))
            # every target equal to its source once the writes stopped (each table read whole)
            remaining = names + ["t_new"]

            def all_equal() -> bool:  # only the tables that differed last time read again
                remaining[:] = _differing(store_path, lake, remaining)
                return not remaining

            equal_s = _wait("every target equal to its source", all_equal, 600, app)
            peak = max(peak, _rss_mb(app.pid))
        finally:
            from testkit.processes import kill_tree

            kill_tree(app.pid)
    finally:
        if emulator is not None:
            emulator.stop()
    latencies.sort()
    p = config.prefix
    figures = {
        f"{p}start_s": round(start_s, 1),
        f"{p}rss_mb": round(rss), f"{p}peak_rss_mb": round(max(peak, rss)),
        f"{p}processes": processes,
        f"{p}idle_cpu_cores": round(idle, 3),
        f"{p}freshness_p50_ms": round(median(latencies) * 1000),
        f"{p}freshness_p99_ms": round(
            latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000),
        f"{p}new_table_s": round(new_s, 1),
        f"{p}load_writes_s": round(load.rate, 1),
        f"{p}load_cpu_cores": round(load_cpu, 3),
        f"{p}targets_equal": len(names) + 1,
        f"{p}equal_after_s": round(equal_s, 1),
    }
    if emulator is not None:
        figures[f"{p}service_idle_cpu_cores"] = round(service_idle, 3)
        figures[f"{p}service_load_cpu_cores"] = round(service_load, 3)
    return {"tables": config.tables, "channels": config.channels, "backend": config.backend,
            "cycle": config.cycle, **figures, "wall_s": round(time.monotonic() - began, 1)}


def interleaved(configs: list[ReplicateConfig], repeat: int, log: Any = print
                ) -> list[dict[str, Any]]:
    """Each of ``configs`` run ``repeat`` times, in turn (a, b, a, b, ...), so that both sides
    of a comparison share the machine's load; each run's figures with the load average
    (1 min) before it."""
    runs = []
    for round_ in range(repeat):
        for config in configs:
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="tablestore-bench-replicate-") as root:
                figures = run(config, Path(root), log=log)
            runs.append({"round": round_ + 1, "load_before": round(load, 2), **figures})
            log(f"round {round_ + 1}, --cycle {config.cycle}: " + ", ".join(
                f"{k.removeprefix(config.prefix)} {v}" for k, v in figures.items()
                if k.startswith(config.prefix)))
    return runs


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure per cycle over ``interleaved``'s runs."""
    result: dict[str, Any] = {}
    for cycle in dict.fromkeys(r["cycle"] for r in runs):
        mine = [r for r in runs if r["cycle"] == cycle]
        for key, value in mine[0].items():
            if isinstance(value, (int, float)) and key not in ("round", "tables", "channels"):
                result[f"{key} (--cycle {cycle})"] = round(median([r[key] for r in mine]), 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replicate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=ReplicateConfig.tables)
    parser.add_argument("--channels", type=int, default=ReplicateConfig.channels)
    parser.add_argument("--idle-s", type=float, default=ReplicateConfig.idle_s)
    parser.add_argument("--writes", type=int, default=ReplicateConfig.freshness_writes)
    parser.add_argument("--emulator", action="store_true",
                        help="read over the Tablestore wire from the emulator (127.0.0.1)")
    parser.add_argument("--trigger-ms", type=int, default=ReplicateConfig.trigger_ms,
                        help="replicate --trigger-ms (0: the command's default)")
    parser.add_argument("--load-writes-s", type=float, default=ReplicateConfig.load_writes_s,
                        help="rows a second spread over the tables during the probes")
    parser.add_argument("--cycles", default="two",
                        help="replicate --cycle values to run, comma-separated, interleaved")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of the interleaved runs; medians printed")
    args = parser.parse_args(argv)
    configs = [ReplicateConfig(tables=args.tables, channels=args.channels, idle_s=args.idle_s,
                               freshness_writes=args.writes, trigger_ms=args.trigger_ms,
                               load_writes_s=args.load_writes_s, cycle=cycle,
                               backend="emulator" if args.emulator else "local")
               for cycle in args.cycles.split(",")]
    runs = interleaved(configs, args.repeat,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    for figures in runs:
        print(" ".join(f"{k}={v}" for k, v in figures.items()))
    for key, value in medians(runs).items():
        print(f"{key:60} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
