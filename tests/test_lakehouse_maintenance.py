"""The replication job's own maintenance of its targets (``tablestore_cdc.lakehouse.upkeep``):
a stream of many small batches through the real Delta and Iceberg sinks, with the policy's
thresholds set low, keeps its files and snapshots bounded, its rows exact after every batch,
a reader's pinned version readable, and a failed run never fails a batch."""

from __future__ import annotations

import logging
import os
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from deltalake import DeltaTable  # noqa: E402

from tablestore_cdc.lakehouse import upkeep  # noqa: E402
from tablestore_cdc.lakehouse.upkeep import (  # noqa: E402
    MaintenancePolicy,
    MaintenanceSettingError,
    Upkeep,
)
from tablestore_cdc.table_status import AppliedTable, TableStatus  # noqa: E402
from testkit.lakehouse import ChangeStream, Delta, Iceberg, batch, change  # noqa: E402

#: a policy that runs after every 3 batches and compacts from 4 small files
LOW = MaintenancePolicy(every_batches=3, compact_files=4, keep_snapshots=5,
                        vacuum_every_minutes=0)


def maintained_stream(target: Delta | Iceberg) -> tuple[Any, ChangeStream]:
    """``target``'s apply sink maintaining it under ``LOW``, and a new stream of batches."""
    sink = target.sink()
    sink.upkeep = Upkeep(LOW)
    return sink, ChangeStream()


def rows_of(rows: list[dict[str, Any]]) -> dict[int, tuple[str, int]]:
    return {row["id"]: (row["name"], row["qty"]) for row in rows}


def test_a_stream_of_small_batches_into_delta_keeps_its_files_bounded_and_its_rows_exact(
        tmp_path: Path) -> None:
    target = Delta(tmp_path)
    sink, stream = maintained_stream(target)
    runs = []
    most_files = 0
    for batch_id in range(40):
        result = sink.apply(stream.next_batch(), "q", batch_id)
        assert rows_of(target.rows()) == stream.state
        most_files = max(most_files, len(DeltaTable(target.path).file_uris()))
        if result.maintenance is not None:
            runs.append(result.maintenance)
    assert len(runs) == 13  # every third batch
    assert all(run.error is None for run in runs)
    assert any(run.compacted and run.files_after < run.files_before for run in runs)
    # between two runs: at most 4 small files kept, plus 3 batches' files
    assert most_files <= LOW.compact_files + 3 * LOW.every_batches
    assert target.sink().committed_batch("q") == 39  # a restart finds its batch


def test_a_stream_of_small_batches_into_iceberg_keeps_its_snapshots_bounded_and_its_rows_exact(
        tmp_path: Path) -> None:
    target = Iceberg(tmp_path)
    sink, stream = maintained_stream(target)
    expired = committed = last = compactions = 0
    most_snapshots = most_files = 0
    for batch_id in range(30):
        result = sink.apply(stream.next_batch(), "q", batch_id)
        committed += result.committed
        last = batch_id if result.committed else last
        assert rows_of(target.rows()) == stream.state
        most_snapshots = max(most_snapshots, target.commits())
        most_files = max(most_files, len(list(sink.table().scan().plan_files())))
        if result.maintenance is not None:
            assert result.maintenance.error is None
            assert result.maintenance.snapshots_after <= LOW.keep_snapshots
            expired += result.maintenance.snapshots_expired
            compactions += result.maintenance.compacted
    assert most_snapshots <= LOW.keep_snapshots + LOW.every_batches
    assert most_files <= LOW.compact_files + 3 * LOW.every_batches
    # each compaction is a snapshot of its own, without a batch
    assert expired == committed + compactions - target.commits() > 0
    assert target.sink().committed_batch("q") == last  # the marker walk-back still finds it


def test_an_iceberg_vacuum_removes_only_what_no_kept_snapshot_references(tmp_path: Path) -> None:
    """Files older than the retention (aged here) go once nothing references them; the
    current snapshot's files stay, whatever their age."""
    target = Iceberg(tmp_path)
    sink = target.sink()
    stream = ChangeStream(seed=3)
    for batch_id in range(12):
        sink.apply(stream.next_batch(), "q", batch_id)
    two_hours_ago = time.time() - 2 * 3600
    for path in (tmp_path / "warehouse").rglob("*"):
        if path.is_file():
            os.utime(path, (two_hours_ago, two_hours_ago))
    on_disk = sum(1 for p in (tmp_path / "warehouse").rglob("*.parquet"))
    run = upkeep.maintain(sink, MaintenancePolicy(keep_snapshots=2, vacuum_hours=1))
    assert run is not None and run.error is None
    assert run.snapshots_expired == 10 and run.snapshots_after == 2
    assert run.files_removed > 0
    assert sum(1 for p in (tmp_path / "warehouse").rglob("*.parquet")) < on_disk
    assert rows_of(target.rows()) == stream.state
    sink.upkeep = Upkeep(LOW)
    for batch_id in range(12, 20):  # the stream goes on over what is left
        sink.apply(stream.next_batch(), "q", batch_id)
        assert rows_of(target.rows()) == stream.state


