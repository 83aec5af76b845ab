"""What every scenario harness of integration/ shares: the run's skeleton, its result, the sink
watched while the query runs and the checks every run ends with.

The harnesses (``integration/faults/harness.py``: processes killed at crash points;
``integration/netfaults/harness.py``: a fault proxy on every hop; ``netfaults/cluster.py``: a
Spark standalone cluster across network namespaces; ``netfaults/soak.py``: a long run with a
kill a minute) each subclass ``ScenarioRun`` and its ``ScenarioResult``:

- ``ScenarioRun.run()`` is the one skeleton: a fresh store file with the scenario table, the
  subclass's ``execute(writer)`` (services, the query, the steps, then ``drain_and_stop``), the
  cleanup whatever happened (``cleanup_actions``: the writer, the query, and what the subclass
  started), then ``verify()`` even when the run failed (what was delivered is still checked),
  then ``close()`` (the services verification needed); an exception in any part becomes a
  problem of the result, never an escape;
- ``verify_delivery`` is the check they all make: every change in the store's change log
  delivered exactly once and in order per key, the table rebuilt from the sink equal to the
  store's, every replay of a stored batch identical, no stored batch rewritten, the run split
  and merged channels;
- ``run_and_tidy`` removes a passed scenario's files (unless kept) and names where a failed
  one's are.

Everything here runs in the harness process (pytest, or ``python -m integration.faults`` /
``integration.netfaults``); the query runs in its own process tree (``testkit.runner``).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from connector.local import LocalTablestore
from connector.tunnel.base import Record
from integration.faults.workload import KEY_COLUMNS, TABLE, Writer, create_table
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from tablestore_cdc.verify import Verification, rows_by_key, verify
from tablestore_emulator.tunnel_api import wire_change_log
from testkit.processes import kill_tree
from testkit.waiting import wait_until

log = logging.getLogger("integration.scenario")

#: how long the query may take to deliver everything once the writer has stopped
DRAIN_TIMEOUT_S = 600.0
#: how long the query may take to stop once its stop file exists
STOP_TIMEOUT_S = 180.0


@dataclass
class ScenarioResult:
    """What every scenario reports; a harness's result adds its own fields."""

    name: str
    changes: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    replays: int = 0
    replays_identical: bool = True
    splits: int = 0
    merges: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}


class SinkWatcher:
    """Reads each new batch directory of the sink once (harness process).

    Remembers every directory's identity (inode, files, sizes) when first seen, so the end of
    the run can check the exactly-once sink contract: a stored batch is never rewritten."""

    def __init__(self, sink: ExactlyOnceParquetSink) -> None:
        self.sink = sink
        self.ids: Counter[tuple[str, str]] = Counter()
        self.identity: dict[str, tuple[Any, ...]] = {}
        self.rows: dict[str, list[tuple[str, str]]] = {}

    @staticmethod
    def _identity(directory: Path) -> tuple[Any, ...]:
        files = sorted((p.name, p.stat().st_size) for p in directory.iterdir())
        return (directory.stat().st_ino, tuple(files))

    def poll(self) -> int:
        """Read new batch directories; returns how many batches are stored."""
        if self.sink.path.exists():
            for directory in sorted(self.sink.path.glob("batch=*")):
                if directory.name in self.identity:
                    continue
                identity = self._identity(directory)
                table = pq.read_table(directory, columns=["_channel_id", "_sequence"])
                rows = list(zip(table.column("_channel_id").to_pylist(),
                                table.column("_sequence").to_pylist(), strict=True))
                self.identity[directory.name] = identity
                self.rows[directory.name] = rows
                self.ids.update(rows)
        return len(self.identity)

    def covers(self, expected: set[tuple[str, str]]) -> bool:
        self.poll()
        return all(i in self.ids for i in expected)

    def rewritten(self) -> list[str]:
        """Batch directories whose identity changed since first seen (must be none)."""
        changed = []
        for name, identity in self.identity.items():
            directory = self.sink.path / name
            if not directory.exists() or self._identity(directory) != identity:
                changed.append(name)
        return changed


