"""The replication application under fault: ``tablestore-cdc replicate --tables`` (or
``--table T``, the selection of one) killed with SIGKILL and restarted, the writers changing its
tables meanwhile, and the checks after the run.

Where things run: ``Replication`` starts the command in its own process tree (the driver, its
JVM, the planning process, Python workers) with ``testkit.crash_points.environment`` naming
the run's fault directory, so the crash points (``testkit.crash_points``) can be armed from
here; each
``TableWriter`` is a thread in this (the harness or pytest) process, on its own store
connection, so it keeps writing through every kill. ``kill`` is ``testkit.processes.kill_tree``
then a sweep of stragglers by that fault directory, as the single-table harness kills.

``run_crash_points`` is the crash-point scenario: a kill parked exactly at each given point (the
points inside one multi-table batch: between two tables' offsets, plans, source commits and
target commits; docs/reliability.md), a restart after each. ``check_exactly_once`` is what
every multi-table fault run ends with: each target equals its source row by row (read back
with ``deltalake`` / ``pyiceberg``), an SCD 2 target's versions equal its change log's, the
committed change log holds each table's change log exactly once and in order per key, and no
target holds a batch twice. Used by ``integration/test_multi_table_kill.py`` (kills at
arbitrary moments), ``integration/test_multi_table_crash_points.py`` and
``integration/test_replicate_kill.py`` (one table, as ``--table T`` and as ``--tables T``).

``Replication(engine="spark")`` runs ``replicate --engine spark`` (Spark's own MERGE by
delta-spark, ``tablestore_cdc.lakehouse.spark_merge``) on the interpreter of the Spark engine's
venv (``testkit.spark_merge_run.SPARK_MERGE_PYTHON``: a PySpark that delta-spark is released
for, its jars in Spark's Ivy cache), into the same Delta and Iceberg targets (the Iceberg
tables through the warehouse's SQLite catalog, which pyiceberg reads back).
``Replication(cycle="one")`` runs ``replicate --cycle one``: one query reads, logs and applies
each batch; its committed change log is ``changelog/batch-<id>``, each up to the query's
newest committed batch.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from connector.local import LocalTablestore
from connector.tunnel.base import Record
from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties
from tablestore_cdc.pipeline.queries import APPLY_CHECKPOINT, CYCLES, SOURCE_CHECKPOINT
from tablestore_cdc.verify import Delivered, key_of, read_delta, rows_by_key, table_state, verify
from testkit.crash_points import FAULT_DIR_ENV
from testkit.crash_points import environment as crash_environment
from testkit.file_sink_log import committed_rows
from testkit.processes import REPO, arm_crash_point, kill_marked, kill_tree
from testkit.spark_merge_run import SPARK_MERGE_PYTHON
from testkit.target_reads import (
    delta_batches,
    history_mismatches,
    iceberg_batches,
    read_iceberg,
    source_history,
    table_history,
)
from testkit.waiting import wait_until

log = logging.getLogger("integration.faults")

KEY = [("id", "INTEGER")]
COLUMNS = [("v", "STRING"), ("n", "DOUBLE")]
#: the writer's rounds at which a reshaped table's channels split, split again, and merge
RESHAPE_ROUNDS = (2, 4, 6)
#: the crash points of the apply side: Spark replays the apply query's batch they cut
APPLY_POINTS = ("between_table_applies", "after_table_applies")
#: ``replicate --engine``: the embedded apply (delta-rs, pyiceberg) or Spark's own MERGE
ENGINES = ("embedded", "spark")


class TableWriter(threading.Thread):
    """Changes to one table, a round a second, until stopped (harness process, its own store
    connection): five puts and a delete over 60 keys; with ``reshape`` the table's first
    channel splits, one of its children splits again, and those two grandchildren merge."""

    def __init__(self, store_path: Path, table: str, reshape: bool = False) -> None:
        super().__init__(daemon=True, name=f"writer-{table}")
        self.store_path, self.table, self.reshape = store_path, table, reshape
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.rounds = 0
        self.splits = self.merges = 0
        self.halves: tuple[str, str] = ("", "")
        self.quarters: tuple[str, str] = ("", "")

    def run(self) -> None:
        try:
            with LocalTablestore(self.store_path) as store:
                while not self.stopping.is_set():
                    base = self.rounds * 5
                    for i in range(base, base + 5):
                        store.put_row(self.table, {"id": i % 60},
                                      {"v": f"{self.table}-{i}", "n": i * 0.5})
                    store.delete_row(self.table, {"id": (base + 3) % 60})
                    if self.reshape:
                        self._reshape(store)
                    self.rounds += 1
                    self.stopping.wait(1.0)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _reshape(self, store: LocalTablestore) -> None:
        if self.rounds == RESHAPE_ROUNDS[0]:
            self.halves = store.split_channel(self.table,
                                              store.list_channels(self.table)[0].channel_id)
            self.splits += 1
        elif self.rounds == RESHAPE_ROUNDS[1]:
            self.quarters = store.split_channel(self.table, self.halves[0])
            self.splits += 1
        elif self.rounds == RESHAPE_ROUNDS[2]:
            store.merge_channels(self.table, *self.quarters)
            self.merges += 1

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)
        assert not self.is_alive(), f"the writer of {self.table} did not stop"
        assert self.error is None, f"the writer of {self.table} failed: {self.error!r}"


@dataclass(frozen=True)
class Targets:
    """Where a multi-table job's targets are (Delta under ``lake``, the ``iceberg`` tables in
    the SQLite-catalog warehouse ``warehouse``) and how to read them back without its code
    (``deltalake`` / ``pyiceberg``)."""

    lake: Path
    warehouse: Path
    iceberg: tuple[str, ...] = ()
    #: who wrote the Delta targets (``ENGINES``): the Spark engine names a batch by its
    #: ``txn`` action alone, not by the embedded sink's commit infos (an Iceberg snapshot's
    #: summary names it for both)
    engine: str = "embedded"

    def state(self, table: str) -> dict[str, dict[str, Any]] | None:
        """key -> attributes of the target's live rows; None before its first commit."""
        rows = self.rows(table)
        return None if rows is None else table_state(rows, ["id"])

    def rows(self, table: str) -> list[dict[str, Any]] | None:
        return self._read(table, read_delta, read_iceberg)

    def batches(self, table: str) -> list[tuple[str, int]]:
        """(query id, batch id) of each batch committed into ``table``'s target, oldest first
        (empty before its first commit)."""
        delta = delta_txn_batches if self.engine == "spark" else delta_batches
        return self._read(table, delta, iceberg_batches) or []

    def _read(self, table: str, delta: Any, iceberg: Any) -> Any:
        if table in self.iceberg:
            if not (self.warehouse / "catalog.db").exists():
                return None
            try:
                return iceberg(sqlite_catalog_properties(str(self.warehouse)), f"cdc.{table}")
            except Exception as exc:  # not created yet (pyiceberg's NoSuch* errors)
                if type(exc).__name__.startswith("NoSuch"):
                    return None
                raise
        # (delta-spark makes _delta_log before its first commit's file)
        if not any((self.lake / table / "_delta_log").glob("[0-9]*.json")):
            return None
        return delta(str(self.lake / table))