def test_a_reader_that_pinned_a_delta_version_within_the_retention_still_reads_it(
        tmp_path: Path) -> None:
    target = Delta(tmp_path)
    sink = target.sink()
    stream = ChangeStream(seed=11)
    for batch_id in range(5):
        sink.apply(stream.next_batch(), "q", batch_id)
    pinned = DeltaTable(target.path)  # a running reader, on the version of batch 4
    version, seen = pinned.version(), rows_of(pinned.to_pyarrow_table().to_pylist())
    # the file of a batch killed before its commit, two hours ago
    orphan = Path(target.path) / "part-00000-killed-batch.parquet"
    orphan.write_bytes(b"PAR1")
    two_hours_ago = time.time() - 2 * 3600
    os.utime(orphan, (two_hours_ago, two_hours_ago))
    sink.upkeep = Upkeep(MaintenancePolicy(every_batches=2, compact_files=1, vacuum_hours=1,
                                           vacuum_every_minutes=0))
    compacted = 0
    for batch_id in range(5, 25):
        result = sink.apply(stream.next_batch(), "q", batch_id)
        compacted += bool(result.maintenance is not None and result.maintenance.compacted)
    assert compacted >= 5
    assert not orphan.exists()
    assert rows_of(pinned.to_pyarrow_table().to_pylist()) == seen
    again = DeltaTable(target.path, version=version)
    assert rows_of(again.to_pyarrow_table().to_pylist()) == seen
    assert rows_of(target.rows()) == stream.state


def test_a_reader_that_planned_an_iceberg_snapshot_still_reads_its_files(tmp_path: Path) -> None:
    """Expiry drops the snapshot from the metadata, but its files are younger than the
    retention: a scan planned before reads them all."""
    target = Iceberg(tmp_path)
    sink = target.sink()
    stream = ChangeStream(seed=5)
    for batch_id in range(4):
        sink.apply(stream.next_batch(), "q", batch_id)
    seen = dict(stream.state)
    scan = sink.table().scan()  # planned on the current snapshot
    sink.upkeep = Upkeep(MaintenancePolicy(every_batches=1, keep_snapshots=1,
                                           vacuum_every_minutes=0))
    for batch_id in range(4, 12):
        result = sink.apply(stream.next_batch(), "q", batch_id)
        assert result.maintenance is not None and result.maintenance.error is None
    assert target.commits() <= 2
    assert rows_of(scan.to_arrow().to_pylist()) == seen


def test_a_failed_maintenance_run_is_logged_and_retried_without_failing_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    target = Delta(tmp_path)
    sink = target.sink()
    sink.upkeep = Upkeep(MaintenancePolicy(every_batches=2, compact_files=1))
    real = upkeep._compact_delta
    failures: list[int] = []

    def failing_once(table: Any, key: str) -> None:
        if not failures:
            failures.append(1)
            raise OSError("the store did not answer")
        real(table, key)

    monkeypatch.setattr(upkeep, "_compact_delta", failing_once)
    stream = ChangeStream(seed=2)
    applied = AppliedTable()
    caplog.set_level(logging.WARNING, "tablestore_cdc.lakehouse")
    results = []
    for batch_id in range(6):
        result = sink.apply(stream.next_batch(), "q", batch_id)
        applied.record(result)
        results.append(result)
        assert rows_of(target.rows()) == stream.state
    failed, retried = results[1].maintenance, results[3].maintenance
    assert failed.error == "OSError: the store did not answer"
    assert [r.message for r in caplog.records if "maintenance failed" in r.message] == [
        f"table {sink}: maintenance failed, retried at its next run: "
        "OSError: the store did not answer"]
    assert retried.error is None and retried.compacted
    status = TableStatus(table="orders", job="out", selection="orders", state="streaming",
                         **applied.status_fields(time.time()))
    assert status.last_maintenance_at == results[5].maintenance.at
    assert status.target_files == results[5].maintenance.files_after
    assert "unreferenced file(s) removed" in (status.last_maintenance or "")
    from tablestore_cdc.pipeline.metrics import TableMetrics

    metrics = TableMetrics()
    metrics.update({"orders": status})
    assert metrics.registry.get_sample_value("tablestore_cdc_table_target_files",
                                             {"table": "orders"}) == status.target_files
    assert metrics.registry.get_sample_value(
        "tablestore_cdc_table_last_maintenance_timestamp_seconds",
        {"table": "orders"}) == status.last_maintenance_at


