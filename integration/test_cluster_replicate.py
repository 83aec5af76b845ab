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
interpreter and its PySpark's Spark (skipped without that venv). Both are ``faults_full``
(``make cluster-long``), not the default suite.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tablestore")
pytest.importorskip("deltalake")

from integration.faults.multi_table import (  # noqa: E402
    Replication,
    TableWriter,
    check_exactly_once,
    create_with_rows,
    drain,
    spark_engine_python,
)
from integration.netfaults import netns  # noqa: E402
from integration.netfaults.cluster import STARTUP_TIMEOUT_S, Cluster  # noqa: E402
from integration.netfaults.harness import META_TABLE  # noqa: E402
from tablestore_emulator.tunnel_api import wire_change_log  # noqa: E402
from testkit.crash_points import environment as crash_environment  # noqa: E402
from testkit.crash_points import spark_conf as crash_spark_conf  # noqa: E402
from testkit.emulator import SOURCE_OPTIONS  # noqa: E402
from testkit.processes import REPO, arm_crash_point  # noqa: E402
from testkit.wire_e2e import META_ENV  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.faults_full]

TABLES = ("t1", "t2")


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


@pytest.mark.parametrize("engine", ["embedded", "spark"])
def test_replicate_on_a_cluster_a_worker_killed_mid_stream(tmp_path: Path, engine: str) -> None:
    reason = netns.unavailable()  # probed here, not at collection: it makes a namespace
    if reason:
        pytest.skip(f"the cluster across network namespaces {reason}")
    python = spark_engine_python() if engine == "spark" else sys.executable
    if subprocess.run([python, "-c", "import tablestore"], capture_output=True).returncode:
        pytest.skip(f"{python} has no Tablestore SDK for the emulator's endpoint: pip install "
                    "it the extra tablestore-cdc[tablestore]")
    began = time.monotonic()
    # the checks' view of the run (paths, targets, committed change log); started below on
    # the driver host instead of by Replication.start
    app = Replication(tmp_path, selection=("--tables", ",".join(TABLES)), engine=engine)
    for table in TABLES:
        create_with_rows(app.store_path, table)
    cluster = Cluster(tmp_path, app.store_path, python)
    conf = {**cluster.driver_conf(), **crash_spark_conf(app.faults),
            "spark.pyspark.python": str(hooked_python(tmp_path, python))}
    with open(app.spark_conf / "spark-defaults.conf", "a") as defaults:
        defaults.writelines(f"{key} {value}\n" for key, value in conf.items())
    writers = {t: TableWriter(app.store_path, t, reshape=t == "t1") for t in TABLES}
    options = {**SOURCE_OPTIONS, "checkpoint.table": META_TABLE,
               "tables.refreshIntervalMs": "1000"}
    command = [python, "-c", "from tablestore_cdc.commands.app import app; app()",
               "replicate", "--endpoint", cluster.endpoint, *app.selection,
               "--output", str(app.out), "--config", str(app.config), "--master",
               cluster.master_url, "--trigger-ms", "300", "--initial", "none",
               "--engine", engine,
               *[arg for k, v in options.items() for arg in ("--option", f"{k}={v}")]]
    try:
        cluster.start()
        for writer in writers.values():
            writer.start()
        app.process = job = cluster.hosts.popen(
            "driver", command, log=app.log, cwd=REPO,
            env={**META_ENV, "PYSPARK_PYTHON": conf["spark.pyspark.python"],
                 "SPARK_CONF_DIR": str(app.spark_conf),
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
    finally:
        for writer in writers.values():
            writer.stopping.set()
        app.process = None
        cluster.down()
    check_exactly_once(app, sources)
    spark_log = (app.out / "logs" / "spark.log").read_text(errors="replace")
    assert f"worker lost: {cluster.hosts.addr(worker)}" in spark_log  # the driver noticed
    print(f"{engine}: worker {worker} killed mid-read; first applies {started:.0f} s, its batch "
          f"committed {recovered:.1f} s after the kill, {time.monotonic() - began:.0f} s in all")