def delta_txn_batches(path: str) -> list[tuple[str, int]]:
    """(query id, batch id) of every ``txn`` action in the Delta log at ``path``, oldest first:
    the batches a writer that records nothing else (delta-spark's MERGE under ``txnAppId`` /
    ``txnVersion``, the Spark engine) committed; a batch committed twice shows twice. Read from
    the commit files, which Delta keeps beside its checkpoints."""
    batches = []
    for commit in sorted(Path(path, "_delta_log").glob("[0-9]*.json")):
        for line in commit.read_text().splitlines():
            txn = json.loads(line).get("txn") if line.strip() else None
            if txn is not None:
                batches.append((str(txn["appId"]), int(txn["version"])))
    return batches


def spark_engine_python() -> str:
    """The interpreter ``replicate --engine spark`` runs on (``SPARK_MERGE_PYTHON``); the
    calling test is skipped, with the reason, when that venv is missing."""
    if not Path(SPARK_MERGE_PYTHON).exists():
        import pytest

        pytest.skip(f"no {SPARK_MERGE_PYTHON} for replicate --engine spark: "
                    "make .venv-spark-merge/.jars-stamp prepares it")
    return SPARK_MERGE_PYTHON


class Replication:
    """The application under test (``tablestore-cdc replicate`` of ``selection``, by default
    ``--tables 't*'``, in its own process group, with the run's fault directory) and what it
    writes: ``out/changelog`` (in both modes) and the targets (Delta at the default target:
    under ``out/lake`` with ``--tables``, ``out/T`` with ``--table T``; the ``iceberg`` tables in
    ``warehouse``; the ``scd2`` ones SCD type 2, set by ``--config``). ``engine``: ``replicate
    --engine`` (``ENGINES``); ``spark`` runs on ``spark_engine_python()``."""

    def __init__(self, tmp: Path, iceberg: Sequence[str] = (), scd2: Sequence[str] = (),
                 selection: Sequence[str] = ("--tables", "t*"),
                 engine: str = "embedded", cycle: str = "two") -> None:
        assert engine in ENGINES, engine
        assert cycle in CYCLES, cycle
        self.engine, self.cycle = engine, cycle
        self.python = spark_engine_python() if engine == "spark" else sys.executable
        self.tmp = tmp
        self.iceberg, self.scd2 = tuple(iceberg), tuple(scd2)
        self.selection = tuple(selection)
        self.store_path, self.out = tmp / "store.db", tmp / "out"
        # the default targets: delta://OUT/T with --table T, delta://OUT/lake/{table} with --tables
        self.lake = self.out if self.selection[0] == "--table" else self.out / "lake"
        self.warehouse = tmp / "warehouse"
        self.targets = Targets(self.lake, self.warehouse, self.iceberg, engine)
        self.log = tmp / "replicate.log"
        self.faults = tmp / "faults"
        self.faults.mkdir(exist_ok=True)
        self.config = tmp / "tables.toml"
        template = f"iceberg://{self.warehouse}?table=cdc.{{table}}"
        self.config.write_text("".join(
            f"[tables.{t}]\n"
            + (f'target = "{template}"\n' if t in self.iceberg else "")
            + ("scd = 2\n" if t in self.scd2 else "")
            for t in sorted(set(self.iceberg) | set(self.scd2))))
        # the committed change log is read back by batch: keep Spark from compacting its log
        # of committed files (which would merge the batches' entries into one)
        self.spark_conf = tmp / "spark-conf"
        self.spark_conf.mkdir(exist_ok=True)
        defaults = "spark.sql.streaming.fileSink.log.compactInterval 1000000\n"
        if engine == "spark":  # tables of 60 keys: a Delta snapshot read in one task, not 50
            defaults += "spark.databricks.delta.snapshotPartitions 1\n"
        (self.spark_conf / "spark-defaults.conf").write_text(defaults)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        args = ["replicate", "--store", str(self.store_path), *self.selection,
                # the default target (a --target flag would win over the config's per-table
                # targets)
                "--output", str(self.out), "--config", str(self.config), "--trigger-ms", "300",
                "--initial", "none", "--option", "tables.refreshIntervalMs=1000",
                "--engine", self.engine, "--cycle", self.cycle]
        code = "from tablestore_cdc.commands.app import app; app()"
        self.starts += 1
        with open(self.log, "ab") as sink:
            sink.write(f"--- start {self.starts}\n".encode())
            sink.flush()
            self.process = subprocess.Popen(
                [self.python, "-c", code, *args], cwd=REPO, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYSPARK_PYTHON": self.python,
                     "SPARK_CONF_DIR": str(self.spark_conf), **crash_environment(self.faults)})

    def kill(self) -> None:
        """SIGKILL the whole tree, then any straggler of it (found by the fault directory)."""
        if self.process is not None:
            kill_tree(self.process.pid)
            self.process = None
        kill_marked(FAULT_DIR_ENV, str(self.faults))

    def wait(self, what: str, probe: Any, until: Any = bool, timeout: float = 300) -> Any:
        return wait_until(what, probe, until, timeout=timeout, interval=0.5,
                          process=self.process)

    def unfinished_apply_batch(self) -> int | None:
        """The apply query's (or the one-cycle query's) batch in its offset log but not in its
        commit log (None: none), read from its checkpoint."""
        pending = sorted(set(self._checkpoint_log("offsets"))
                         - set(self._checkpoint_log("commits")))
        return pending[-1] if pending else None

    def last_applied_batch(self) -> int:
        """The apply query's newest batch in its commit log (-1: none yet)."""
        return max(self._checkpoint_log("commits"), default=-1)

    def apply_batch_tables(self, batch: int) -> tuple[str, ...]:
        """The tables the apply query's ``batch`` carries: the ``_table`` of the change-log
        files its file source logged for that batch (``sources/0``, compacted or not)."""
        import pyarrow.parquet as pq

        if self.cycle == "one":  # the batch's own change-log file
            logged = [p for p in (self.out / "changelog").glob(f"batch-{batch:012d}*")
                      if not p.name.endswith(".tmp")]
            return tuple(sorted({t for p in logged for t in
                                 pq.read_table(p, columns=["_table"])["_table"].to_pylist()}))
        files = set()
        for entry in (self.out / "_checkpoints" / "apply" / "sources" / "0").glob("[0-9]*"):
            for line in entry.read_text().splitlines()[1:]:  # after the version line
                logged = json.loads(line)
                if logged.get("batchId") == batch:
                    files.add(unquote(urlsplit(logged["path"]).path))
        return tuple(sorted({t for f in files
                             for t in pq.read_table(f, columns=["_table"])["_table"].to_pylist()}))

    def last_read_batch(self) -> int:
        """The change-log query's (or the one-cycle query's) newest batch in its commit log
        (-1: none yet)."""
        return max(self._checkpoint_log("commits", query=SOURCE_CHECKPOINT[self.cycle]),
                   default=-1)

    def _checkpoint_log(self, name: str, query: str | None = None) -> list[int]:
        query = query or APPLY_CHECKPOINT[self.cycle]
        return [int(p.name) for p in (self.out / "_checkpoints" / query / name).glob("[0-9]*")]

    def _committed_batches(self) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """(batch, its rows) of the committed change log in batch order. Two cycles: the files
        each ``_spark_metadata/<batch>`` entry lists (other files are leftovers of killed
        attempts). One cycle: each ``batch-<id>.parquet`` up to the query's newest committed
        batch (a later one is a killed attempt's, written again by its replay)."""
        if self.cycle == "two":
            yield from committed_rows(self.out / "changelog" / "_spark_metadata")
            return
        import pyarrow.parquet as pq

        newest = self.last_read_batch()
        # a file per batch, a folder of part files with the Spark engine
        for logged in sorted((self.out / "changelog").glob("batch-*")):
            batch = int(logged.name.removeprefix("batch-").removesuffix(".parquet"))
            if batch <= newest:
                yield batch, pq.read_table(logged).to_pylist()

    def change_log(self) -> dict[str, list[Delivered]]:
        """table -> the changes of the committed change log, in batch order
        (``_committed_batches``)."""
        by_table: dict[str, list[Delivered]] = defaultdict(list)
        for batch, rows in self._committed_batches():
            for row in rows:
                after = None if row["_row"] is None else {
                    k: v for k, v in json.loads(row["_row"]).items() if v is not None}
                by_table[row["_table"]].append(Delivered(
                    row["_channel_id"], row["_sequence"], key_of(json.loads(row["_key"])),
                    row["_op"], (batch, row["_channel_id"], row["_sequence"]), after))
        return by_table


