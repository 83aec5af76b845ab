"""Run one fault scenario against real processes and verify exactly-once and per-key order.

Where things run:
- this module runs in the **harness process** (``python -m integration.faults`` or pytest); so
  does the scenario's ``Writer`` thread, which keeps writing through every kill;
- the query runs in a **runner process** (``testkit.runner``: the Spark driver, its JVM,
  the planning Python process, Python workers; in ``local-cluster`` mode also executor JVMs and
  their workers), started with ``testkit.crash_points.environment`` naming the scenario's
  fault directory, so every one of them installs the crash points' hook and they can be
  armed from here;
- a kill is ``testkit.processes.kill_tree``: SIGKILL of the runner and every descendant at
  once; a sweep then SIGKILLs any straggler that slipped out of the tree (a worker forked while
  the tree was collected), found by pid through the scenario's unique fault directory in its
  environment;
- a duplicate read (``DuplicateRead``) runs ``testkit.partition_reads.read_partition`` in a
  separate process (``integration.faults.duplicate``) on the very partition a Spark task is
  reading;
- the DynamoDB meta store of a cluster scenario is a moto server on 127.0.0.1 in a child
  process.

A scenario: a fresh local store, a writer with splits and merges, the runner writing into an
``ExactlyOnceParquetSink``, the scenario's steps (kills at crash points, kills at random times,
failing tasks, duplicate reads), a restart after each kill on the same checkpoint, and at the
end: stop writing, wait until every change in the store's change log is in the sink, stop the
query through its stop file, and verify (``tablestore_cdc.verify``): nothing lost, nothing
duplicated, every key's changes in source order, the table rebuilt from the sink equal to the
store's, every replay of a stored batch identical, and no stored batch rewritten. The run's
skeleton, the result's common fields and those checks are ``integration/scenario.py``'s, shared
with the network-fault harnesses.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from connector.clients import FAULT_HOOK_ENV
from integration.faults.workload import KEY_COLUMNS, TABLE, Writer, preload
from integration.scenario import (
    ScenarioResult,
    ScenarioRun,
    run_and_tidy,
)
from tablestore_cdc.verify import read_delta, table_state
from testkit.aws import AWS_TEST_ENV, start_moto_server, stop_moto_server
from testkit.crash_points import FAULT_DIR_ENV
from testkit.crash_points import environment as crash_environment
from testkit.crash_points import spark_conf as crash_spark_conf
from testkit.flaky import FLAKY_ENV, FLAKY_LOG, FLAKY_SEED_ENV
from testkit.flaky import environment as flaky_environment
from testkit.processes import REPO, arm_crash_point, kill_marked, start_runner
from testkit.target_reads import history_mismatches, read_iceberg, source_history, table_history
from testkit.waiting import wait_until

log = logging.getLogger("integration.faults")

#: how long a runner may take to start Spark and run its first batch (2 cores, maybe shared)
STARTUP_TIMEOUT_S = 300.0
#: crash points that run in Python workers on executors
EXECUTOR_POINTS = ("read_before_claim", "mid_read")
#: Spark's log lines for a failed task attempt: the executor's ERROR (the only one left with the
#: package's quiet log4j settings) or the scheduler's WARN, not for a task killed because the
#: query stopped; counted by task id (TID)
FAILED_TASK = re.compile(r"Exception in task \S+ in stage \S+ \(TID (\d+)\)"
                         r"|Lost task \S+ in stage \S+ \(TID (\d+)\) \([^)]*\): (?!TaskKilled)")


# --- steps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrashAt:
    """Arm ``point``, wait until a process parks there, SIGKILL the tree, restart. The step
    first waits until the query has caught up with the writer, unless ``early`` (then the
    first pass of the point after the step starts is hit: e.g. during a first load)."""

    point: str
    early: bool = False

    def describe(self) -> str:
        return f"kill at {self.point}" + (" (early)" if self.early else "")


@dataclass(frozen=True)
class RandomKill:
    """SIGKILL the tree ``delay_s`` after the query started (``during_startup``: after the
    process started, usually while Spark is still starting or replaying), then restart."""

    delay_s: float
    during_startup: bool = False

    def describe(self) -> str:
        return f"kill {self.delay_s:.1f}s after {'start' if self.during_startup else 'query start'}"


@dataclass(frozen=True)
class FailTask:
    """Arm ``point`` to raise once on an executor: a task fails and Spark retries it."""

    point: str

    def describe(self) -> str:
        return f"task fails at {self.point}"


@dataclass(frozen=True)
class DuplicateRead:
    """Hold a Spark task at ``point``, read the same partition in another process, release."""

    point: str

    def describe(self) -> str:
        return f"duplicate read at {self.point}"


Step = CrashAt | RandomKill | FailTask | DuplicateRead


@dataclass(frozen=True)
class Scenario:
    """One scenario: its faults (``steps``, in order) and the query's and writer's settings."""

    name: str
    why: str
    steps: tuple[Step, ...] = ()
    commit_interval: int = 1
    master: str = "local[2]"
    #: share of tunnel and meta-store calls that fail transiently (TABLESTORE_CDC_FLAKY)
    flaky: float = 0.0
    meta: str = "sqlite"  # or "dynamodb" (a moto server on 127.0.0.1)
    channels: int = 4
    options: tuple[tuple[str, str], ...] = (("maxOffsetsPerChannel", "40"),)
    conf: tuple[tuple[str, str], ...] = ()
    rate: float = 30.0
    #: keep writing at least this long after the last step (changes after the last restart)
    tail_s: float = 3.0
    #: the run must have split and merged channels (the writer makes sure it does)
    splits_required: bool = True
    #: also apply every batch into a table: "delta" or "iceberg" (tablestore_cdc.lakehouse)
    target: str | None = None
    scd: int = 1
    #: read over the wire: an emulator (in this process) serves the store file; the query reads
    #: its Tunnel API and keeps its meta table in the emulated instance
    wire: bool = False
    #: rows written (PUTs of keys the writer never touches) before the query starts: its first
    #: batches are a first load of the table
    preload: int = 0
    #: appended batches of at least this many rows are written by Spark's executors (Delta)
    executor_write_rows: int | None = None

    @property
    def kills(self) -> int:
        return sum(isinstance(s, CrashAt | RandomKill) for s in self.steps)


@dataclass(frozen=True)
class Duplicate:
    """What a duplicate read gave, and how many records the held Spark attempt had."""

    point: str
    channel_id: str
    records: list[tuple[str, str]]
    held_records: int


@dataclass
class Result(ScenarioResult):
    kills: int = 0
    delivered: int = 0
    state_mismatches: int = 0
    restarts: int = 0
    injected_errors: int = 0
    task_failures: int = 0
    duplicate_reads: int = 0
    #: duplicate reads that claimed more than the held attempt had read (it then followed them)
    duplicates_ahead: int = 0
    #: rows of the applied table (live rows) and keys whose row or history differs from the source
    target_rows: int = 0
    target_mismatches: int = 0
    #: crash points reached, with where the process was (``mid_read@executor-jvm``)
    hits: list[str] = field(default_factory=list)

    def line(self) -> str:
        extra = []
        if self.injected_errors:
            extra.append(f"transient-errors={self.injected_errors}")
        if self.task_failures:
            extra.append(f"task-failures={self.task_failures}")
        if self.target_rows or self.target_mismatches:
            extra.append(f"table-rows={self.target_rows} table-mismatches="
                         f"{self.target_mismatches}")
        if self.duplicate_reads:
            extra.append(f"duplicate-reads={self.duplicate_reads}"
                         f" (ahead={self.duplicates_ahead})")
        verdict = "PASS" if self.ok else "FAIL: " + "; ".join(self.problems)
        return (f"{self.name:<30} kills={self.kills:<3d} changes={self.changes:<6d} "
                f"lost={self.lost} duplicated={self.duplicated} "
                f"out-of-order={self.out_of_order} replays={self.replays}"
                f"{'' if self.replays_identical else ' (DIFFERENT)'} "
                f"{' '.join(extra) + ' ' if extra else ''}"
                f"{self.seconds:.0f}s {verdict}")


# --- the applied table (Delta or Iceberg) -----------------------------------------------------

#: the emulated instance of wire scenarios, its throwaway key, and the reader's options
WIRE_INSTANCE = "faults"
WIRE_KEY_ID = "faults-key"
WIRE_SECRET = "faults-Secret-2Lk9"
WIRE_OPTIONS = {
    "instance.name": WIRE_INSTANCE, "access.key.id": WIRE_KEY_ID,
    "access.key.secret": WIRE_SECRET, "checkpoint.table": "cdc_meta",
    "catalog": '{"columns": {"id": {"type": "long"}, "name": {"type": "string"}, '
               '"qty": {"type": "long"}}}',
}


@dataclass(frozen=True)
class TargetTable:
    """Where a scenario's apply sink writes, and how to read it back without the sink."""

    kind: str
    uri: str
    location: str

    @classmethod
    def of(cls, kind: str, directory: Path) -> TargetTable:
        if kind == "delta":
            path = directory / "delta" / TABLE
            return cls(kind, f"delta://{path}", str(path))
        if kind == "iceberg":
            warehouse = directory / "warehouse"
            return cls(kind, f"iceberg://{warehouse}?table=cdc.{TABLE}", str(warehouse))
        raise ValueError(f"unknown target {kind!r}: delta or iceberg")

    def rows(self) -> list[dict[str, Any]]:
        if self.kind == "delta":
            return read_delta(self.location)
        from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

        return read_iceberg(sqlite_catalog_properties(self.location), f"cdc.{TABLE}")


