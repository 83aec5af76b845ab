"""The main job: the idempotent current-state table, `tablestore-cdc demo` and `replicate` end to
end.

The CLI runs are real subprocesses (each its own Spark driver), so a job's ``spark.stop()`` never
touches the shared test session.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connector.local import LocalTablestore
from connector.options import SourceOptions
from meta_store import open_meta_store
from tablestore_cdc.lakehouse import DeltaApplySink
from tablestore_cdc.sinks import deliveries_from_rows
from tablestore_cdc.verify import key_of, read_delta, rows_by_key, table_state, verify
from testkit.changelogs import changelog_rows
from testkit.processes import kill_tree
from testkit.waiting import wait_until

CLI = [sys.executable, "-m", "tablestore_cdc"]


def change(op: str, channel: str, seq: int, ts: int, id_: int, **attrs):
    return {"_op": op, "_channel_id": channel, "_sequence": f"{seq:020d}",
            "_commit_ts": dt.datetime.fromtimestamp(ts, dt.UTC), "id": id_,
            "_before": None, "_extra": None, **attrs}


def test_state_table_applies_each_change_once_in_commit_order(tmp_path):
    """The job's current-state table (a Delta table through the apply sink)."""
    state = DeltaApplySink(tmp_path / "state", key_columns=["id"])
    batch = [
        change("PUT", "ch-1", 1, 10, 1, v=1),
        change("PUT", "ch-1", 2, 11, 2, v=2),
        change("UPDATE", "ch-3", 1, 13, 1, v=3),  # a child channel, later commit time
        change("DELETE", "ch-1", 3, 12, 2),
    ]
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("_op", pa.string()),
                        ("_channel_id", pa.string()), ("_sequence", pa.string()),
                        ("_commit_ts", pa.timestamp("us", tz="UTC")), ("_before", pa.string()),
                        ("_extra", pa.string())])
    # delivery order inside a batch does not matter
    assert state.apply(pa.Table.from_pylist(batch[::-1], schema), "q", 0).changes == 4
    assert not state.apply(pa.Table.from_pylist(batch, schema), "q", 0).committed  # a replay
    rows = read_delta(str(tmp_path / "state"))
    assert table_state(rows, ["id"]) == {key_of({"id": 1}): {"v": 3}}


@pytest.mark.slow
@pytest.mark.oldest_spark  # make test runs it on the oldest PySpark; make test-install runs the
@pytest.mark.extended  # demo from the wheel; make test-extended on the newest PySpark
def test_demo_verifies_a_run_with_splits_and_a_merge(demo_run):
    result = demo_run  # 800 changes over 6 s on 3 channels (testkit.fixtures)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "0 lost, 0 duplicated" in result.stdout
    assert "(2 splits, 1 merge(s)" in result.stdout
    assert "current state matches the source table" in result.stdout


