"""``replicate --tables`` into ``delta+s3://`` on a moto S3 server on 127.0.0.1, its own state
(``--output s3://``) there too: a real Spark run of two tables (an INTEGER and a STRING key)
SIGKILLed mid-stream with its whole process tree, then restarted with ``--once`` from another
working directory; each table read back from S3 equals its source, nothing was written to a
local path but Spark's log, and the secret key is in neither the job's output nor that log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

pytest.importorskip("deltalake")

from tablestore_cdc.verify import rows_by_key, table_state  # noqa: E402
from testkit.aws import new_s3_bucket  # noqa: E402
from testkit.lakehouse import TWO_KEYS, two_keys_store, write_two_keys  # noqa: E402
from testkit.processes import REPO, kill_tree  # noqa: E402

CLI = [sys.executable, "-m", "tablestore_cdc"]
TABLES = TWO_KEYS


def _s3_rows(bucket: str, table: str) -> list[dict[str, Any]] | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(f"s3://{bucket}/lake/{table}", storage_options={
            "AWS_ALLOW_HTTP": "true"}).to_pyarrow_table().to_pylist()
    except TableNotFoundError:
        return None


@pytest.mark.slow
def test_replicate_tables_into_s3_survives_a_sigkill_and_each_table_equals_its_source(
        tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = new_s3_bucket(moto_endpoint, monkeypatch)  # this process reads the tables too
    store = two_keys_store(tmp_path / "store.db")
    write_two_keys(store, 0, 150)
    here, there = tmp_path / "here", tmp_path / "there"  # the two runs' working directories
    here.mkdir()
    there.mkdir()
    command = [*CLI, "replicate", "--store", str(store.path), "--tables", "ints,names",
               "--output", f"s3://{bucket}/state", "--target",
               f"delta+s3://{bucket}/lake/{{table}}", "--target-option", "aws_region=us-east-1"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "AWS_ENDPOINT_URL": moto_endpoint,
           "PYTHONPATH": str(REPO)}
    log = tmp_path / "first.log"
    with open(log, "wb") as sink:
        first = subprocess.Popen(command, cwd=here, env=env, stdout=sink,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not all(_s3_rows(bucket, t) for t in TABLES):  # both tables have a batch
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        write_two_keys(store, 150, 60)  # more changes while it runs, then the kill
        time.sleep(2)
    finally:
        kill_tree(first.pid)
    write_two_keys(store, 210, 40)
    again = subprocess.run([*command, "--once"], cwd=there, env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    assert list(here.iterdir()) == [] and list(there.iterdir()) == []
    spark_log = Path(again.stderr.split("Spark's log: ", 1)[1].split()[0])
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    for text in (log.read_text(), again.stderr, again.stdout, spark_log.read_text()):
        assert secret not in text
    state = {o["Key"].split("/")[1] for o in boto3.client("s3").list_objects_v2(
        Bucket=bucket, Prefix="state/")["Contents"]}
    assert {"changelog", "_checkpoints"} <= state, state
    for table, (column, _) in TABLES.items():
        rows = _s3_rows(bucket, table)
        assert rows is not None
        assert table_state(rows, [column]) == {
            k: dict(v) for k, v in rows_by_key(store.scan(table)).items()}, table
