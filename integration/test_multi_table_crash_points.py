"""``tablestore-cdc replicate --tables`` SIGKILLed parked at the crash points inside one
multi-table batch (``testkit.crash_points``; docs/reliability.md, "Crash points"), restarted after
each kill, while a writer changes each of three tables (Delta SCD 1 with two splits and a
merge, Iceberg SCD 2, Delta SCD 2). After the run (``integration.faults.multi_table``):

- every target equals its source table row by row, read back with ``deltalake`` /
  ``pyiceberg``, and an SCD 2 target's versions equal its change log's;
- the committed change log holds each table's change log exactly once, in order per key;
- no target holds a batch twice; a kill in the apply cut a batch some target already held,
  and its replay committed the tables that did not hold it and nothing into those that did.

The default suite kills once, between two tables' target commits of one batch (the moment a
multi-table batch is half applied). Every point -- between two tables' offsets, plans, source
commits and target commits, after every table's target commit, and the change log's own
before (``mid_read``: ends claimed, nothing written) and after (``commit_start``: the change
log committed, no table's source commit made) -- runs under ``faults_full``:
``python -m pytest -m faults_full integration/test_multi_table_crash_points.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from connector.local import LocalTablestore
from connector.multiplex import MultiTableOptions, MultiTableStreamReader
from integration.faults.multi_table import (
    APPLIER_ICEBERG,
    COLUMNS,
    KEY,
    applier_targets,
    batch_applier,
    read_batch,
    run_crash_points,
    source_of,
)
from testkit.crash_points import POINTS
from testkit.crash_points import environment as crash_environment
from testkit.processes import REPO, arm_crash_point, kill_tree
from testkit.target_reads import history_mismatches, source_history, table_history
from testkit.waiting import wait_until

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

#: the points inside one multi-table batch, in the order a batch passes them
BATCH_POINTS = (
    "between_table_offsets",  # one table's end minted, the next's not; no offset log
    "between_table_plans",  # one table planned (manifest), the next not
    "mid_read",  # the change log's batch: an end claimed, nothing written
    "commit_start",  # the change log's batch committed, no table's source commit made
    "between_table_commits",  # one table's source commit made, the next's not
    "between_table_applies",  # one table's target commit made, the next's not
    "after_table_applies",  # every table's target commit made, the apply's commit log not
)


def test_the_batch_points_are_crash_points() -> None:
    assert set(BATCH_POINTS) <= set(POINTS)


@pytest.mark.slow
def test_the_apply_killed_inside_a_batch_commits_each_table_once_on_replay(
        tmp_path: Path) -> None:
    """The apply alone, without Spark: three batches read from the store by the multi-table
    reader (driven in Spark's order); batch 1 applied in a child process SIGKILLed between two
    tables' target commits, batch 2 in one SIGKILLed after every table's; each replayed as a
    restarted job would (a new ``MultiTableApply``, the same query id and batch id)."""
    store_path, faults = tmp_path / "store.db", tmp_path / "faults"
    faults.mkdir()
    tables = ("t1", "t2", "t3")
    with LocalTablestore(store_path) as store:
        for table in tables:
            store.create_table(table, KEY, COLUMNS, channels=2)
        reader = MultiTableStreamReader(MultiTableOptions.from_spark({
            "endpoint": f"local://{store_path}", "tables": "t*", "tunnel.name": "crash"}))
        offset, files = reader.initialOffset(), []
        for n in range(3):
            for table in tables:
                for i in range(6):
                    store.put_row(table, {"id": (n * 4 + i) % 10}, {"v": f"{table}-{n}-{i}",
                                                                     "n": float(n)})
                store.delete_row(table, {"id": (n * 3) % 10})
            offset, rows = read_batch(reader, offset)
            assert sorted(set(rows.column("_table").to_pylist())) == list(tables)
            files.append(tmp_path / f"batch-{n}.parquet")
            pq.write_table(rows, files[-1])
        reader.stop()
    sources = {t: source_of(store_path, t) for t in tables}
    targets = applier_targets(tmp_path)

    def holding(batch_id: int) -> list[str]:
        return [t for t in tables if ("app", batch_id) in targets.batches(t)]

    batch_applier(tmp_path).apply_batch(pq.read_table(files[0]), "app", 0)
    for batch_id, point, held in ((1, "between_table_applies", ["t1"]),
                                  (2, "after_table_applies", list(tables))):
        arm_crash_point(faults, point)
        with open(tmp_path / "apply.log", "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "integration.faults.multi_table", str(tmp_path),
                 str(files[batch_id]), "app", str(batch_id)], cwd=REPO, stdout=log,
                stderr=subprocess.STDOUT, env={**os.environ, **crash_environment(faults)},
                start_new_session=True)
        try:
            wait_until(f"the apply to reach {point}", (faults / f"hit-{point}").exists,
                       timeout=120, process=child)
        finally:
            assert kill_tree(child.pid) >= 1
        assert holding(batch_id) == held, f"at the kill at {point}"
        before = {t: len(targets.batches(t)) for t in tables}
        batch_applier(tmp_path).apply_batch(pq.read_table(files[batch_id]), "app", batch_id)
        assert holding(batch_id) == list(tables)
        added = {t: len(targets.batches(t)) - before[t] for t in tables}
        assert added == {t: 0 if t in held else 1 for t in tables}, "a replay added a commit"
    for table in tables:
        assert targets.batches(table) == [("app", 0), ("app", 1), ("app", 2)]
        assert targets.state(table) == sources[table][0], f"{table} differs from its source"
    history = targets.rows(APPLIER_ICEBERG)
    assert history is not None
    assert not history_mismatches(source_history(sources[APPLIER_ICEBERG][1]),
                                  table_history(history, ["id"]))


@pytest.mark.slow
@pytest.mark.faults_full
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("cycle", ["two", "one"])
def test_a_kill_at_every_point_of_a_multi_table_batch(tmp_path: Path, cycle: str) -> None:
    """``cycle`` ``one`` (``replicate --cycle one``): the same points, passed by one query
    that reads, logs and applies each batch."""
    run = run_crash_points(tmp_path, BATCH_POINTS, cycle=cycle)
    print(f"{run.starts} starts, {run.seconds:.0f}s: {run.kills}")
    assert [k.point for k in run.kills] == list(BATCH_POINTS)