def test_demo_refuses_to_wipe_a_foreign_directory(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    result = subprocess.run([*CLI, "demo", "--workdir", str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "not created by the demo" in result.stderr
    assert (tmp_path / "precious.txt").exists()


def write(store: LocalTablestore, start: int, n: int, table: str = "t") -> None:
    for i in range(start, start + n):
        if i % 6 == 5:
            store.delete_row(table, {"id": i % 50})
        else:
            store.put_row(table, {"id": i % 50}, {"v": i})


@pytest.mark.slow
def test_replicate_stops_on_ctrl_c_and_sigterm_and_resumes_exactly(tmp_path):
    """Stopped with Ctrl-C, then with SIGTERM (each sent to the whole process group, as a
    terminal and a service manager do): one clean line, no stack, the query's lease released
    (not left to expire: the next start is not refused), and the copy exact across both."""
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=2)
    out = tmp_path / "out"
    command = [*CLI, "replicate", "--store", str(store.path), "--table", "t",
               "--output", str(out), "--initial", "none"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    source = SourceOptions.from_spark({"endpoint": f"local://{store.path}", "table.name": "t",
                                       "tunnel.name": "replicate"})

    def run_until_caught_up(stop_signal: signal.Signals) -> None:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            wait_until("the Delta table to equal the store's table",
                       lambda: (out / "t" / "_delta_log").exists()
                       and table_state(read_delta(str(out / "t")), ["id"])
                       == {k: dict(v) for k, v in rows_by_key(store.scan("t")).items()},
                       timeout=300, process=process)
            os.killpg(process.pid, stop_signal)
            output, _ = process.communicate(timeout=120)
            assert process.returncode == 0, output[-3000:]
            assert "stopped cleanly" in output
            assert "Traceback" not in output and "\tat org.apache" not in output  # no stack
            assert "SourceInUseError" not in output  # the previous run's lease was released
            # its progress lines and the planning process's log lines each keep a line
            lines = output.splitlines()
            progress = [line for line in lines if "change(s) applied" in line]
            assert progress and all(line.startswith("tables: ") and "\r" not in line
                                    and "connector." not in line for line in progress)
            assert any("connector.protocol" in line for line in lines)  # logs are there too
            # released, not left to expire (120 s): the planning process may end a few
            # seconds after the driver on a loaded machine, releasing it as it goes
            with open_meta_store(source.meta_store) as meta:
                wait_until("the stopped job's lease to be released",
                           lambda: meta.get_lease(source.source_identity),
                           lambda lease: lease is None or not lease.live(time.time()), timeout=30)
        finally:
            kill_tree(process.pid)

    write(store, 0, 300)
    run_until_caught_up(signal.SIGINT)  # Ctrl-C
    write(store, 300, 200)
    store.split_channel("t", store.list_channels("t")[0].channel_id)
    write(store, 500, 200)
    run_until_caught_up(signal.SIGTERM)

    rows = changelog_rows(out, "t")
    result = verify(store.change_log("t"), deliveries_from_rows(rows, ["id"]), check_order=False)
    assert (result.lost, result.duplicated, result.expected) == (0, 0, 700), result.examples


def _state_equals_store(target, store) -> bool:
    """Does the Delta table at ``target`` (the job's table of ``t``) equal the store's ``t``?"""
    return ((target / "_delta_log").exists()
            and table_state(read_delta(str(target)), ["id"])
            == {k: dict(v) for k, v in rows_by_key(store.scan("t")).items()})


@pytest.mark.slow
def test_replicate_started_twice_refuses_the_second_and_the_first_goes_on(tmp_path):
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=2)
    out = tmp_path / "out"
    command = [*CLI, "replicate", "--store", str(store.path), "--table", "t",
               "--output", str(out)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    write(store, 0, 200)
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until("the first job's Delta table", lambda: _state_equals_store(out / "t", store),
                   timeout=300, process=first)
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
        assert second.returncode == 4, second.stderr
        assert second.stderr.count("\n") == 1 and "already running" in second.stderr
        assert f"pid {first.pid}" in second.stderr
        write(store, 200, 200)  # the first is not disturbed: it delivers these too
        wait_until("the first job delivering after the refusal",
                   lambda: _state_equals_store(out / "t", store), timeout=300, process=first)
        assert first.poll() is None
        created = {p.relative_to(out) for p in out.rglob("*")} - set(before)
        assert all(p.parts[0] in ("t", "changelog", "_checkpoints", "logs") for p in created)
    finally:
        kill_tree(first.pid)


@pytest.mark.slow
@pytest.mark.extended  # one path: the next test's --tables run is the default suite's
@pytest.mark.parametrize("selection", ["--table", "--tables"])
def test_replicate_once_catches_up_and_exits_twice_in_a_row(tmp_path, selection):
    """The same for ``--table t`` and ``--tables t`` (one path: a selection of one); only the
    default target differs (``OUT/t``, ``OUT/lake/t``)."""
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=2)
    out = tmp_path / "out"
    command = [*CLI, "replicate", "--store", str(store.path), selection, "t",
               "--output", str(out), "--initial", "none", "--once"]
    target = out / "t" if selection == "--table" else out / "lake" / "t"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    write(store, 0, 250)
    for run_number in (1, 2):
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "caught up" in run.stderr and "Traceback" not in run.stderr
        assert _state_equals_store(target, store)
        if run_number == 1:  # writes between the runs, and a split
            store.split_channel("t", store.list_channels("t")[0].channel_id)
            write(store, 250, 150)
    rows = changelog_rows(out, "t")
    result = verify(store.change_log("t"), deliveries_from_rows(rows, ["id"]), check_order=False)
    assert (result.lost, result.duplicated, result.expected) == (0, 0, 400), result.examples


@pytest.mark.slow
def test_replicate_tables_once_catches_every_table_up_twice_in_a_row(tmp_path):
    """``replicate --tables --once``: each run exits 0 with every selected table equal to its
    source; a table created between the runs joins the second; the change log holds each
    table's changes exactly once."""
    store = LocalTablestore(tmp_path / "store.db")
    for name in ("t1", "t2"):
        store.create_table(name, primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                           channels=2)
        write(store, 0, 120, table=name)
    out = tmp_path / "out"
    command = [*CLI, "replicate", "--store", str(store.path), "--tables", "t*",
               "--output", str(out), "--initial", "none", "--once"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    for run_number, tables in ((1, ("t1", "t2")), (2, ("t1", "t2", "t3"))):
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "caught up" in run.stderr and "Traceback" not in run.stderr
        for name in tables:
            assert (table_state(read_delta(str(out / "lake" / name)), ["id"])
                    == {k: dict(v) for k, v in rows_by_key(store.scan(name)).items()}), name
        if run_number == 1:  # writes between the runs, a split, a new table
            store.split_channel("t1", store.list_channels("t1")[0].channel_id)
            write(store, 120, 80, table="t1")
            store.create_table("t3", primary_key=[("id", "INTEGER")],
                               columns=[("v", "INTEGER")], channels=2)
            write(store, 0, 50, table="t3")
    logged = [(r["_table"], r["_channel_id"], r["_sequence"])
              for r in pq.read_table(out / "changelog").to_pylist()]
    assert sorted(logged) == sorted((name, c.channel_id, c.sequence)
                                    for name in ("t1", "t2", "t3")
                                    for c in store.change_log(name))
