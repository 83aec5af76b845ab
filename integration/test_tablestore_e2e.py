"""End to end over the wire: the official SDK writes into the emulator, Spark reads its Tunnel.

Every process is real: the emulator (``tablestore-cdc emulator``) serves one store file over
HTTP on 127.0.0.1; the official ``tablestore`` SDK writes puts, updates and deletes through it;
the table's channels split and merge on the same file meanwhile (as the service's partitions
do); the query (testkit/runner.py, a Spark driver in its own process) reads with
``format("tablestore")`` and the vendor connector's option names, over HTTP only, into an
``ExactlyOnceParquetSink``; its meta table is a table in the same emulated instance.

- ``test_sigkill_and_restart_over_the_wire``: SIGKILL the query's process tree mid-run, write
  more (with a split), restart: nothing lost, nothing doubled, per-key order and state exact.
- ``test_emulator_outage_is_survived``: SIGKILL the *emulator* mid-run and restart it on the
  same port a few seconds later: the running query retries, resumes, and the result is exact.
- ``test_no_secret_in_any_artefact``: after a run, the access key secret and the STS token
  appear in no log, no file of the Spark checkpoint directory, no meta-table export and no
  progress-feed line.
- ``test_https_end_to_end``: the same run entirely over https -- the emulator serving TLS
  with a certificate from a throwaway CA (``trustme``), the SDK writes, the Tunnel reads and
  the meta table all verifying it through ``ssl.ca.bundle`` -- with a split while it runs;
  exact, and no secret in any artefact.

Verification (``tablestore_cdc.verify``) compares the sink with the store file's own change log,
its sequences translated to what the wire carries (``%08x:%016x:%08x`` of epoch 0, the commit
time and the store's per-channel sequence).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("tablestore")


from connector.local import LocalTablestore  # noqa: E402
from tablestore_cdc.sinks import ExactlyOnceParquetSink  # noqa: E402
from testkit.emulator import CLI  # noqa: E402
from testkit.processes import REPO, kill_tree, start_runner  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402
from testkit.wire_e2e import (  # noqa: E402
    INSTANCE,
    META_ENV,
    NO_ENV_CREDENTIALS,
    SECRET,
    STS,
    Emulator,
    create_source_table,
    delivered,
    finish_and_verify,
    meta_uri,
    runner_args,
    sdk_client,
    write_changes,
)

pytestmark = pytest.mark.slow


def test_sigkill_and_restart_over_the_wire(tmp_path: Path, wire_setup: tuple) -> None:
    emulator, store, client = wire_setup
    write_changes(client, 0, 150)
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    args, log = runner_args(tmp_path, emulator.url, sink), tmp_path / "runner.log"
    runner = start_runner(args, log, NO_ENV_CREDENTIALS)
    try:
        wait_until("40 changes delivered", lambda: delivered(sink), lambda n: n >= 40,
                   timeout=240, process=runner)
        first = store.list_channels("t")[0].channel_id
        store.split_channel("t", first)  # while the query runs
        write_changes(client, 150, 100)
        wait_until("120 changes delivered", lambda: delivered(sink), lambda n: n >= 120,
                   timeout=240, process=runner)
    finally:
        assert kill_tree(runner.pid) >= 2
    # more changes while the query is down, and a merge of the split's children
    open_ids = [c.channel_id for c in store.list_channels("t") if not c.closed]
    children = [c.channel_id for c in store.list_channels("t") if c.parent_ids == (first,)]
    assert set(children) <= set(open_ids)
    store.merge_channels("t", *children)
    write_changes(client, 250, 120)
    runner = start_runner(args, log, NO_ENV_CREDENTIALS)
    write_changes(client, 370, 80)
    finish_and_verify(tmp_path, store, sink, runner, log)
    assert any(c.parent_ids for c in store.list_channels("t"))


@pytest.mark.extended  # an outage: test_multi_table_outage (every table back after it)
def test_emulator_outage_is_survived(tmp_path: Path, wire_setup: tuple) -> None:
    emulator, store, client = wire_setup
    write_changes(client, 0, 120)
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    args, log = runner_args(tmp_path, emulator.url, sink), tmp_path / "runner.log"
    runner = start_runner(args, log, META_ENV)
    try:
        wait_until("40 changes delivered", lambda: delivered(sink), lambda n: n >= 40,
                   timeout=240, process=runner)
        write_changes(client, 120, 80)
        emulator.kill()  # the service goes away mid-run
        store.split_channel("t", store.list_channels("t")[0].channel_id)
        # a short outage: the tunnel transport rides out RETRY_DEADLINE_S (15 s); the
        # Tablestore meta store's own budget (about 5 s, meta_store/tablestore.py) is the bound;
        # let time pass: the outage lasts this long whatever the query does meanwhile
        time.sleep(2)
        assert runner.poll() is None, "the query must ride out a short outage"
        emulator.start()  # same port, same store file
        client = sdk_client(emulator.url)
        write_changes(client, 200, 100)
    except BaseException:
        kill_tree(runner.pid)
        raise
    # the same runner process delivers everything: it never exited (wait_until checks)
    finish_and_verify(tmp_path, store, sink, runner, log)


def test_no_secret_in_any_artefact(tmp_path: Path, wire_setup: tuple) -> None:
    emulator, store, client = wire_setup
    write_changes(client, 0, 60)
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    args, log = runner_args(tmp_path, emulator.url, sink), tmp_path / "runner.log"
    runner = start_runner(args, log, {**META_ENV, "TABLESTORE_CDC_LOG_LEVEL": "DEBUG"})
    finish_and_verify(tmp_path, store, sink, runner, log)
    assert_no_secret_in_artefacts(tmp_path, meta_uri(emulator), log, sink)


def assert_no_secret_in_artefacts(tmp_path: Path, meta: str, log: Path,
                                  sink: ExactlyOnceParquetSink) -> None:
    """Search the runner's log, every file of the checkpoint directory and of the sink, a
    ``meta export`` and the ``progress`` feed for the access key secret and the STS token."""
    env = {**os.environ, **META_ENV}
    exported = subprocess.run([CLI, "meta", "export", "--meta", meta, "--json"], env=env,
                              capture_output=True, text=True, cwd=REPO, timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert '"batches"' in exported.stdout and f"instance={INSTANCE}" in exported.stdout
    feed = subprocess.run([CLI, "progress", "--meta", meta, "--no-tunnel"], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert feed.returncode == 0, feed.stderr
    assert feed.stdout.strip(), "the feed should have batch records"

    artefacts: dict[str, bytes] = {
        "runner log": log.read_bytes(),
        "meta export": exported.stdout.encode(),
        "progress feed": feed.stdout.encode(),
        "cli stderr": (exported.stderr + feed.stderr).encode(),
    }
    for path in (tmp_path / "ckpt").rglob("*"):
        if path.is_file():
            artefacts[f"checkpoint {path.relative_to(tmp_path)}"] = path.read_bytes()
    for path in sink.path.rglob("*"):
        if path.is_file():
            artefacts[f"sink {path.relative_to(tmp_path)}"] = path.read_bytes()
    assert len(artefacts) > 10
    # the stored offsets name the source (the instance) and its meta store's URI -- with the
    # secrets stripped
    offsets = b"".join(data for name, data in artefacts.items() if name.startswith("checkpoint"))
    assert f"tablestore:{INSTANCE}#".encode() in offsets  # "source": the identity
    assert f"tablestore://{INSTANCE}/".encode() in offsets  # "metaStore"
    for secret in (SECRET, STS):
        leaks = [name for name, data in artefacts.items() if secret.encode() in data]
        assert not leaks, f"{secret!r} found in {leaks}"


def test_https_end_to_end(tmp_path: Path) -> None:
    """Everything over https with a private CA: the emulator's certificate is signed by a
    throwaway CA that no trust store holds; the query gets it as ``ssl.ca.bundle`` (and
    nothing in its environment), so every driver and executor client -- Tunnel reads,
    checkpoint pushes, the meta table through the official SDK -- verifies with it."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    ca_path, pem = tmp_path / "ca.pem", tmp_path / "server.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    emulator = Emulator(tmp_path / "store.db", tmp_path / "emulator.log", tls_pem=pem).start()
    store = LocalTablestore(tmp_path / "store.db")
    try:
        assert emulator.url.startswith("https://")
        client = sdk_client(emulator.url, ca_path)
        create_source_table(client)
        write_changes(client, 0, 120)
        sink = ExactlyOnceParquetSink(tmp_path / "sink")
        args = runner_args(tmp_path, emulator.url, sink, ca=ca_path)
        log = tmp_path / "runner.log"
        env = {**NO_ENV_CREDENTIALS, "REQUESTS_CA_BUNDLE": "", "SSL_CERT_FILE": "",
               "TABLESTORE_CDC_LOG_LEVEL": "DEBUG"}
        runner = start_runner(args, log, env)
        try:
            wait_until("40 changes delivered", lambda: delivered(sink), lambda n: n >= 40,
                       timeout=240, process=runner)
            store.split_channel("t", store.list_channels("t")[0].channel_id)
            write_changes(client, 120, 100)
        except BaseException:
            kill_tree(runner.pid)
            raise
        finish_and_verify(tmp_path, store, sink, runner, log)
        assert_no_secret_in_artefacts(tmp_path, meta_uri(emulator, ca_path), log, sink)
    finally:
        emulator.kill()
        store.close()