def source_of(store_path: Path, table: str) -> tuple[dict[str, Any], list[Record]]:
    """A table's rows (``verify``'s form) and its change log, read together."""
    with LocalTablestore(store_path) as store:
        return rows_by_key(store.scan(table)), store.change_log(table)


def create_with_rows(store_path: Path, table: str, rows: int = 25) -> None:
    """A table of 2 channels with ``rows`` rows, made while the application may run."""
    with LocalTablestore(store_path) as store:
        store.create_table(table, KEY, COLUMNS, channels=2)
        for i in range(rows):
            store.put_row(table, {"id": i}, {"v": f"{table}-pre-{i}", "n": 1.0})


def drain(app: Replication, writers: dict[str, TableWriter], live: Sequence[str]
          ) -> dict[str, tuple[dict[str, Any], list[Record]]]:
    """The end of a run: wait until every reshaping writer made its two splits and its merge,
    stop the writers of the ``live`` tables, read each one's source (``source_of``), wait
    until its target equals it and the batch that made it so is committed. Returns those
    sources."""
    reshaping = [w for w in writers.values() if w.reshape and w.table in live]
    for writer in reshaping:  # every reshape happened before the writers stop
        app.wait(f"{writer.table}'s writer past its merge", lambda w=writer: w.merges)
    for table in live:
        writers[table].stop()
    assert [(w.splits, w.merges) for w in reshaping] == [(2, 1)] * len(reshaping)
    sources = {t: source_of(app.store_path, t) for t in live}
    for table in live:
        app.wait(f"{table} equals its source", lambda t=table: app.targets.state(t),
                 lambda state, t=table: state == sources[t][0])
    # a batch's targets commit inside it, before Spark's commit log records it: the checks
    # read the committed change log, so the batch that made the targets equal must be in it
    app.wait("the newest batch in the commit log", lambda: app.unfinished_apply_batch() is None)
    return sources