class ScenarioRun:
    """One scenario's files and processes; ``run()`` returns its result.

    A subclass sets ``result`` (its ``ScenarioResult``), ``channels`` (the table's at the start)
    and ``wire`` (the query reads over the emulator's wire, so the change log's sequences are
    as the wire carries them) and implements ``make_writer`` and ``execute``; it extends
    ``cleanup_actions`` and ``verify`` with what it started and what else it checks.
    """

    result: ScenarioResult
    channels: int = 4
    wire: bool = True

    def __init__(self, name: str, workdir: Path) -> None:
        self.dir = workdir / name.replace("/", "-")
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.store_path = self.dir / "store.db"
        self.sink = ExactlyOnceParquetSink(self.dir / "sink")
        self.watcher = SinkWatcher(self.sink)
        self.stop_file = self.dir / "stop"
        #: the running query's process (``testkit.runner``) and the log it writes
        self.runner: subprocess.Popen[Any] | None = None
        self.runner_log = self.dir / "runner.log"

    # --- what a subclass provides ------------------------------------------------------------

    def make_writer(self) -> Writer:
        raise NotImplementedError

    def execute(self, writer: Writer) -> None:
        """Start the services and the query, run the steps, stop the writer, then
        ``drain_and_stop``. Raise on a failure: the run records it and still verifies."""
        raise NotImplementedError

    def cleanup_actions(self, writer: Writer) -> list[tuple[str, Callable[[], Any]]]:
        """What to stop whatever happened, in order, each named for its problem line."""
        return [("writer", lambda: writer.finish() if writer.is_alive() else None),
                ("runner", self.kill_query)]

    def verify(self) -> None:
        """The checks after the run; the base's is ``verify_delivery``."""
        self.verify_delivery()

    def close(self) -> None:
        """Stop what ``verify`` still needed (a meta store's server): after it, and also when
        the run is interrupted."""

    # --- the skeleton -----------------------------------------------------------------------

    def run(self) -> ScenarioResult:
        began = time.monotonic()
        try:
            create_table(self.store_path, self.channels)
            writer = self.make_writer()
            try:
                self.execute(writer)
            except Exception as exc:  # the scenario fails; still verify what was delivered
                self.result.problems.append(f"{type(exc).__name__}: {exc}")
                log.exception("%s failed", self.result.name)
            finally:
                self._cleanup(writer)
            self.result.splits, self.result.merges = writer.splits, writer.merges
            try:
                self.verify()
            except Exception as exc:
                self.result.problems.append(f"verification failed to run: {exc!r}")
        finally:
            self.close()
        self.result.seconds = round(time.monotonic() - began, 1)
        return self.result

    def _cleanup(self, writer: Writer) -> None:
        """Leave no process behind, whatever happened."""
        for what, action in self.cleanup_actions(writer):
            try:
                action()
            except Exception as exc:
                self.result.problems.append(f"cleanup of {what}: {exc!r}")

    # --- the query ----------------------------------------------------------------------------

    def kill_query(self) -> int:
        """SIGKILL the query's whole process tree (if it runs); how many processes died."""
        if self.runner is None:
            return 0
        killed = kill_tree(self.runner.pid)
        self.runner = None
        return killed

    def log_tail(self, chars: int = 1500) -> str:
        if not self.runner_log.exists():
            return ""
        return self.runner_log.read_text(errors="replace")[-chars:]

    def drain_and_stop(self, timeout: float = DRAIN_TIMEOUT_S, interval: float = 0.5,
                       stop_timeout: float = STOP_TIMEOUT_S) -> None:
        """Wait until every change in the store's change log is in the sink, then stop the
        query through its stop file; it must exit 0."""
        self.wait_all_delivered(timeout, interval)
        self.stop_query(stop_timeout)

    def wait_all_delivered(self, timeout: float = DRAIN_TIMEOUT_S, interval: float = 0.5
                           ) -> None:
        """Wait until every change in the store's change log now is in the sink (failing at
        once if the query exits)."""
        expected = self.written()
        wait_until(f"all {len(expected)} changes delivered",
                   lambda: self.watcher.covers(expected), timeout=timeout, interval=interval,
                   process=self.runner)

    def stop_query(self, stop_timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the query through its stop file; it must exit 0 within ``stop_timeout``."""
        self.stop_file.touch()
        assert self.runner is not None
        try:
            code = self.runner.wait(stop_timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the runner did not stop within {stop_timeout:.0f} s of its "
                                 "stop file") from None
        if code != 0:
            raise AssertionError(f"the runner exited with {code} after its stop file: "
                                 f"{self.log_tail()}")
        self.runner = None

    # --- the source and what was delivered ------------------------------------------------------

    def change_log(self) -> list[Record]:
        """The store's change log, with sequences as the query sees them (over the wire: as
        the emulator carries them)."""
        store = LocalTablestore(self.store_path, create=False)
        try:
            records = store.change_log(TABLE)
        finally:
            store.close()
        return wire_change_log(records) if self.wire else records

    def source_rows(self) -> dict[str, Any]:
        store = LocalTablestore(self.store_path, create=False)
        try:
            return rows_by_key(store.scan(TABLE))
        finally:
            store.close()

    def written(self) -> set[tuple[str, str]]:
        """(channel, sequence) of every change in the store's change log now."""
        return {(r.channel_id, r.sequence) for r in self.change_log()}

    def verify_delivery(self, change_log: list[Record] | None = None,
                        source_rows: dict[str, Any] | None = None,
                        splits_required: bool = True) -> Verification:
        """The sink against the store: nothing lost or doubled, per-key order, the rebuilt
        table; identical replays, no batch rewritten; the run split and merged channels
        (unless not ``splits_required``)."""
        r = self.result
        v = verify(self.change_log() if change_log is None else change_log,
                   self.sink.deliveries(KEY_COLUMNS),
                   self.source_rows() if source_rows is None else source_rows)
        r.changes, r.lost, r.duplicated = v.expected, v.lost, v.duplicated
        r.out_of_order = v.keys_out_of_order
        if not v.ok:
            r.problems.append(f"{v.summary()} {v.examples}")
        replays = self.sink.replays()
        r.replays = len(replays)
        r.replays_identical = all(x["identical"] for x in replays)
        if not r.replays_identical:
            r.problems.append(f"a replayed batch differs from the stored one: "
                              f"{[x for x in replays if not x['identical']]}")
        self.watcher.poll()
        rewritten = self.watcher.rewritten()
        if rewritten:
            r.problems.append(f"stored batches were rewritten: {rewritten}")
        if splits_required and (r.splits == 0 or r.merges == 0):
            r.problems.append(f"the run had {r.splits} split(s) and {r.merges} merge(s)")
        return v


def run_and_tidy(run: ScenarioRun, keep: bool = False) -> ScenarioResult:
    """``run.run()``; a passed scenario's files are removed unless ``keep``, a failed one's are
    kept and named in its problems."""
    result = run.run()
    if result.ok and not keep:
        shutil.rmtree(run.dir, ignore_errors=True)
    elif not result.ok:
        result.problems.append(f"files kept in {run.dir}")
    return result