@pytest.mark.parametrize("kind", [Delta, Iceberg])
def test_a_lost_race_with_another_commit_drops_the_compaction_not_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: Any) -> None:
    """Another writer of the table commits a rewrite of its files between the run's look at
    the table and its compaction's commit: the format refuses the compaction, the run says
    so (no error), the other writer's rows and the stream's stay."""
    target = kind(tmp_path)
    sink = target.sink()
    other = target.sink()  # another process of the job (a zombie of its query)
    for batch_id in range(6):  # several files: each batch appends new keys
        sink.apply(batch(*(change("PUT", "c", 100 * batch_id + i, 1, 10 * batch_id + i,
                                  "a", i) for i in range(3))), "q", batch_id)
    name = "_compact_delta" if kind is Delta else "_compact_iceberg"
    real = getattr(upkeep, name)

    def raced(*args: Any) -> Any:
        other.apply(batch(change("PUT", "c", 9999, 2, 0, "other", 1)), "q", 6)
        return real(*args)

    monkeypatch.setattr(upkeep, name, raced)
    run = upkeep.maintain(sink, MaintenancePolicy(compact_files=1))
    assert run is not None and run.error is None and not run.compacted
    rows = rows_of(target.rows())
    assert rows[0] == ("other", 1) and len(rows) == 18
    monkeypatch.setattr(upkeep, name, real)  # the next run compacts
    again = upkeep.maintain(sink, MaintenancePolicy(compact_files=1))
    assert again is not None and again.compacted and rows_of(target.rows()) == rows


def test_a_table_is_maintained_after_the_minutes_or_the_batches_whichever_first() -> None:
    now = [1000.0]
    schedule = Upkeep(MaintenancePolicy(every_minutes=10, every_batches=3), clock=lambda: now[0])
    schedule._batches = 2
    assert not schedule.due()
    now[0] += 600
    assert schedule.due()
    assert not Upkeep(MaintenancePolicy.off(), clock=lambda: now[0] + 3600).due()


def test_a_maintenance_setting_out_of_range_is_refused_by_name() -> None:
    with pytest.raises(MaintenanceSettingError, match="'vacuum_hours': must be a number of at "
                       "least 1.0 \\(got 0.5\\)") as caught:
        MaintenancePolicy(vacuum_hours=0.5)
    assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)
    with pytest.raises(MaintenanceSettingError, match="keep_snapshots"):
        MaintenancePolicy(keep_snapshots=0)
    with pytest.raises(MaintenanceSettingError, match="every_minutes"):
        MaintenancePolicy(every_minutes=float("inf"))


def test_the_maintenance_flags_make_the_policy_and_a_bad_one_is_named() -> None:
    policy = upkeep.policy_of("on", ["every_batches=5", "small-file-mb=8", "expire_hours=0.5"])
    assert (policy.every_batches, policy.small_file_bytes, policy.expire_hours) == (
        5, 8 << 20, 0.5)
    assert not upkeep.policy_of("off").enabled
    for mode, settings, named in (("sometimes", [], "'--maintenance'"),
                                  ("on", ["keep=3"], "'keep'"),
                                  ("on", ["every_batches=2.5"], "'every_batches'"),
                                  ("on", ["vacuum_hours=nan"], "'vacuum_hours'"),
                                  ("on", ["vacuum_hours=0"], "'vacuum_hours'")):
        with pytest.raises(MaintenanceSettingError, match=named):
            upkeep.policy_of(mode, settings)


def test_replicate_refuses_a_bad_maintenance_setting_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tablestore_cdc.commands.app import app

    (tmp_path / "s.db").touch()  # it must exist; the flags are refused before it is read
    for flags, named in ((["--maintenance", "weekly"], "'--maintenance'"),
                         (["--maintenance-setting", "vacuum_hours=0"], "'vacuum_hours'")):
        result = CliRunner().invoke(app, ["replicate", "--store", str(tmp_path / "s.db"),
                                          "--output", str(tmp_path / "out"), "--table", "t",
                                          *flags])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and "Traceback" not in result.output
        assert not (tmp_path / "out").exists()