# --- the run ------------------------------------------------------------------------------------


class FaultScenarioRun(ScenarioRun):
    """One fault scenario's processes and files; ``run()`` (``ScenarioRun``'s) returns its
    ``Result``."""

    result: Result

    def __init__(self, scenario: Scenario, workdir: Path, seed: int) -> None:
        super().__init__(scenario.name, workdir)
        self.scenario = scenario
        self.seed = seed
        self.channels = scenario.channels
        self.wire = scenario.wire
        self.faults = self.dir / "faults"
        self.faults.mkdir()
        self.incarnation = 0
        self.started_at = 0.0
        self.moto: subprocess.Popen | None = None
        self.meta_uri: str | None = None
        self.extra_env: dict[str, str] = {}
        self.result = Result(scenario.name, kills=0)
        self.duplicates: list[Duplicate] = []
        self.emulator: Any = None
        self.target = TargetTable.of(scenario.target, self.dir) if scenario.target else None

    # --- processes -----------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(self.extra_env)
        if self.scenario.flaky:  # the transient errors: the client seam's fault hook
            env.update(flaky_environment(self.scenario.flaky, f"{self.seed}:{self.incarnation}"))
        env.update(crash_environment(self.faults, env.get("PYTHONPATH")))  # the crash points
        return env

    def _args(self) -> list[str]:
        source = (["--endpoint", self.emulator.url] if self.emulator is not None
                  else ["--store", str(self.store_path)])
        args = [*source, "--table", TABLE, "--tunnel", "faults",
                "--checkpoint", str(self.dir / "checkpoint"), "--sink", str(self.sink.path),
                "--stop-file", str(self.stop_file), "--master", self.scenario.master,
                "--option", f"commitInterval={self.scenario.commit_interval}"]
        if self.emulator is not None:
            for key, value in WIRE_OPTIONS.items():
                args += ["--option", f"{key}={value}"]
        if self.target is not None:
            args += ["--target", self.target.uri, "--scd", str(self.scenario.scd)]
            if self.scenario.executor_write_rows is not None:
                args += ["--executor-write-rows", str(self.scenario.executor_write_rows)]
        for key, value in self.scenario.options:
            args += ["--option", f"{key}={value}"]
        for key, value in [*self.scenario.conf, *crash_spark_conf(self.faults).items()]:
            args += ["--conf", f"{key}={value}"]  # the crash points' hook in executors too
        if self.meta_uri:
            args += ["--meta-store", self.meta_uri]
        return args

    def start(self) -> None:
        self.incarnation += 1
        self.runner_log = self.dir / f"runner-{self.incarnation:02d}.log"
        self.runner = start_runner(self._args(), self.runner_log, self._env())
        self.started_at = time.monotonic()
        log.info("%s: runner #%d started (pid %d)", self.scenario.name, self.incarnation,
                 self.runner.pid)

    def kill(self) -> None:
        assert self.runner is not None
        killed = self.kill_query()
        killed += self.sweep()
        self.result.kills += 1
        log.info("%s: killed %d process(es)", self.scenario.name, killed)

    def restart(self) -> None:
        for hit in self.faults.glob("hit-*"):
            hit.unlink()
        self.result.restarts += 1
        self.start()

    def sweep(self) -> int:
        """SIGKILL every process (by pid) whose environment carries this scenario's fault
        directory: stragglers of a killed tree. Only processes this harness started have it."""
        return kill_marked(FAULT_DIR_ENV, str(self.faults))

    def wait_query_started(self) -> None:
        assert self.runner is not None
        log_path = self.runner_log
        wait_until("the query to start", lambda: "runner: query" in log_path.read_text(
            errors="replace"), timeout=STARTUP_TIMEOUT_S, process=self.runner)

    def wait_caught_up(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Wait until the sink holds every change written so far: the query has caught up with
        the writer, so its reads stop at "nothing more now", not at a cap. A crash there is the
        telling case: by the replay more data exists, and a reader that does not stop at the
        recorded end would read it (and duplicate it, or lose it behind a skipped batch)."""
        self.wait_new_batch(timeout)
        deadline = time.monotonic() + timeout
        while True:  # until the changes written meanwhile are delivered within a few seconds
            began = time.monotonic()
            written = self.written()
            wait_until("the query to catch up with the writer",
                       lambda w=written: self.watcher.covers(w),
                       timeout=max(1.0, deadline - began), interval=0.3, process=self.runner)
            if time.monotonic() - began < 3.0:
                break
        self.wait_new_batch(timeout)

    def wait_new_batch(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Wait until the sink stores a batch it did not have (the query makes progress)."""
        before = self.watcher.poll()
        wait_until(f"a new batch in the sink (it held {before})", self.watcher.poll,
                   lambda batches: batches > before, timeout=timeout, process=self.runner)

    def wait_hit(self, point: str, timeout: float = 240.0) -> None:
        hit = self.faults / f"hit-{point}"
        wait_until(f"a process to reach crash point {point}", hit.exists, timeout=timeout,
                   process=self.runner)
        where = _where(int(hit.read_text()))
        self.result.hits.append(f"{point}@{where}")
        if (self.scenario.master.startswith("local-cluster") and point in EXECUTOR_POINTS
                and where != "executor-jvm"):
            raise AssertionError(f"{point} was reached in the {where} process, not under an "
                                 "executor JVM: the cluster scenario does not test what it says")

    def arm(self, point: str, mode: str = "park") -> None:
        arm_crash_point(self.faults, point, mode)

    # --- steps ----------------------------------------------------------------------------------

    def step(self, step: Step) -> None:
        log.info("%s: %s", self.scenario.name, step.describe())
        if isinstance(step, CrashAt):
            if not step.early:
                self.wait_caught_up()
            self.arm(step.point)
            self.wait_hit(step.point)
            self.kill()
            self.restart()
        elif isinstance(step, RandomKill):
            if step.during_startup:
                remaining = self.started_at + step.delay_s - time.monotonic()
                _sleep_watching(remaining, self.runner)
            else:
                self.wait_query_started()
                _sleep_watching(step.delay_s, self.runner)
            self.kill()
            self.restart()
        elif isinstance(step, FailTask):
            self.wait_caught_up()
            self.arm(step.point, "raise")
            self.wait_hit(step.point)
            self.wait_new_batch()  # the batch got through with the retried task
        elif isinstance(step, DuplicateRead):
            self.wait_caught_up()
            self.arm(step.point, "hold")
            self.wait_hit(step.point)
            time.sleep(1.0)  # let the channel grow: the duplicate reads further if it can
            self.duplicates.append(self.read_duplicate(step.point))
            (self.faults / f"release-{step.point}").touch()
            self.wait_new_batch()

    def read_duplicate(self, point: str) -> Duplicate:
        """Read the held task's partition in another process."""
        pickled = self.faults / f"hit-{point}.pkl"
        out = self.dir / f"duplicate-{len(self.duplicates)}.json"
        env = {k: v for k, v in os.environ.items()
               if k not in (FAULT_DIR_ENV, FAULT_HOOK_ENV, FLAKY_ENV, FLAKY_SEED_ENV)}
        env.update(self.extra_env)
        done = subprocess.run(
            [sys.executable, "-m", "integration.faults.duplicate", str(pickled), str(out)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
        )
        if done.returncode != 0:
            raise AssertionError(f"the duplicate reader failed: {done.stderr[-2000:]}")
        data = json.loads(out.read_text())
        self.result.duplicate_reads += 1
        duplicate = Duplicate(point, data["channel_id"], [tuple(r) for r in data["records"]],
                              data["held_records"])
        if len(duplicate.records) > duplicate.held_records:
            self.result.duplicates_ahead += 1
        log.info("%s: duplicate read of %s at %s: %d record(s), the held attempt %d",
                 self.scenario.name, duplicate.channel_id, point, len(duplicate.records),
                 duplicate.held_records)
        return duplicate

    # --- the whole scenario -----------------------------------------------------------------------

    def make_writer(self) -> Writer:
        return Writer(self.store_path, f"{self.seed}:{self.scenario.name}", rate=self.scenario.rate)

    def execute(self, writer: Writer) -> None:
        s = self.scenario
        if s.preload:
            preload(self.store_path, s.preload)
        if s.meta == "dynamodb":
            self._start_moto()
        if s.wire:
            self._start_emulator()
        writer.start()
        self.start()
        for step in s.steps:
            self.step(step)
        self.wait_new_batch()
        time.sleep(s.tail_s)  # let time pass: the writer goes on, the query follows
        writer.finish()
        self.drain_and_stop()

    def cleanup_actions(self, writer: Writer) -> list[tuple[str, Callable[[], Any]]]:
        return [*super().cleanup_actions(writer), ("sweep", self.sweep),
                ("moto", self._stop_moto),
                ("emulator", lambda: self.emulator.stop() if self.emulator is not None else None)]

    def _logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("runner-*")))

    def verify(self) -> None:
        r = self.result
        source_rows = self.source_rows()
        change_log = self.change_log()
        if self.target is not None:
            self._verify_target(change_log, source_rows)
        v = self.verify_delivery(change_log, source_rows,
                                 splits_required=self.scenario.splits_required)
        r.delivered, r.state_mismatches = v.delivered, v.state_mismatches or 0
        sink_kills = sum(s == CrashAt("after_sink_write") for s in self.scenario.steps)
        if r.replays < sink_kills:
            r.problems.append(f"{sink_kills} kill(s) after the sink write but only {r.replays} "
                              "replay(s) of a stored batch")
        logs = self._logs()
        r.task_failures = len({a or b for a, b in FAILED_TASK.findall(logs)})
        expected_failures = sum(isinstance(s, FailTask) for s in self.scenario.steps)
        if expected_failures:
            injected = logs.count("InjectedFault")
            if r.task_failures < expected_failures or injected < expected_failures:
                r.problems.append(f"{expected_failures} task failure(s) injected, but the logs "
                                  f"show {r.task_failures} failed task(s) and {injected} "
                                  "InjectedFault(s)")
        elif r.task_failures:
            r.problems.append(f"{r.task_failures} task(s) failed (no task failure was injected)")
        if self.scenario.flaky:
            flaky_log = self.faults / FLAKY_LOG
            r.injected_errors = (len(flaky_log.read_text().splitlines())
                                 if flaky_log.exists() else 0)
            if r.injected_errors == 0:
                r.problems.append("no transient error was injected")
        for duplicate in self.duplicates:
            problem = self._check_duplicate(duplicate)
            if problem:
                r.problems.append(problem)

    def _verify_target(self, change_log: list[Any], source_rows: dict[str, Any]) -> None:
        """The applied table, read back with deltalake / pyiceberg: its live rows equal the
        source table row by row; with SCD 2 every key's versions equal the change log's."""
        assert self.target is not None
        r = self.result
        rows = self.target.rows()
        state = table_state(rows, KEY_COLUMNS)
        r.target_rows = len(state)
        source = {k: dict(v) for k, v in source_rows.items()}
        differ = {k for k in set(state) | set(source) if state.get(k) != source.get(k)}
        if differ:
            r.problems.append(f"the {self.target.kind} table differs from the source in "
                              f"{len(differ)} key(s), e.g. {sorted(differ)[:3]}")
        if self.scenario.scd == 2:
            history = history_mismatches(source_history(change_log),
                                         table_history(rows, KEY_COLUMNS))
            differ |= set(history)
            if history:
                r.problems.append(f"the {self.target.kind} table's history differs from the "
                                  f"change log's in {len(history)} key(s), e.g. {history[:3]}")
        r.target_mismatches = len(differ)

    # --- the emulator (wire scenarios) -----------------------------------------------------

    def _start_emulator(self) -> None:
        from tablestore_emulator.server import EmulatorServer

        self.emulator = EmulatorServer(str(self.store_path), WIRE_INSTANCE, WIRE_KEY_ID,
                                       WIRE_SECRET).start()
        # the meta table lives in the emulated instance; its store takes these from the
        # environment in the runner and in this process
        self.extra_env = {**self.extra_env, **self.emulator.credential_env()}

    def _check_duplicate(self, duplicate: Duplicate) -> str | None:
        """The duplicate read's records must be exactly what Spark delivered for that channel
        in one batch; after the held attempt's claim (``mid_read``) they must be its records."""
        channel_id, records = duplicate.channel_id, duplicate.records
        if duplicate.point == "mid_read" and len(records) != duplicate.held_records:
            return (f"the duplicate read of channel {channel_id} after the held attempt's "
                    f"claim of {duplicate.held_records} gave {len(records)} records")
        if not records:
            return None  # nothing to compare: the channel had nothing new (verify still ran)
        wanted = set(records)
        batches = [name for name, rows in self.watcher.rows.items() if wanted & set(rows)]
        if len(batches) != 1:
            return (f"the duplicate read of channel {channel_id} ({len(records)} records) is "
                    f"spread over batches {batches}")
        delivered = sorted(r for r in self.watcher.rows[batches[0]] if r[0] == channel_id)
        if delivered != sorted(records):
            return (f"the duplicate read of channel {channel_id} gave {len(records)} records, "
                    f"Spark delivered {len(delivered)} in {batches[0]}: not identical")
        return None

    # --- DynamoDB on moto -------------------------------------------------------------------

    def _start_moto(self) -> None:
        self.moto, endpoint = start_moto_server()
        self.meta_uri = (f"dynamodb://cdc_meta?region=us-east-1&endpoint_url={endpoint}"
                         "&create_table=true")
        self.extra_env = {
            **AWS_TEST_ENV,
            "AWS_CONFIG_FILE": str(self.dir / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.dir / "no-aws-credentials"),
        }

    def _stop_moto(self) -> None:
        if self.moto is not None:
            stop_moto_server(self.moto)
            self.moto = None