def check_exactly_once(app: Replication, sources: dict[str, tuple[dict[str, Any],
                                                                  list[Record]]]) -> None:
    """The checks after a run (``sources``: each table's rows and change log, as
    ``source_of`` read them once its writer stopped): each target equals its source, an SCD 2
    target's versions equal its change log's, the committed change log holds each table's
    change log exactly once and in order per key, and no target holds a batch twice."""
    committed = app.change_log()
    assert set(committed) == set(sources), f"tables in the change log: {sorted(committed)}"
    for table, (rows, changes) in sorted(sources.items()):
        assert app.targets.state(table) == rows, f"{table}'s target differs from its source"
        result = verify(changes, committed[table], rows)
        assert result.ok, f"{table}: {result.summary()} {result.examples}"
        assert result.delivered == result.expected > 0
        twice = sorted(b for b, n in Counter(app.targets.batches(table)).items() if n > 1)
        assert not twice, f"{table}'s target holds batch(es) {twice} twice"
        print(f"{table}: {result.summary()}; {len(rows)} rows in its target")
    for table in app.scd2:
        target = app.targets.rows(table)
        assert target is not None
        mismatches = history_mismatches(source_history(sources[table][1]),
                                        table_history(target, ["id"]))
        assert not mismatches, f"{table}: versions differ from the change log's in {mismatches}"


