"""A re-snapshot repairs the target while the replication job runs (``tablestore_cdc.resnapshot``),
on the real job (``pipeline.job.ReplicationJob``: its watch loop, restarts and idle looks) over
a real local Spark, the embedded store, Delta or Iceberg, in both modes: one table (``replicate
--table orders``: ``start_pipeline``) and a selection of it (``replicate --tables orders``:
``start_pipeline``, the table's target set by its own settings, as a ``--config``
table's is). The same steps run for both (``mode``):

- under a write load: three rows deleted, two changed and one added in the target behind the
  product's back are repaired between two batches;
- on an idle stream: the same damage, a signal, and no write to the table: the job's own look
  runs it (Spark calls ``foreachBatch`` only for a batch with data);
- ``onDataLoss=resnapshot``: the job stopped, the source changed and its change log trimmed
  before the job read it, restarted: the signal the reader records is run.

Each ends with the signal done and reconcile finding zero differences."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytest.importorskip("polars")

from connector.local import LocalTablestore  # noqa: E402
from meta_store.signals import Signal, SignalBoard, SignalState  # noqa: E402
from tablestore_cdc.demo.writer import DEMO_TABLE, DemoWriter  # noqa: E402
from tablestore_cdc.pipeline import ApplySettings, start_pipeline  # noqa: E402
from tablestore_cdc.pipeline.job import WATCH_EVERY_S, JobExit, ReplicationJob  # noqa: E402
from tablestore_cdc.pipeline.restarts import RestartPolicy  # noqa: E402
from tablestore_cdc.reconcile import SourceSpec, reconcile_table  # noqa: E402
from tablestore_cdc.resnapshot.command import open_board  # noqa: E402
from tablestore_cdc.resnapshot.hook import CHECK_EVERY_S  # noqa: E402
from testkit.reconcile import BASE, OrdersTarget, Target, found, make_orders, settle  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow

MODES = ["table", "tables"]
TRIGGER_MS = 500


@dataclass
class RunningJob:
    """``replicate`` in this process: a ``ReplicationJob`` run in a thread (driver), with the
    pipelines it started."""

    job: ReplicationJob
    pipelines: list[Any] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    exit: list[JobExit] = field(default_factory=list)

    @property
    def pipeline(self) -> Any:
        return wait_until("the job's pipeline", lambda: self.pipelines,
                          lambda started: bool(started), timeout=180)[-1]

    def stop(self) -> None:
        self.job.stopping.set()


@contextlib.contextmanager
def replicating(spark: Any, mode: str, store_path: Path, out: Path, target: Target,
                options: dict[str, str] | None = None, *,
                ends: JobExit = JobExit.DONE) -> Iterator[RunningJob]:
    """The job replicating ``orders`` into ``target`` in ``mode`` until the block ends (a
    failure ends it: no restart), with the exit code ``ends``."""
    endpoint = f"local://{store_path}"
    running = RunningJob(ReplicationJob(lambda: start(), RestartPolicy(max_restarts=0),
                                        say=lambda line: running.lines.append(line)))

    def start() -> Any:
        pipeline: Any
        if mode == "table":
            pipeline = start_pipeline(spark, endpoint, DEMO_TABLE, "replicate", out,
                                      ApplySettings(target.uri), options, TRIGGER_MS)
        else:  # the table's own target, as --config gives it (the template's is unused)
            pipeline = start_pipeline(
                spark, endpoint, DEMO_TABLE, "replicate", out,
                ApplySettings(f"delta://{out}/lake/{{table}}"), options=options,
                trigger_ms=TRIGGER_MS, per_table=lambda _: (ApplySettings(target.uri), None))
        running.pipelines.append(pipeline)
        return pipeline

    thread = threading.Thread(target=lambda: running.exit.append(running.job.run()),
                              daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.stop()
        thread.join(120)
    assert running.exit == [ends], running.lines


def first_rows_applied(running: RunningJob) -> None:
    """The snapshot's rows in the target, the stream drained."""
    pipeline = running.pipeline
    wait_until("the first rows applied", pipeline.applied_batch,
               lambda batch: batch is not None, timeout=180, query=pipeline.state_query)
    pipeline.drain()


@contextlib.contextmanager
def orders_replicated(spark: Any, tmp_path: Path, mode: str, kind: str
                      ) -> Iterator[tuple[Path, Target, SourceSpec, RunningJob]]:
    """The demo's orders in a new store, replicated in ``mode`` into a ``kind`` target (delta
    or iceberg) by a running job whose first rows are applied: (the store's path, the target,
    the source as reconcile reads it, the job)."""
    store_path = tmp_path / "store.db"
    make_orders(store_path)
    target = OrdersTarget.delta(tmp_path) if kind == "delta" else OrdersTarget.iceberg(tmp_path)
    spec = SourceSpec(f"local://{store_path}", DEMO_TABLE)
    with replicating(spark, mode, store_path, tmp_path / "out", target) as running:
        first_rows_applied(running)
        yield store_path, target, spec, running


def finished(board: SignalBoard, signal_id: str, running: RunningJob,
             timeout: float = 180) -> Signal:
    return wait_until("the job ran the resnapshot",
                      lambda: next(s for s in board.signals() if s.id == signal_id),
                      lambda s: s.finished, timeout=timeout,
                      query=running.pipeline.state_query)


DELETED, CHANGED, ADDED = [BASE + 1, BASE + 2, BASE + 3], [BASE + 5, BASE + 6], BASE + 99


