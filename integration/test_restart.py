"""SIGKILL the Spark driver mid-batch, restart on the same checkpoint, prove exactly-once.

The query runs in its own process (testkit/runner.py) into an ``ExactlyOnceParquetSink``.
The test parks it at a crash point (testkit/crash_points.py), kills the whole process tree with
SIGKILL, writes more changes (with a split), restarts, and finally compares the sink with the
store's change log: nothing lost, nothing doubled, per-key order and final state equal. A crash
after the sink stored a batch but before Spark's commit log makes Spark replay that batch; the
sink records whether the replay carried exactly the same (``_channel_id``, ``_sequence``) set.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from connector.local import LocalTablestore
from connector.spark_compat import FEATURES
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from tablestore_cdc.verify import rows_by_key, verify
from testkit.crash_points import environment as crash_environment
from testkit.fixtures import write_changes
from testkit.processes import kill_at_crash_point, kill_tree, start_runner
from testkit.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.mark.oldest_spark  # make test runs it here, on the oldest PySpark (make test-spark-oldest)
@pytest.mark.extended  # and make test-extended on the newest
def test_sigkill_mid_batch_and_restart_is_exactly_once(tmp_path: Path) -> None:
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER")], channels=3)
    write_changes(store, 400, keys=80)
    faults = tmp_path / "faults"
    faults.mkdir()
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    args = ["--store", str(tmp_path / "store.db"), "--table", "t", "--tunnel", "q",
            "--checkpoint", str(tmp_path / "ckpt"), "--sink", str(sink.path),
            "--stop-file", str(tmp_path / "stop"), "--option", "maxOffsetsPerChannel=60"]
    env = crash_environment(faults)
    log = tmp_path / "runner.log"

    # 1. the batch is in the sink but not in Spark's commit log: Spark must replay it
    for point in ("after_sink_write", "mid_read", "mid_commit_push"):
        killed = kill_at_crash_point(args, log, env, faults, point, timeout=180)
        assert killed >= 2, "the driver and its Python workers should have been killed"
        (faults / f"hit-{point}").unlink()
        # more changes while the query is down, with a split
        write_changes(store, 100, start=400 + 100 * len(list(faults.glob("fired-*"))), keys=80)
        if point == "mid_read":
            store.split_channel("t", store.list_channels("t")[0].channel_id)

    # 2. restart without faults and run until everything is delivered
    runner = start_runner(args, log, env)
    expected = len(store.change_log("t"))
    try:
        wait_until(f"{expected} changes delivered", lambda: sum(1 for _ in sink.deliveries(["id"])),
                   lambda n: n >= expected, timeout=240, process=runner)
        (tmp_path / "stop").touch()
        assert runner.wait(120) == 0, log.read_text()[-3000:]
    finally:
        kill_tree(runner.pid)

    result = verify(store.change_log("t"), sink.deliveries(["id"]), rows_by_key(store.scan("t")))
    print(result.summary(), file=sys.stderr)
    assert result.ok, f"{result.summary()} {result.examples}"
    replays = sink.replays()
    assert replays, "the crash after the sink write must have made Spark replay the batch"
    assert all(r["identical"] for r in replays), replays
    # an older PySpark's missing features: logged once per run of the query (4 runs)
    for sentence in FEATURES.degradations():
        assert log.read_text().count(sentence) == 4, sentence