# --- the crash-point scenario ------------------------------------------------------------------


@dataclass
class CrashRecord:
    """One kill at ``point``: the apply query's batch it cut (apply points) and the tables whose
    target held that batch at the kill, then after the run."""

    point: str
    batch: int | None = None
    held_at_kill: tuple[str, ...] = ()
    held_after: tuple[str, ...] = ()
    #: the tables the batch carries (its change-log files')
    carried: tuple[str, ...] = ()


@dataclass
class CrashRun:
    """What ``run_crash_points`` did: a record per kill and the application's starts."""

    kills: list[CrashRecord] = field(default_factory=list)
    starts: int = 0
    seconds: float = 0.0


def run_crash_points(tmp: Path, points: Sequence[str], tables: Sequence[str] = ("t1", "t2", "t3"),
                     iceberg: Sequence[str] = ("t2",), scd2: Sequence[str] = ("t2", "t3"),
                     reshape: Sequence[str] = ("t1",), cycle: str = "two") -> CrashRun:
    """Replicate ``tables`` (2 channels each, a writer on each) and SIGKILL the application
    parked at each of ``points`` in turn, restarting it after each; then stop the writers, wait
    until every target equals its source and check exactly-once (``check_exactly_once``). A
    kill at an apply point must have cut a batch some target already held (and, for
    ``between_table_applies``, some other table of the batch did not): after the run every
    table the batch carries holds it, and no target holds a batch twice. ``cycle``:
    ``replicate --cycle``."""
    began = time.monotonic()
    app = Replication(tmp, iceberg=iceberg, scd2=scd2, cycle=cycle)
    run = CrashRun()
    with LocalTablestore(app.store_path) as store:
        for name in tables:
            store.create_table(name, KEY, COLUMNS, channels=2)
    writers = {t: TableWriter(app.store_path, t, reshape=t in reshape) for t in tables}
    for writer in writers.values():
        writer.start()
    app.start()
    try:
        applied = -1  # the apply query's newest batch at the last kill
        for point in points:
            app.wait(f"every table applied before the kill at {point}",
                     lambda: [t for t in tables if app.targets.state(t) is None],
                     lambda missing: not missing)
            app.wait(f"a batch applied by start {app.starts} before the kill at {point}",
                     app.last_applied_batch, lambda newest, a=applied: newest > a)
            arm_crash_point(app.faults, point)
            hit = app.faults / f"hit-{point}"
            app.wait(f"a process to reach crash point {point}", hit.exists, timeout=240)
            record = CrashRecord(point)
            if point in APPLY_POINTS:  # parked in the apply: its batch is cut
                record.batch = app.unfinished_apply_batch()
                assert record.batch is not None, f"parked at {point} with no batch begun"
                record.held_at_kill = _holding(app, tables, record.batch)
                record.carried = app.apply_batch_tables(record.batch)
            app.kill()
            applied = app.last_applied_batch()
            log.info("killed at %s (%s)", point, record)
            run.kills.append(record)
            hit.unlink()
            app.start()
        sources = drain(app, writers, tables)
    finally:
        for writer in writers.values():
            writer.stopping.set()
        app.kill()
    for record in run.kills:
        if record.point in APPLY_POINTS:
            record.held_after = _holding(app, tables, record.batch)
    check_exactly_once(app, sources)
    for record in run.kills:
        if record.point not in APPLY_POINTS:
            continue
        assert record.batch is not None, f"no apply batch was pending at {record.point}"
        assert record.held_at_kill, f"no target held batch {record.batch} at {record.point}"
        assert record.held_after == record.carried, (
            f"after the replay of batch {record.batch} not every table it carries holds it: "
            f"{record}")
        if record.point == "between_table_applies":
            assert len(record.held_at_kill) < len(record.carried), (
                f"the kill at {record.point} did not fall between two tables: {record}")
    run.starts, run.seconds = app.starts, time.monotonic() - began
    return run


