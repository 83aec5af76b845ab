"""``replicate --tables`` into ``delta+s3://`` through an S3 fault proxy
(``testkit.s3_faults``): moto's server on 127.0.0.1 behind a proxy that answers ``503
SlowDown``, resets connections before a request reaches moto and after a PUT was applied (the
ambiguous commit) for about 5 % of the job's requests, every fourth commit PUT reset after it
landed too. The job's own state (``--output s3://BUCKET/state``: the change log and Spark's
checkpoints through Hadoop's S3A, the failed tables and held batches through pyarrow) goes
through the same proxy, every third checkpoint file's PUT (S3A's copy of ``offsets/N``,
``commits/N``, ``_spark_metadata/N`` to its name) reset after it landed: the ambiguous
checkpoint. Two tables (an INTEGER and a STRING key) of a real embedded store, a writer going
on while the job runs as its own process: the job never exits (a query that fails is restarted
by the job's restart policy, counted), and each table read back from moto directly (not
through the proxy) equals its source row by row, no key and no batch twice. The counts of each
fault, on the targets and on the state, are printed.

The default suite's run writes for 20 s with the state in S3 (130 to 180 s in all on a loaded
machine, where the same run with a local ``--output``, ``extended``, took 100 s: S3A's first
batch comes later). The long run (marker
``faults_full``: ``python -m pytest -m faults_full tests/test_lakehouse_s3_faults_spark.py``)
writes for ``S3_FAULTS_WRITE_S`` (300) seconds, the state in S3, with an outage of S3 of
``S3_FAULTS_OUTAGE_S`` (30) seconds in the middle, every request reset. With a local state
that outage outlasts delta-rs' retries and the sink's attempts of a commit and the job restarts
its query (``ObjectStoreError``); with the state in S3 the queries may wait in S3A's retries
instead (the AWS SDK's ``fs.s3a.attempts.maximum`` 5, then S3A's ``fs.s3a.retry.limit`` 7
backing off exponentially from 500 ms; a run with the 30 s outage saw no restart), so a restart
is allowed and counted, not required.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")

from connector.local import LocalTablestore  # noqa: E402
from tablestore_cdc.verify import rows_by_key, table_state  # noqa: E402
from testkit.aws import new_s3_bucket  # noqa: E402
from testkit.lakehouse import TWO_KEYS, two_keys_store, write_two_keys  # noqa: E402
from testkit.processes import REPO, kill_tree  # noqa: E402
from testkit.s3_faults import (  # noqa: E402
    AMBIGUOUS_CHECKPOINT,
    AMBIGUOUS_COMMIT,
    KINDS,
    S3FaultProxy,
)
from testkit.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "tablestore_cdc"]
TABLES = TWO_KEYS
#: the long run's writes and its outage of S3 (seconds)
LONG_WRITE_S = float(os.environ.get("S3_FAULTS_WRITE_S", "300"))
LONG_OUTAGE_S = float(os.environ.get("S3_FAULTS_OUTAGE_S", "30"))


def _table(moto: str, bucket: str, table: str) -> Any:
    """The Delta table as moto holds it (read without the proxy)."""
    from deltalake import DeltaTable

    return DeltaTable(f"s3://{bucket}/lake/{table}", storage_options={
        "AWS_ENDPOINT_URL": moto, "AWS_ALLOW_HTTP": "true", "aws_region": "us-east-1"})


def _rows(moto: str, bucket: str, table: str) -> list[dict[str, Any]] | None:
    """The table's rows, None before it exists."""
    from deltalake.exceptions import TableNotFoundError

    try:
        return _table(moto, bucket, table).to_pyarrow_table().to_pylist()
    except TableNotFoundError:
        return None


def _equal(store: LocalTablestore, moto: str, bucket: str, table: str) -> bool:
    rows = _rows(moto, bucket, table)
    column = TABLES[table][0]
    return rows is not None and table_state(rows, [column]) == {
        k: dict(v) for k, v in rows_by_key(store.scan(table)).items()}


# the state in S3 too (S3A's own requests under the faults) costs a minute more: extended; the
# default suite's run keeps the state local (the S3 state's kill test is in it)
@pytest.mark.parametrize("state", [
    pytest.param("s3", marks=pytest.mark.extended), "local"])
def test_replicate_into_s3_through_throttling_resets_and_ambiguous_commits(
        tmp_path: Path, moto_endpoint: str, state: str) -> None:
    _replicate_through_faults(tmp_path, moto_endpoint, write_s=20.0, outage_s=0.0,
                              state_in_s3=state == "s3")