def _where(pid: int) -> str:
    """Which part of the Spark tree ``pid`` belongs to: under an executor JVM
    (``local-cluster``), under the driver JVM (workers, planning process), or the driver."""
    try:
        for parent in psutil.Process(pid).parents():
            cmdline = " ".join(parent.cmdline())
            if "CoarseGrainedExecutorBackend" in cmdline:
                return "executor-jvm"
            if "java" in parent.name():
                return "driver-jvm"
    except psutil.Error:
        return "gone"
    return "driver"


def _sleep_watching(seconds: float, process: subprocess.Popen | None) -> None:
    """Sleep, but fail at once if ``process`` dies meanwhile (it was not supposed to)."""
    deadline = time.monotonic() + max(0.0, seconds)
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the runner exited with {process.returncode} on its own")
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def run_scenario(scenario: Scenario, workdir: Path, seed: int = 1, keep: bool = False,
                 on_done: Callable[[Result], None] | None = None) -> Result:
    """Run ``scenario`` in ``workdir``; its files are removed when it passes unless ``keep``."""
    log.info("scenario %s: %s", scenario.name, scenario.why)
    result = run_and_tidy(FaultScenarioRun(scenario, workdir, seed), keep)
    assert isinstance(result, Result)
    if on_done is not None:
        on_done(result)
    return result


def random_kills(n: int, rng: random.Random) -> tuple[RandomKill, ...]:
    """``n`` kills at random times: most while batches run, about one in five during start-up
    (Spark starting, ``initialOffset``, the replay of the batch cut by the previous kill)."""
    kills = []
    for _ in range(n):
        if rng.random() < 0.2:
            kills.append(RandomKill(round(rng.uniform(2.0, 12.0), 2), during_startup=True))
        else:
            kills.append(RandomKill(round(rng.uniform(0.2, 6.0), 2)))
    return tuple(kills)
