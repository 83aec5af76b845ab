"""A re-snapshot survives a SIGKILL of the job during its repair (``tablestore_cdc.resnapshot``).

``tablestore-cdc replicate`` runs in its own process tree while a writer keeps changing the
source; the target loses three rows, has two changed and one added behind the product's back;
``tablestore-cdc resnapshot`` asks for a repair; the job is SIGKILLed while parked at a crash
point of the repair (``testkit/crash_points.py``): before its commit, or after it with the signal
not yet marked done. The restarted job finishes the signal (after the commit: without writing
again) and reconcile then reports zero differences."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from connector.local import LocalTablestore
from tablestore_cdc.reconcile import SourceSpec, reconcile_table
from tablestore_cdc.verify import read_delta, rows_by_key, table_state
from testkit.crash_points import environment as crash_environment
from testkit.processes import kill_tree
from testkit.waiting import wait_until

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "tablestore_cdc"]
TABLE = "t"


class Writer(threading.Thread):
    """New keys from 1000 up, one every 0.1 s, until stopped: the job keeps running batches."""

    def __init__(self, store_path: Path) -> None:
        super().__init__(daemon=True)
        self.store_path, self.stop_event = store_path, threading.Event()

    def run(self) -> None:
        with LocalTablestore(self.store_path) as store:
            key = 1000
            while not self.stop_event.wait(0.1):
                store.put_row(TABLE, {"id": key}, {"v": key})
                key += 1


def replicate(store_path: Path, out: Path, log: Path, env: dict[str, str]
              ) -> subprocess.Popen[bytes]:
    with open(log, "ab") as sink:
        return subprocess.Popen([*CLI, "replicate", "--store", str(store_path), "--table", TABLE,
                                 "--output", str(out)], env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


def cli(*args: str) -> str:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("point", [
    pytest.param("resnapshot_before_commit", marks=pytest.mark.extended),
    "resnapshot_after_commit"])
def test_a_resnapshot_killed_during_its_repair_ends_equal(tmp_path: Path, point: str) -> None:
    store_path, out, faults = tmp_path / "store.db", tmp_path / "out", tmp_path / "faults"
    faults.mkdir()
    with LocalTablestore(store_path) as store:
        store.create_table(TABLE, primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                           channels=2)
        for i in range(30):
            store.put_row(TABLE, {"id": i}, {"v": i})
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **crash_environment(faults)}
    table_path = out / TABLE
    (faults / f"arm-{point}").touch()
    job = replicate(store_path, out, tmp_path / "job1.log", env)
    writer = Writer(store_path)
    try:
        wait_until("the first rows applied", lambda: (table_path / "_delta_log").exists()
                   and len(read_delta(str(table_path))) >= 30, timeout=300, process=job)
        writer.start()
        table = deltalake.DeltaTable(str(table_path))
        table.delete("id IN (1, 2, 3)")
        deltalake.DeltaTable(str(table_path)).update(predicate="id IN (5, 6)",
                                                     updates={"v": "-1"})
        schema = pa.schema(deltalake.DeltaTable(str(table_path)).schema().to_arrow())
        deltalake.write_deltalake(str(table_path), pa.Table.from_pylist(
            [{"id": 99, "v": 99}], schema=schema), mode="append")
        asked = cli("resnapshot", "--store", str(store_path), "--table", TABLE)
        signal_id = asked.split()[1]
        wait_until(f"the job parked at {point}", (faults / f"hit-{point}").exists,
                   timeout=300, process=job)
    finally:
        kill_tree(job.pid)
    assert "running" in cli("resnapshot", "--store", str(store_path), "--table", TABLE, "--list")
    job = replicate(store_path, out, tmp_path / "job2.log", env)
    try:
        listed = wait_until("the restarted job to finish the resnapshot", lambda: cli(
            "resnapshot", "--store", str(store_path), "--table", TABLE, "--list"),
            lambda text: " done" in text, timeout=300, process=job)
        assert signal_id in listed
        if point == "resnapshot_after_commit":
            assert "the repair was committed before a restart" in listed, listed
        else:
            # the six tampered rows at least (keys the writer changes meanwhile too)
            assert re.search(r"deletes [1-9]", listed) and re.search(r"upserts [5-9]|upserts \d\d",
                                                                    listed), listed
        repairs = [c for c in deltalake.DeltaTable(str(table_path)).history()
                   if str(c.get("tablestore-cdc.query-id", "")).startswith("resnapshot-")]
        assert len(repairs) == 1, repairs
        writer.stop_event.set()
        writer.join()
        with LocalTablestore(store_path) as store:
            wanted = {k: dict(v) for k, v in rows_by_key(store.scan(TABLE)).items()}
        wait_until("the target to equal the source",
                   lambda: table_state(read_delta(str(table_path)), ["id"]) == wanted,
                   timeout=300, process=job)
        time.sleep(1.0)
    finally:
        kill_tree(job.pid)
    report = reconcile_table(SourceSpec(f"local://{store_path}", TABLE),
                             f"delta://{table_path}")
    assert report.comparison.differences == [], report.comparison.differences
