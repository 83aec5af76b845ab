"""``tablestore-cdc replicate`` on a Spark standalone cluster, a worker SIGKILLed mid-stream.

The cluster is ``integration.netfaults.cluster.Cluster``'s (network namespaces, root only: a
master, two 1-core workers, the emulator on the svc host serving the store file and the meta
table); the application runs on the driver host: ``replicate --tables t1,t2 --master
spark://127.42.0.20:7077 --endpoint http://127.42.0.10:8090`` with the emulator's credentials
as reader options and its meta table (``checkpoint.table``), Delta targets under ``--output``.
The hosts share the file system: the output directory (the change log the executors write,
the checkpoints, the targets) is one path every host sees, as a shared mount would be.

Two tables of 2 channels (t1's first channel splits, a child splits again and the two
grandchildren merge) change every second (``integration.faults.multi_table``'s writers, in
this process). Once both targets hold a batch, a task is parked mid-read (crash point
``mid_read``, after claiming its channel's end) and its worker is SIGKILLed with its executor
and Python workers, then started again; the writers stop, the job catches up, stops on
SIGTERM (exit 0), and ``check_exactly_once`` holds: each target (read with ``deltalake``)
equals its source row by row, the committed change log holds every change once, in order per
key, and no target holds a batch twice.

``embedded``: the default apply on the driver. ``spark``: ``--engine spark`` (delta-spark's
MERGE on the executors), the cluster and the application on ``.venv-spark-merge``'s
interpreter and its PySpark's Spark (skipped without that venv). ``local``: the output and
targets on the shared path. ``s3``: the same run with ``--output s3://BUCKET/state`` and
``--target 'delta+s3://BUCKET/lake/{table}'`` on a moto S3 server on the svc host
(``Cluster(s3=True)``): the executors write the change log's files and Spark's checkpoints
through S3A, the driver the targets through delta-rs; the workers run with the AWS
environment (endpoint, fake credentials, region), as a user's cluster nodes would. The checks
read the targets from S3 with ``deltalake`` and the committed change log downloaded from it
(``S3State``), and nothing is written under the local output path. ``s3`` is embedded only:
the Spark engine writes local Delta targets only (``spark_merge.open_spark_merge_sink``
refuses ``delta+s3://``). All are ``faults_full`` (``make cluster-long``), not the default
suite, whose short version of the S3 run is ``tests/test_lakehouse_object_store_spark.py``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tablestore")
pytest.importorskip("deltalake")

from integration.faults.multi_table import (  # noqa: E402
    Replication,
    TableWriter,
    Targets,
    check_exactly_once,
    create_with_rows,
    drain,
    spark_engine_python,
)
from integration.netfaults import netns  # noqa: E402
from integration.netfaults.cluster import STARTUP_TIMEOUT_S, Cluster  # noqa: E402
from integration.netfaults.harness import META_TABLE  # noqa: E402
from tablestore_emulator.tunnel_api import wire_change_log  # noqa: E402
from testkit.aws import AWS_TEST_ENV, new_s3_bucket  # noqa: E402
from testkit.crash_points import environment as crash_environment  # noqa: E402
from testkit.crash_points import spark_conf as crash_spark_conf  # noqa: E402
from testkit.emulator import SOURCE_OPTIONS  # noqa: E402
from testkit.processes import REPO, arm_crash_point  # noqa: E402
from testkit.wire_e2e import META_ENV  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.faults_full]

TABLES = ("t1", "t2")


@dataclass(frozen=True)
class S3Targets(Targets):
    """The Delta targets under ``root`` (``s3://BUCKET/lake``), read with ``deltalake`` through
    the test's environment (the S3 server's endpoint as this process reaches it)."""

    root: str = ""

    def _read(self, table: str, delta: Any, iceberg: Any) -> Any:
        from deltalake.exceptions import TableNotFoundError

        try:
            return delta(f"{self.root}/{table}")
        except TableNotFoundError:  # before its first commit
            return None


class S3State(Replication):
    """``Replication``'s checks of a job whose ``--output`` is ``s3://BUCKET/state`` and whose
    targets are ``S3Targets``: its checkpoints listed in the bucket (``fs``: pyarrow's
    ``S3FileSystem`` on the server), its committed change log downloaded to ``copy`` first."""

    def __init__(self, tmp: Path, bucket: str, fs: Any, **kwargs: Any) -> None:
        super().__init__(tmp, **kwargs)
        self.bucket, self.fs = bucket, fs
        self.output = f"s3://{bucket}/state"
        self.targets = S3Targets(self.lake, self.warehouse, engine=self.engine,
                                 root=f"s3://{bucket}/lake")
        self.copy = tmp / "state-downloaded"

    def _checkpoint_log(self, name: str, query: str = "apply") -> list[int]:
        from pyarrow.fs import FileSelector

        found = self.fs.get_file_info(FileSelector(
            f"{self.bucket}/state/_checkpoints/{query}/{name}", allow_not_found=True))
        return [int(info.base_name) for info in found if info.base_name.isdigit()]

    def change_log(self) -> dict[str, list[Any]]:
        """``Replication.change_log`` of a download of the change log, its log's entries
        naming the downloaded files."""
        from pyarrow.fs import LocalFileSystem, copy_files

        changelog = self.copy / "changelog"
        shutil.rmtree(self.copy, ignore_errors=True)
        copy_files(f"{self.bucket}/state/changelog", str(changelog),
                   source_filesystem=self.fs, destination_filesystem=LocalFileSystem())
        remote = f"s3a://{self.bucket}/state/changelog/"
        for entry in (changelog / "_spark_metadata").iterdir():
            lines = entry.read_text().splitlines()
            for i, line in enumerate(lines[1:], 1):
                record = json.loads(line)
                assert record["path"].startswith(remote), record["path"]
                record["path"] = f"file://{changelog}/{record['path'][len(remote):]}"
                lines[i] = json.dumps(record)
            entry.write_text("\n".join(lines) + "\n")
        out, self.out = self.out, self.copy
        try:
            return super().change_log()
        finally:
            self.out = out


def hooked_python(tmp: Path, python: str) -> Path:
    """``python`` with the crash points' hook on its path, for the executors' Python workers.
    ``connector.spark.local_session`` sets ``spark.executorEnv.PYTHONPATH`` to its worker site
    plus what the code passes, so a ``spark-defaults.conf`` value (``crash_spark_conf``'s) is
    replaced, and a standalone executor's environment is the worker's under the
    application's ``executorEnv``: the hook comes after the worker site (whose
    ``sitecustomize`` runs the one it shadows)."""
    hook = crash_environment(tmp / "faults", "")["PYTHONPATH"]
    path = tmp / "python-with-crash-points"
    path.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{hook}" '
                    f'exec {python} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("engine", "state"),
                         [("embedded", "local"), ("spark", "local"), ("embedded", "s3")])
def test_replicate_on_a_cluster_a_worker_killed_mid_stream(
        tmp_path: Path, engine: str, state: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    reason = netns.unavailable()  # probed here, not at collection: it makes a namespace
    if reason:
        pytest.skip(f"the cluster across network namespaces {reason}")
    python = spark_engine_python() if engine == "spark" else sys.executable
    if subprocess.run([python, "-c", "import tablestore"], capture_output=True).returncode:
        pytest.skip(f"{python} has no Tablestore SDK for the emulator's endpoint: pip install "
                    "it the extra tablestore-cdc[tablestore]")
    began = time.monotonic()
    selection = ("--tables", ",".join(TABLES))
    store_path = tmp_path / "store.db"  # Replication's
    for table in TABLES:
        create_with_rows(store_path, table)
    cluster = Cluster(tmp_path, store_path, python, s3=state == "s3")
    cluster.start()
    try:
        # the checks' view of the run (paths, targets, committed change log); started below
        # on the driver host instead of by Replication.start
        app, flags = _application(tmp_path, selection, engine, cluster, request, monkeypatch)
    except BaseException:
        cluster.down()
        raise
    conf = {**cluster.driver_conf(), **crash_spark_conf(app.faults),
            "spark.pyspark.python": str(hooked_python(tmp_path, python))}
    with open(app.spark_conf / "spark-defaults.conf", "a") as defaults:
        defaults.writelines(f"{key} {value}\n" for key, value in conf.items())
    writers = {t: TableWriter(app.store_path, t, reshape=t == "t1") for t in TABLES}
    options = {**SOURCE_OPTIONS, "checkpoint.table": META_TABLE,
               "tables.refreshIntervalMs": "1000"}
    command = [python, "-c", "from tablestore_cdc.commands.app import app; app()",
               "replicate", "--endpoint", cluster.endpoint, *app.selection, *flags,
               "--config", str(app.config), "--master",
               cluster.master_url, "--trigger-ms", "300", "--initial", "none",
               "--engine", engine,
               *[arg for k, v in options.items() for arg in ("--option", f"{k}={v}")]]
    try:
        for writer in writers.values():
            writer.start()
        app.process = job = cluster.hosts.popen(
            "driver", command, log=app.log, cwd=REPO,
            env={**META_ENV, "PYSPARK_PYTHON": conf["spark.pyspark.python"],
                 "SPARK_CONF_DIR": str(app.spark_conf), **cluster.s3_env,
                 **crash_environment(app.faults)})
        app.wait("a batch applied into every target",
                 lambda: [t for t in TABLES if not app.targets.batches(t)], lambda m: not m,
                 timeout=STARTUP_TIMEOUT_S)
        started = time.monotonic() - began
        arm_crash_point(app.faults, "mid_read", "park")
        worker = cluster.held_worker(app.faults, "mid_read", job)
        read = app.last_read_batch()  # the parked task's batch is not committed
        cluster.kill_worker(worker)  # the parked task's rerun on the other worker ends it
        killed = time.monotonic()
        cluster.start_worker(worker)  # back, as a cluster manager would bring it
        app.wait("the killed task's change-log batch committed", app.last_read_batch,
                 lambda newest: newest > read)
        recovered = time.monotonic() - killed
        # the change log as the job read it over the wire (the emulator's sequences)
        sources = {t: (rows, wire_change_log(changes))
                   for t, (rows, changes) in drain(app, writers, TABLES).items()}
        job.send_signal(signal.SIGTERM)
        assert job.wait(180) == 0, app.log.read_text()[-4000:]
        check_exactly_once(app, sources)  # before the hosts go: the S3 server is on svc
    finally:
        for writer in writers.values():
            writer.stopping.set()
        app.process = None
        cluster.down()
    log_path = app.out / "logs" / "spark.log"
    if state == "s3":  # the state is in the bucket; Spark's log stays on the driver's host
        assert not app.out.exists()
        log_path = Path(app.log.read_text().split("Spark's log: ", 1)[1].split()[0])
    spark_log = log_path.read_text(errors="replace")
    if state == "s3":
        shutil.rmtree(log_path.parent.parent)  # the job's directory under the system's tmp
        assert AWS_TEST_ENV["AWS_SECRET_ACCESS_KEY"] not in app.log.read_text() + spark_log
    assert f"worker lost: {cluster.hosts.addr(worker)}" in spark_log  # the driver noticed
    print(f"{engine} ({state} state): worker {worker} killed mid-read; first applies "
          f"{started:.0f} s, its batch committed {recovered:.1f} s after the kill, "
          f"{time.monotonic() - began:.0f} s in all")


def _application(tmp: Path, selection: tuple[str, ...], engine: str, cluster: Cluster,
                 request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[Replication, list[str]]:
    """The checks' view of the run and its ``--output`` / ``--target`` flags: the shared
    path's default targets, or (``cluster.s3``) a new bucket on the cluster's S3 server,
    this process's environment naming the server as it reaches it (``cluster.s3_local``)."""
    if not cluster.s3:
        app = Replication(tmp, selection=selection, engine=engine)
        return app, ["--output", str(app.out)]
    from pyarrow.fs import S3FileSystem

    request.getfixturevalue("aws_env")  # the fake credentials, no real AWS configuration
    monkeypatch.setenv("AWS_ENDPOINT_URL", cluster.s3_local)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")  # delta-rs: the server is http://
    bucket = new_s3_bucket(cluster.s3_local)
    fs = S3FileSystem(endpoint_override=cluster.s3_local, scheme="http", region="us-east-1")
    app = S3State(tmp, bucket, fs, selection=selection, engine=engine)
    return app, ["--output", app.output, "--target", f"delta+s3://{bucket}/lake/{{table}}"]
