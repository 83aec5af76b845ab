"""A short soak of the job's own maintenance (``tablestore_cdc.lakehouse.upkeep``), not in the
suite: ``python -m benchmarks.maintenance_soak --minutes 5 --tables 4`` (the 2-hour run of
docs/reliability.md: ``--minutes 120 --tables 10 --pause 2 --every 300``).

One writer thread per table applies small batches of puts and deletes (the change batches
the apply sink takes, ``testkit.lakehouse``) through the real Delta and Iceberg sinks (the
tables alternate between the formats), each sink with an ``Upkeep`` of the given policy, as
``replicate`` gives them; every ``--every`` seconds it prints, per table, its data files in the
current version, the files on disk, its snapshots (Iceberg) and the last maintenance run. One
reader thread per table reads the table's newest version all the while, as a query of the
target would (a read that fails on a file the maintenance removed is counted). At the end each
table is checked against the state its writer expects, and the peaks of its figures are
printed. Exit 1 if a table differs, a batch failed or a read failed.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tablestore_cdc.lakehouse.upkeep import MaintenancePolicy, Upkeep
from testkit.lakehouse import Delta, Iceberg, batch, change


class Writer(threading.Thread):
    """Applies batches to one table until ``stop`` is set; keeps the state they leave."""

    def __init__(self, target: Any, policy: MaintenancePolicy, pause_s: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.target, self.pause_s = target, pause_s
        self.sink = target.sink()
        self.sink.upkeep = Upkeep(policy)
        self.rng = random.Random(seed)
        self.state: dict[int, tuple[str, int]] = {}
        self.batches, self.seq = 0, 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.peaks: dict[str, int] = {}

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                changes = []
                for _ in range(self.rng.randint(1, 20)):
                    self.seq += 1
                    key = self.rng.randint(1, 2000)
                    if key in self.state and self.rng.random() < 0.2:
                        changes.append(change("DELETE", "c", self.seq, self.seq, key))
                        del self.state[key]
                    else:
                        self.state[key] = (f"v{self.seq}", self.seq)
                        changes.append(change("PUT", "c", self.seq, self.seq, key,
                                              *self.state[key]))
                self.sink.apply(batch(*changes), "soak", self.batches)
                self.batches += 1
                time.sleep(self.pause_s)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc

    def figures(self) -> str:
        """This table's figures now, in one line; the peaks are kept in ``self.peaks``."""
        table = self.sink.table()
        run = self.sink.upkeep.last_run
        if table is None:
            return "no table yet"
        root = Path(getattr(self.target, "path", None) or tmp_of(self.target))
        on_disk = sum(1 for p in root.rglob("*") if p.is_file())
        if isinstance(self.target, Iceberg):
            files = len(list(table.scan().plan_files()))
            snapshots = len(table.metadata.snapshots)
            head = f"{files} file(s), {snapshots} snapshot(s)"
        else:
            files, snapshots = len(table.file_uris()), 0
            head = f"{files} file(s), version {table.version()}"
        for name, value in (("files", files), ("snapshots", snapshots), ("on disk", on_disk)):
            self.peaks[name] = max(self.peaks.get(name, 0), value)
        last = "no maintenance yet" if run is None else run.describe()
        return f"{self.batches} batches; {head}; {on_disk} on disk; last: {last}"


class Reader(threading.Thread):
    """Reads one table's newest version again and again until ``stop`` is set, as a query of
    the target would while the job maintains it; counts the reads and keeps the failures."""

    def __init__(self, target: Any, pause_s: float) -> None:
        super().__init__(daemon=True)
        self.target, self.pause_s = target, pause_s
        self.reads, self.failures = 0, []  # type: ignore[var-annotated]
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.target.rows()
            except Exception as exc:  # noqa: BLE001 - reported at the end; before the first
                # read succeeds the table may not exist yet
                if self.reads:
                    self.failures.append(repr(exc))
            else:
                self.reads += 1
            self.stop.wait(self.pause_s)


def tmp_of(target: Any) -> str:
    return str(Path(target.properties["warehouse"].removeprefix("file://")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.maintenance_soak",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between reports")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between batches")
    parser.add_argument("--every-batches", type=int, default=20)
    parser.add_argument("--compact-files", type=int, default=16)
    parser.add_argument("--keep-snapshots", type=int, default=20)
    parser.add_argument("--vacuum-hours", type=float, default=1.0)
    parser.add_argument("--read-pause", type=float, default=1.0,
                        help="seconds between two reads of a table by its reader")
    parser.add_argument("--dir", type=Path, default=None, help="where the tables go")
    args = parser.parse_args(argv)
    policy = MaintenancePolicy(every_batches=args.every_batches,
                               compact_files=args.compact_files,
                               keep_snapshots=args.keep_snapshots,
                               vacuum_hours=args.vacuum_hours,
                               vacuum_every_minutes=10)
    root = args.dir or Path(tempfile.mkdtemp(prefix="maintenance-soak-"))
    writers = {}
    for n in range(args.tables):
        fmt = Delta if n % 2 == 0 else Iceberg
        writers[f"t{n}-{fmt.name}"] = Writer(fmt(root / f"t{n}"), policy, args.pause, seed=n)
    print(f"{args.tables} table(s) under {root}, {args.minutes} minute(s); policy {policy}")
    readers = {name: Reader(writer.target, args.read_pause) for name, writer in writers.items()}
    for thread in (*writers.values(), *readers.values()):
        thread.start()
    started = time.monotonic()
    deadline = started + args.minutes * 60
    while time.monotonic() < deadline and not any(w.error for w in writers.values()):
        time.sleep(min(args.every, max(deadline - time.monotonic(), 0)))
        for name, writer in writers.items():
            print(f"[{time.monotonic() - started:6.0f} s] {name}: {writer.figures()}",
                  flush=True)
    for thread in (*writers.values(), *readers.values()):
        thread.stop.set()
        thread.join()
    ok = True
    for name, writer in writers.items():
        reader = readers[name]
        first = f": {reader.failures[0]}" if reader.failures else ""
        print(f"{name}: {writer.batches} batches; peaks: {writer.peaks}; {reader.reads} reads, "
              f"{len(reader.failures)} failed{first}")
        ok = ok and not reader.failures
        if writer.error is not None:
            print(f"{name}: a batch failed: {writer.error!r}")
            ok = False
            continue
        rows = {r["id"]: (r["name"], r["qty"]) for r in writer.target.rows()}
        if rows != writer.state:
            print(f"{name}: the table differs from its writer's state")
            ok = False
    print("all tables as expected" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