@pytest.mark.parametrize(("kind", "mode"), [
    ("delta", "table"), ("iceberg", "tables"),
    # the same path with the other format (make test-extended)
    pytest.param("delta", "tables", marks=pytest.mark.extended),
    pytest.param("iceberg", "table", marks=pytest.mark.extended)],
    ids=["delta-table", "iceberg-tables", "delta-tables", "iceberg-table"])
def test_a_resnapshot_during_a_write_load_repairs_six_differences(
        spark: Any, tmp_path: Path, kind: str, mode: str) -> None:
    with orders_replicated(spark, tmp_path, mode, kind) as (store_path, target, spec, running):
        settle(running.pipeline, store_path)
        target.tamper(DELETED, CHANGED, ADDED)
        report = reconcile_table(spec, target.uri)
        assert found(report) == {"MISSING": set(DELETED), "EXTRA": {ADDED},
                                 "DIFFERENT": set(CHANGED), "IN-FLIGHT": set()}
        writer = DemoWriter(store_path, changes=600, duration_s=8, seed=5)
        writer.start()
        time.sleep(2.0)  # the load runs: the repair's comparison sees rows in flight
        with open_board(spec) as board:
            done = finished(board, board.add(Signal(table=DEMO_TABLE)).id, running)
        assert done.state is SignalState.DONE, done
        counts = done.counts  # the six tampered rows, and the writer's keys in flight
        assert counts["upserts"] + counts["deletes"] == counts["differences"], done
        assert counts["differences"] - counts["in_flight"] == 6 and counts["deletes"] >= 1, done
        writer.join()
        assert writer.error is None
        settle(running.pipeline, store_path)
        report = reconcile_table(spec, target.uri)
        assert report.comparison.differences == [], report.comparison.differences


@pytest.mark.parametrize("mode", MODES)
def test_a_resnapshot_of_an_idle_table_runs_without_a_write(spark: Any, tmp_path: Path,
                                                            mode: str) -> None:
    """No change reaches the table after the signal: the job's watch loop runs the repair
    within its look (``WATCH_EVERY_S``) and the runner's interval (``CHECK_EVERY_S``) plus the
    repair's own time, no batch needed."""
    with orders_replicated(spark, tmp_path, mode, "delta") as (_, target, spec, running):
        target.tamper(DELETED, CHANGED, ADDED)
        batches = running.pipeline.applied_batch()
        with open_board(spec) as board:
            asked = time.monotonic()
            done = finished(board, board.add(Signal(table=DEMO_TABLE)).id, running, timeout=60)
            took = time.monotonic() - asked
        assert done.state is SignalState.DONE, done
        # (reconcile's in-flight position trails the target's last batch: some of the six
        # may be counted in flight; every one is repaired)
        assert done.counts["differences"] == 6 and done.counts["deletes"] == 1, done
        # two trigger intervals, one look of the job and one interval of the runner, and
        # the repair's own seconds (a few on this machine)
        assert took < 2 * TRIGGER_MS / 1000 + WATCH_EVERY_S + CHECK_EVERY_S + 10, took
        assert running.pipeline.applied_batch() == batches  # no batch ran it
        report = reconcile_table(spec, target.uri)  # no write since: an exact comparison
        assert report.comparison.differences == [], report.comparison.differences


@pytest.mark.parametrize(("mode", "policy"), [("table", "resnapshot"), ("tables", "resnapshot"),
                                              ("table", "fail")])
def test_a_stream_restarted_after_its_changes_were_trimmed(spark: Any, tmp_path: Path,
                                                           mode: str, policy: str) -> None:
    """Stopped, its source changed and the change log trimmed, restarted: with
    ``onDataLoss=resnapshot`` the source records a signal and goes on, the job repairs the
    target, reconcile reports zero; with ``fail`` the job ends on the typed error."""
    store_path = tmp_path / "store.db"
    make_orders(store_path)
    target = OrdersTarget.delta(tmp_path)
    spec = SourceSpec(f"local://{store_path}", DEMO_TABLE)
    with replicating(spark, mode, store_path, tmp_path / "out", target) as running:
        first_rows_applied(running)
    with LocalTablestore(store_path) as store:  # while the job is stopped
        for key in DELETED:
            store.delete_row(DEMO_TABLE, {"order_id": key})
        for key in CHANGED:
            store.update_row(DEMO_TABLE, {"order_id": key}, {"status": "changed"})
        store.put_row(DEMO_TABLE, {"order_id": ADDED}, {"status": "added"})
        assert store.trim_history(DEMO_TABLE, keep_last=0) > 0
        store.put_row(DEMO_TABLE, {"order_id": BASE + 200}, {"status": "after the trim"})
    if policy == "fail":
        with replicating(spark, mode, store_path, tmp_path / "out", target,
                         {"onDataLoss": policy}, ends=JobExit.FAILED) as running:
            wait_until("the job to end on the lost records", lambda: running.exit,
                       lambda ended: bool(ended), timeout=180)
        assert any("change(s) are lost" in line and "TrimmedDataError" in line
                   for line in running.lines), running.lines
        return
    with replicating(spark, mode, store_path, tmp_path / "out", target,
                     {"onDataLoss": policy}) as running:
        with open_board(spec) as board:
            done = wait_until("the job ran the resnapshot the source recorded",
                              board.signals, lambda s: bool(s) and s[0].finished,
                              timeout=180, query=running.pipeline.state_query)[0]
        assert done.state is SignalState.DONE and done.origin == "data-loss", done
        assert "every difference repaired" in done.note, done
        settle(running.pipeline, store_path)
        report = reconcile_table(spec, target.uri)
        assert report.comparison.differences == [], report.comparison.differences