def _holding(app: Replication, tables: Sequence[str], batch: int | None) -> tuple[str, ...]:
    """The tables whose target holds the apply query's ``batch``."""
    return tuple(t for t in tables if batch is not None
                 and any(b == batch for _, b in app.targets.batches(t)))


# --- the apply alone (no Spark): the fast check of its crash points ------------------------------

#: the targets of ``batch_applier``: Delta SCD 1, except ``t2`` (Iceberg, SCD 2)
APPLIER_ICEBERG = "t2"


def applier_targets(tmp: Path) -> Targets:
    """Where ``batch_applier(tmp)`` writes."""
    return Targets(tmp / "lake", tmp / "warehouse", (APPLIER_ICEBERG,))


def batch_applier(tmp: Path) -> Any:
    """The ``MultiTableApply`` a multi-table job would build over ``tmp`` (``applier_targets``:
    Delta SCD 1 targets, ``t2``'s an Iceberg SCD 2 table), as a restarted job builds it again.
    Runs in the test process or in a child killed at a crash point."""
    from tablestore_cdc.pipeline import ApplySettings
    from tablestore_cdc.pipeline.multi_table import MultiTableApply

    targets = applier_targets(tmp)
    default = ApplySettings(target=f"delta://{targets.lake}/{{table}}")
    iceberg = ApplySettings(target=f"iceberg://{targets.warehouse}?table=cdc.{{table}}", scd=2)
    return MultiTableApply(default, "local://store", tmp / "out", per_table=lambda table: (
        iceberg if table == APPLIER_ICEBERG else default, None))


def read_batch(reader: Any, start: dict) -> tuple[dict, Any]:
    """One batch of a ``MultiTableStreamReader`` driven in Spark's order (``latestOffset``,
    ``partitions``, each partition read as an executor reads it, ``commit``): its end offset
    and its rows (the multi-table change log's)."""
    import pyarrow as pa

    end = reader.latestOffset(start, None)
    batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
    reader.commit(end)
    return end, pa.Table.from_batches(batches)


def apply_file(tmp: str, batch_file: str, app_id: str, batch_id: str) -> None:
    """``python -m integration.faults.multi_table TMP BATCH_FILE APP_ID BATCH_ID``: apply one
    stored batch with ``batch_applier(TMP)`` (a child process the test kills at a crash point)."""
    import pyarrow.parquet as pq

    batch_applier(Path(tmp)).apply_batch(pq.read_table(batch_file), app_id, int(batch_id))


if __name__ == "__main__":
    apply_file(*sys.argv[1:5])