@pytest.mark.extended  # a cluster over the wire: test_netfaults_spark's cluster test
def test_local_cluster_over_http_only(tmp_path: Path, wire_setup: tuple) -> None:
    """``local-cluster[2,1,1024]``: separate executor JVMs and their Python workers reach the
    tunnel and the meta table over HTTP only; the filesystem carries nothing but Spark's
    checkpoint directory (and the test's own sink)."""
    emulator, store, client = wire_setup
    write_changes(client, 0, 120)
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    args = runner_args(tmp_path, emulator.url, sink) + ["--master", "local-cluster[2,1,1024]"]
    log = tmp_path / "runner.log"
    runner = start_runner(args, log, META_ENV)
    try:
        wait_until("40 changes delivered", lambda: delivered(sink), lambda n: n >= 40,
                   timeout=300, process=runner)
        store.split_channel("t", store.list_channels("t")[0].channel_id)
        write_changes(client, 120, 120)
    except BaseException:
        kill_tree(runner.pid)
        raise
    finish_and_verify(tmp_path, store, sink, runner, log)
    # the reads ran in more than one executor process (each end checkpoint names its reader)
    exported = subprocess.run([CLI, "meta", "export", "--meta", meta_uri(emulator), "--json"],
                              env={**os.environ, **META_ENV}, capture_output=True, text=True,
                              cwd=REPO, timeout=120)
    assert exported.returncode == 0, exported.stderr
    readers = set(re.findall(r'"attempt": "[^/"]+/(\d+)', exported.stdout))
    assert len(readers) >= 2, readers


@pytest.mark.extended  # the wire end to end: the kill and TLS tests here
def test_demo_over_the_wire(tmp_path: Path) -> None:
    """``tablestore-cdc demo --backend emulator``: the demo pipeline with SDK writes, Tunnel
    reads and the meta table all through the emulator, verified by the demo itself."""
    done = subprocess.run([CLI, "demo", "--backend", "emulator", "--workdir",
                           str(tmp_path / "demo"), "--changes", "400", "--duration", "5"],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "400 changes written" in done.stdout, done.stdout
    assert "0 lost, 0 duplicated; current state matches" in done.stdout, done.stdout