def test_a_table_of_the_config_file_sets_its_own_maintenance(tmp_path: Path) -> None:
    from tablestore_cdc.pipeline.queries import ApplySettings
    from tablestore_cdc.pipeline.table_config import TableConfigError, load_table_config

    path = tmp_path / "tables.toml"
    path.write_text("[defaults]\nmaintenance = {every_batches = 20}\n"
                    "[tables.orders]\nmaintenance = {compact_files = 200, small_file_mb = 8}\n"
                    "[tables.audit]\nmaintenance = {enabled = false}\n")
    config = load_table_config(path)
    base = ApplySettings("delta:///lake/{table}")
    orders = config.for_table("orders", base)[0].maintenance
    assert (orders.every_batches, orders.compact_files, orders.small_file_bytes) == (
        20, 200, 8 << 20)
    assert not config.for_table("audit", base)[0].maintenance.enabled
    assert config.for_table("users", base)[0].maintenance.every_batches == 20
    flagged = ApplySettings("delta:///lake/{table}", maintenance=MaintenancePolicy.off())
    assert not config.for_table("orders", flagged, frozenset({"maintenance"}))[0] \
        .maintenance.enabled  # a flag given on the command line wins
    for bad in ("vacuum_hours = 0", "vacuum_hours = inf", "every_minutes = nan",
                "keep = 3"):
        path.write_text(f"[tables.orders]\nmaintenance = {{{bad}}}\n")
        with pytest.raises(TableConfigError, match=f"orders.*{bad.split()[0]}"):
            load_table_config(path)


def test_an_iceberg_table_of_many_small_files_is_compacted_into_few_with_its_rows(
        tmp_path: Path) -> None:
    """pyiceberg has no compaction: the job's own rewrites the small files, sorted by key, in
    one snapshot without a batch marker; a restart still finds its batch."""
    target = Iceberg(tmp_path)
    sink = target.sink()
    expected = {}
    for batch_id in range(12):  # new keys: every batch appends a file of its own
        ids = range(batch_id * 10, batch_id * 10 + 10)
        sink.apply(batch(*(change("PUT", "c", i + 1, i + 1, i, f"n{i}", i) for i in ids)),
                   "q", batch_id)
        expected.update({i: (f"n{i}", i) for i in ids})
    assert len(list(sink.table().scan().plan_files())) == 12
    run = upkeep.maintain(sink, MaintenancePolicy(compact_files=4))
    assert run is not None and run.compacted and (run.files_before, run.files_after) == (12, 1)
    assert rows_of(target.rows()) == expected
    assert target.sink().committed_batch("q") == 11
    sink.apply(batch(change("DELETE", "c", 500, 500, 5), change("PUT", "c", 501, 501, 7, "x", 1)),
               "q", 12)
    del expected[5]
    expected[7] = ("x", 1)
    assert rows_of(target.rows()) == expected


@pytest.mark.slow
def test_a_replicate_run_maintains_its_target_and_records_it_in_the_table_status(
        tmp_path: Path) -> None:
    """A real ``replicate --once`` (its own Spark driver) with a run after every batch: the
    table's status in the meta store, as ``meta tables`` reads it, says what it did."""
    import json
    import subprocess
    import sys

    from typer.testing import CliRunner

    from connector.local import LocalTablestore
    from tablestore_cdc.commands.app import app
    from tablestore_cdc.verify import read_delta

    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=2)
    for i in range(40):
        store.put_row("t", {"id": i}, {"v": i})
    done = subprocess.run([sys.executable, "-m", "tablestore_cdc", "replicate", "--store",
                           str(store.path), "--table", "t", "--output", str(tmp_path / "out"),
                           "--once", "--maintenance-setting", "every_batches=1"],
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(read_delta(str(tmp_path / "out" / "t"))) == 40
    listed = CliRunner().invoke(app, ["meta", "tables", "--json", "--meta",
                                      f"sqlite://{tmp_path / 'store.meta.db'}"])
    assert listed.exit_code == 0, listed.output
    (status,) = json.loads(listed.output)["tables"]
    assert status["last_maintenance_at"] is not None and status["target_files"] >= 1
    assert status["last_maintenance"].endswith("unreferenced file(s) removed")