@pytest.mark.faults_full
def test_replicate_into_s3_through_faults_and_an_outage_long(tmp_path: Path,
                                                            moto_endpoint: str) -> None:
    _replicate_through_faults(tmp_path, moto_endpoint, write_s=LONG_WRITE_S / 2,
                              outage_s=LONG_OUTAGE_S, after_s=LONG_WRITE_S / 2,
                              state_in_s3=True)


def _replicate_through_faults(tmp_path: Path, moto_endpoint: str, *, write_s: float,
                              outage_s: float, after_s: float = 0.0,
                              state_in_s3: bool) -> int:
    """The job through the proxy: writes for ``write_s``, an outage of ``outage_s`` (0: none),
    writes for ``after_s`` more; its state in ``s3://BUCKET/state`` or a local directory;
    every check of the module doc. Returns the job's restarts."""
    bucket = new_s3_bucket(moto_endpoint)  # the job's environment is the proxy's, not moto's
    store = two_keys_store(tmp_path / "store.db")
    write_two_keys(store, 0, 100)
    log = tmp_path / "replicate.log"
    output = f"s3://{bucket}/state" if state_in_s3 else str(tmp_path / "out")
    began = time.monotonic()
    with S3FaultProxy(moto_endpoint, rate=0.05, seed=11, commit_every=4,
                      checkpoint_every=3) as proxy:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "AWS_ENDPOINT_URL": proxy.url}
        command = [*CLI, "replicate", "--store", str(store.path), "--tables", "ints,names",
                   "--output", output,
                   "--target", f"delta+s3://{bucket}/lake/{{table}}",
                   "--target-option", "aws_region=us-east-1", "--trigger-ms", "300",
                   "--restart-backoff", "1:4"]
        with open(log, "wb") as sink:
            job = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        stop = threading.Event()

        def writer() -> None:  # the source keeps changing while the job runs
            start = 100
            while not stop.wait(1.0):
                write_two_keys(store, start, 15)
                start += 15

        thread = threading.Thread(target=writer, daemon=True)
        try:
            wait_until("both tables' first batches in S3",
                       lambda: all(_rows(moto_endpoint, bucket, t) for t in TABLES),
                       timeout=240, interval=1.0, process=job)
            first_batches = time.monotonic() - began
            thread.start()
            for seconds, down in ((write_s, 0.0), (outage_s, outage_s), (after_s, 0.0)):
                if down:
                    proxy.down(down)
                phase = time.monotonic()
                while time.monotonic() - phase < seconds:
                    assert job.poll() is None, log.read_text()[-3000:]
                    time.sleep(1.0)
            stop.set()
            thread.join()
            wait_until("every table equal to its source",
                       lambda: all(_equal(store, moto_endpoint, bucket, t) for t in TABLES),
                       timeout=240, interval=2.0, process=job)
            assert job.poll() is None, log.read_text()[-3000:]
        finally:
            stop.set()
            kill_tree(job.pid)
        counts, on_state = proxy.counts(), proxy.counts(under=f"/{bucket}/state/")
        print(f"S3 fault proxy: {proxy.requests} requests, {proxy.commits} commit PUTs, "
              f"{proxy.checkpoints} checkpoint file PUTs, faults {counts}, of them on the "
              f"job's state {on_state}; first batches after {first_batches:.0f} s, "
              f"{time.monotonic() - began:.0f} s in all", file=sys.stderr)
    text = log.read_text()
    retried = text.count("the object store failed a request")
    restarts = sum(line.startswith("restarting (") for line in text.splitlines())
    print(f"batches tried again in the sink: {retried}, job restarts: {restarts}",
          file=sys.stderr)
    assert "Traceback" not in text, text[-3000:]
    assert not any(f"table {t}: failed" in text for t in TABLES), text[-3000:]
    for table, (column, _) in TABLES.items():
        rows = _rows(moto_endpoint, bucket, table)
        assert rows is not None
        keys = [r[column] for r in rows]
        assert len(keys) == len(set(keys)), f"{table}: a key twice"
        assert _equal(store, moto_endpoint, bucket, table), table
        # every batch's data committed once: an ambiguous commit was never made again
        batches = [c["tablestore-cdc.batch-id"] for c in _table(moto_endpoint, bucket,
                                                                  table).history()
                   if "tablestore-cdc.batch-id" in c]
        assert len(batches) == len(set(batches)), f"{table}: a batch committed twice"
    assert all(counts[kind] for kind in (*KINDS, AMBIGUOUS_COMMIT)), counts
    if state_in_s3:
        assert all(on_state[kind] for kind in (*KINDS, AMBIGUOUS_CHECKPOINT)), on_state
    return restarts
