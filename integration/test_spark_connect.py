"""format("tablestore") from a Spark Connect thin client, with a restart: exactly once.

A Connect server starts from the installed PySpark on 127.0.0.1 (integration/connect_env.py);
the query runs there, with this environment's Python. The client runs in its own virtual
environment (protobuf >= 6, no ``tablestore`` SDK, no boto3: the two cannot share one
environment, docs/connect.md) as ``python -m integration.connect_client``: it connects to
``sc://``, calls ``connector.register(spark)``, attaches ``ProgressListener``, runs the query into
a Parquet file sink until everything available is processed, and stops it. Between two client
runs on the same checkpoint the test writes more changes and splits a channel. What the file
sink committed (the files its ``_spark_metadata`` log lists, by batch) is then checked against
the store's change log: nothing lost, nothing duplicated, per-key order, final state.

The first run creates the client environment (cached under ~/.cache/tablestore-cdc/).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from connector.local import LocalTablestore
from integration.connect_env import REPO, ClientUnavailable, client_python, connect_server
from meta_store import open_meta_store
from tablestore_cdc.feed.reading import user_namespaces
from tablestore_cdc.query_record import load_spark_metrics
from tablestore_cdc.sinks import deliveries_from_rows
from tablestore_cdc.verify import Delivered, rows_by_key, verify
from testkit.file_sink_log import committed_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client() -> tuple[Path, str]:
    started = time.monotonic()
    try:
        python, requirement = client_python()
    except ClientUnavailable as exc:
        pytest.skip(f"no Spark Connect client could be installed from the package registry: "
                    f"{exc}")
    print(f"Connect client {requirement} ready in {time.monotonic() - started:.0f}s: {python}")
    return python, requirement


@pytest.fixture(scope="module")
def remote(client, tmp_path_factory):
    # one entry per batch in the file sink's log (no compaction), read back by sink_deliveries
    conf = {"spark.sql.streaming.fileSink.log.compactInterval": "1000"}
    started = time.monotonic()
    with connect_server(tmp_path_factory.mktemp("connect-server"), conf) as url:
        print(f"Connect server up in {time.monotonic() - started:.0f}s at {url}")
        yield url


def write_changes(store: LocalTablestore, n: int, keys: int = 50, start: int = 0) -> None:
    """Deterministic inserts, updates and deletes over ``keys`` keys."""
    for i in range(start, start + n):
        key = {"id": i % keys}
        if i % 5 == 3:
            store.delete_row("t", key)
        elif i % 5 in (1, 4):
            store.update_row("t", key, {"qty": i})
        else:
            store.put_row("t", key, {"name": f"n{i}", "qty": i})


def run_client(python: Path, remote: str, store: LocalTablestore, work: Path, run: str
               ) -> dict:
    """One client process: start the query, process all available, stop; its JSON report."""
    report = work / f"report-{run}.json"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPARK_", "PYSPARK_", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(REPO)  # `connector` from this checkout, no install needed
    args = [str(python), "-m", "integration.connect_client", "--remote", remote,
            "--endpoint", f"local://{store.path}", "--table", "t", "--tunnel", "q",
            "--out", str(work / "out"), "--checkpoint", str(work / "checkpoint"),
            "--meta", f"sqlite:///{meta_path(store)}", "--report", str(report),
            "--max-per-trigger", "150"]
    started = time.monotonic()
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    print(f"client run {run}: {time.monotonic() - started:.0f}s")
    assert result.returncode == 0, f"client run {run} failed:\n{result.stderr[-4000:]}"
    return json.loads(report.read_text())


def meta_path(store: LocalTablestore) -> Path:
    """The meta store a local endpoint uses by default: ``<store>.meta.db`` beside it."""
    return Path(store.path).with_suffix(".meta.db")


def sink_deliveries(out: Path) -> list[Delivered]:
    """What the file sink committed, in batch order: the files each ``_spark_metadata/<batch>``
    entry lists (files not listed there are leftovers of uncommitted attempts)."""
    deliveries: list[Delivered] = []
    # compaction is off (see the remote fixture)
    for batch, rows in committed_rows(out / "_spark_metadata"):
        deliveries.extend(deliveries_from_rows(rows, ["id"], (batch,)))
    return deliveries


@pytest.mark.extended  # Spark Connect: make test-extended (the default suite's time)
def test_register_and_restart_from_a_thin_client_exactly_once(client, remote, tmp_path):
    python, requirement = client
    store = LocalTablestore(tmp_path / "store.db")
    try:
        store.create_table("t", primary_key=[("id", "INTEGER")],
                           columns=[("name", "STRING"), ("qty", "INTEGER")], channels=3)
        write_changes(store, 400)
        first = run_client(python, remote, store, tmp_path, "1")

        write_changes(store, 200, start=400)
        store.split_channel("t", store.list_channels("t")[0].channel_id)
        write_changes(store, 200, start=600)
        second = run_client(python, remote, store, tmp_path, "2")

        # the client is a Connect session, with protobuf >= 6 and without the SDKs
        for report in (first, second):
            assert report["session_type"] == "pyspark.sql.connect.session.SparkSession"
            assert report["exception"] is None
            assert int(report["protobuf"].split(".")[0]) >= 6, report["protobuf"]
            assert report["server_only_modules_imported"] == []
            assert report["server_spark"] == __import__("pyspark").__version__
            assert report["latest_offset_reported"]  # the lag report reaches the client

        # the second run resumed from the checkpoint: its batch ids continue the first's
        first_ids = [b["batch_id"] for b in first["batches"]]
        second_ids = [b["batch_id"] for b in second["batches"]]
        assert first_ids and second_ids and min(second_ids) > max(first_ids)
        assert sum(b["rows"] for b in first["batches"]) == 400
        assert sum(b["rows"] for b in second["batches"]) == 400
        assert max(b["rows"] for b in first["batches"]) <= 150  # maxOffsetsPerTrigger applied

        result = verify(store.change_log("t"), sink_deliveries(tmp_path / "out"),
                        rows_by_key(store.scan("t")))
        assert result.ok, result.summary() + str(result.examples)
        assert result.delivered == result.expected == 800

        # ProgressListener ran in the client and joined the feed: one entry per batch with data
        for report in (first, second):
            listener = report["listener"]
            assert listener["errors"] == 0
            assert listener["recorded"] == listener["expected"] > 0
        meta = open_meta_store(f"sqlite:///{meta_path(store)}")
        try:
            [namespace] = user_namespaces(meta)
            progress = load_spark_metrics(meta, namespace)
            batch_uuids = {b.uuid for b in meta.list_batches(namespace)}
        finally:
            meta.close()
        assert len(progress) == first["listener"]["expected"] + second["listener"]["expected"]
        assert set(progress) <= batch_uuids
        print(f"client {requirement}: {len(first_ids)} + {len(second_ids)} batches, "
              f"{result.summary()}")
    finally:
        store.close()
