"""A soak over the emulator: many channels, splits and merges every few seconds, a query kill
every minute; memory, meta-table size and batch rate sampled; exactly-once checked at the end.

    python -m integration.netfaults soak --minutes 20 --changes 1000000 --channels 64

Where things run: the writer thread (integration/faults/workload.py, with a wide key space and
``channels`` +- 8 open channels, reshaping every ``reshape_every_s``) and the sampler run in the
harness process; the emulator in a child process; the query (``testkit.runner``,
``local[2]``) in its own process tree, SIGKILLed and restarted every ``kill_every_s`` (once
the running query stored a batch of its own: a kill during Spark's start proves nothing new).

The writer aims at ``changes`` in ``minutes``; when the query falls behind by more than
``max_backlog_s`` of writes it slows down to what the query absorbs (so the run ends in about
the time given, with the largest number of changes that fits on this machine, and says so).

Every ``sample_s`` it records: changes written and delivered, batches stored, the RSS of the
query's driver (its Python process and JVM), of its Python workers, and of the emulator, and
the rows of the meta table (bounded by ``metaRetentionBatches``, ``retention``: 10 by default,
so that a run of a few dozen batches shows the bound). The report gives lost and
duplicated changes, memory at the start, middle and end, the meta-table rows' maximum, and the
batches per minute.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from connector.local import LocalTablestore
from integration.faults.workload import TABLE, Writer
from integration.netfaults.harness import (
    INSTANCE,
    KEY_ID,
    META_TABLE,
    SECRET,
    emulator_process,
)
from integration.scenario import ScenarioResult, ScenarioRun
from testkit.processes import start_runner
from testkit.waiting import wait_until

log = logging.getLogger("integration.netfaults.soak")


@dataclass
class Sample:
    at_s: float
    written: int
    delivered: int
    batches: int
    driver_rss_mb: float
    workers_rss_mb: float
    emulator_rss_mb: float
    meta_rows: int
    query_age_s: float


@dataclass
class SoakResult(ScenarioResult):
    minutes: float = 0.0
    channels: int = 0
    target_changes: int = 0
    state_matches: bool = True
    kills: int = 0
    batches: int = 0
    drain_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "samples": [s.__dict__ for s in self.samples], "ok": self.ok}

    def report(self) -> str:
        lines = [f"soak: {self.minutes:g} min, {self.channels} channels, {self.changes} changes "
                 f"written (target {self.target_changes}), {self.splits} splits, {self.merges} "
                 f"merges, {self.kills} query kills, {self.batches} batches",
                 f"  lost={self.lost} duplicated={self.duplicated} "
                 f"out-of-order={self.out_of_order} state "
                 f"{'matches' if self.state_matches else 'DIFFERS'}; drained in "
                 f"{self.drain_s:.0f} s after the writer stopped"]
        if self.samples:
            lines.append("  minute  written  delivered  batches  driver-MB  workers-MB  "
                         "emulator-MB  meta-rows")
            for s in self.samples:
                lines.append(f"  {s.at_s / 60:6.1f}  {s.written:7d}  {s.delivered:9d}  "
                             f"{s.batches:7d}  {s.driver_rss_mb:9.0f}  {s.workers_rss_mb:10.0f}"
                             f"  {s.emulator_rss_mb:11.0f}  {s.meta_rows:9d}")
            per_minute = self.batches_per_minute()
            if per_minute:
                lines.append(f"  batches per minute: median {statistics.median(per_minute):.0f}"
                             f", min {min(per_minute)}, max {max(per_minute)}")
        lines.append("  PASS" if self.ok else "  FAIL: " + "; ".join(self.problems))
        return "\n".join(lines)

    def batches_per_minute(self) -> list[int]:
        counts: list[int] = []
        minute, last = 1, 0
        for s in self.samples:
            if s.at_s >= minute * 60:
                counts.append(s.batches - last)
                last = s.batches
                minute += 1
        return counts


def _rss_mb(processes: list[psutil.Process]) -> float:
    total = 0
    for p in processes:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


class Soak(ScenarioRun):
    """The soak's processes and files; ``run()`` (``ScenarioRun``'s) returns its
    ``SoakResult``."""

    result: SoakResult

    def __init__(self, workdir: Path, *, minutes: float = 20.0, changes: int = 1_000_000,
                 channels: int = 64, kill_every_s: float = 60.0, reshape_every_s: float = 4.0,
                 sample_s: float = 20.0, max_backlog_s: float = 45.0, retention: int = 10,
                 seed: int = 1) -> None:
        super().__init__("soak", workdir)
        self.minutes, self.target, self.channels = minutes, changes, channels
        self.kill_every_s, self.reshape_every_s = kill_every_s, reshape_every_s
        self.sample_s, self.max_backlog_s, self.seed = sample_s, max_backlog_s, seed
        self.retention = retention
        self.rate = self.target / (self.minutes * 60)
        self.emulator = emulator_process(self.store_path, self.dir / "emulator.log")
        self.runs = 0
        self.result = SoakResult("soak", minutes=minutes, channels=channels,
                                 target_changes=changes)

    def _args(self) -> list[str]:
        return ["--endpoint", f"http://127.0.0.1:{self.emulator.port}", "--table", TABLE,
                "--tunnel", "soak", "--checkpoint", str(self.dir / "checkpoint"),
                "--sink", str(self.sink.path), "--stop-file", str(self.dir / "stop"),
                "--trigger-ms", "500", "--option", f"instance.name={INSTANCE}",
                "--option", f"access.key.id={KEY_ID}", "--option", f"access.key.secret={SECRET}",
                "--option", f"checkpoint.table={META_TABLE}",
                "--option", "maxOffsetsPerChannel=2000",
                "--option", f"metaRetentionBatches={self.retention}"]

    def _start_query(self) -> None:
        self.runs += 1
        self.runner_log = self.dir / f"runner-{self.runs:03d}.log"
        self.runner = start_runner(self._args(), self.runner_log,
                                   {"TABLESTORE_CDC_LOG_LEVEL": "WARNING"})
        self.query_started = time.monotonic()
        self.batches_at_start = self.watcher.poll()

    def _sample(self, began: float, writer: Writer, meta_store: LocalTablestore) -> Sample:
        driver: list[psutil.Process] = []
        workers: list[psutil.Process] = []
        if self.runner is not None:
            try:
                root = psutil.Process(self.runner.pid)
                for p in [root, *root.children(recursive=True)]:
                    cmd = " ".join(p.cmdline())
                    (workers if "pyspark.daemon" in cmd or "pyspark.worker" in cmd
                     else driver).append(p)
            except psutil.Error:
                pass
        emulator = [psutil.Process(self.emulator.proc.pid)] if self.emulator.proc else []
        try:
            meta_rows = sum(1 for _ in meta_store.scan(META_TABLE))
        except Exception:  # noqa: BLE001 - the table may not exist yet
            meta_rows = -1
        batches = self.watcher.poll()
        return Sample(round(time.monotonic() - began, 1), writer.changes,
                      sum(self.watcher.ids.values()), batches, _rss_mb(driver),
                      _rss_mb(workers), _rss_mb(emulator), meta_rows,
                      round(time.monotonic() - self.query_started, 1))

    def make_writer(self) -> Writer:
        return Writer(self.store_path, f"soak:{self.seed}", rate=self.rate, keys=50_000,
                      reshape_every_s=self.reshape_every_s,
                      min_channels=max(2, self.channels - 8), max_channels=self.channels + 8)

    def execute(self, writer: Writer) -> None:
        r = self.result
        self.emulator.start()
        meta_view = LocalTablestore(self.store_path, create=False)
        try:
            self._start_query()
            wait_until("the first batch", lambda: self.watcher.poll() > 0, timeout=600,
                       process=self.runner)
            writer.start()
            began = time.monotonic()
            deadline = began + self.minutes * 60
            next_kill = began + self.kill_every_s
            next_sample = began
            while time.monotonic() < deadline and writer.changes < self.target:
                now = time.monotonic()
                if now >= next_sample:
                    sample = self._sample(began, writer, meta_view)
                    r.samples.append(sample)
                    log.info("soak: %s", sample)
                    backlog = sample.written - sample.delivered
                    writer.rate = (self.rate if backlog < self.rate * self.max_backlog_s
                                   else max(1.0, self.rate / 4))
                    next_sample = now + self.sample_s
                # a kill a minute, but never before this run of the query stored a batch of
                # its own: on a busy machine Spark's start can take most of a minute
                if now >= next_kill and self.watcher.poll() > self.batches_at_start:
                    self.kill_query()
                    r.kills += 1
                    self._start_query()
                    next_kill = now + self.kill_every_s
                if self.runner is not None and self.runner.poll() is not None:
                    raise AssertionError(f"the query exited with {self.runner.returncode}")
                if writer.error is not None:
                    raise AssertionError(f"the writer failed: {writer.error!r}")
                time.sleep(0.5)
            writer.finish()
            stopped = time.monotonic()
            self.wait_all_delivered(timeout=3600, interval=2.0)
            r.drain_s = round(time.monotonic() - stopped, 1)
            r.samples.append(self._sample(began, writer, meta_view))
            self.stop_query(stop_timeout=300)
        finally:
            meta_view.close()

    def verify(self) -> None:
        r = self.result
        r.batches = self.watcher.poll()
        v = self.verify_delivery()
        r.state_matches = not v.state_mismatches
        rows = [s.meta_rows for s in r.samples if s.meta_rows >= 0]
        if rows and max(rows[len(rows) // 2:]) > 2 * max(rows[: max(1, len(rows) // 2)]) + 500:
            r.problems.append(f"meta-table rows grew: {rows}")

    def close(self) -> None:
        self.emulator.kill()  # also when interrupted
