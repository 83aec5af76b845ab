"""A query's binding to its source on a real local Spark (connector/planning/binding.py).

Each query runs in its own process (testkit/runner.py) into an ``ExactlyOnceParquetSink``;
verification compares the sink with the store's own change log.

- ``test_a_restart_through_another_spelling_of_the_endpoint_resumes_exactly``: the query
  reads the emulator as ``http://127.0.0.1:PORT``, stops, and is restarted on the same
  checkpoint as ``http://localhost:PORT`` (the same service): it resumes, everything exactly
  once, and the meta table holds one namespace.
- ``test_a_second_query_on_a_live_tunnel_is_refused``: while one query runs, a second query
  on the same tunnel (another checkpoint directory: the same DataFrame written to a second
  sink) fails at its start naming ``tunnel.name``, writes nothing, and the first query's output
  stays exact.

A SIGKILLed query's restart is not held up by its own lease: integration/test_restart.py and
the SIGKILL tests of integration/test_tablestore_e2e.py restart on the same checkpoint at once,
in batch 0 and later.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tablestore")

from connector.local import LocalTablestore  # noqa: E402
from meta_store import open_meta_store  # noqa: E402
from tablestore_cdc.sinks import ExactlyOnceParquetSink  # noqa: E402
from tablestore_cdc.verify import rows_by_key, verify  # noqa: E402
from testkit.processes import kill_tree, start_runner  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402
from testkit.wire_e2e import (  # noqa: E402
    INSTANCE,
    KEY_ID,
    NO_ENV_CREDENTIALS,
    SECRET,
    Emulator,
    create_source_table,
    delivered,
    finish_and_verify,
    meta_uri,
    runner_args,
    sdk_client,
    write_changes,
)

#: the same checks run in the default suite in one process (tests/test_protocol_binding.py,
#: tests/test_source_lease_spark.py); these runs, each query its own application, are extended
pytestmark = [pytest.mark.slow, pytest.mark.extended]


def test_a_restart_through_another_spelling_of_the_endpoint_resumes_exactly(
        tmp_path: Path) -> None:
    store_path = tmp_path / "store.db"
    emulator = Emulator(store_path, tmp_path / "emulator.log").start()
    store = LocalTablestore(store_path)
    try:
        assert emulator.url.startswith("http://127.0.0.1:")
        client = sdk_client(emulator.url)
        create_source_table(client)
        write_changes(client, 0, 120)
        sink = ExactlyOnceParquetSink(tmp_path / "sink")
        log = tmp_path / "runner.log"
        runner = start_runner(runner_args(tmp_path, emulator.url, sink), log,
                              NO_ENV_CREDENTIALS)
        try:
            wait_until("first batches delivered", lambda: delivered(sink) >= 40, timeout=240,
                       process=runner)
            (tmp_path / "stop").touch()
            assert runner.wait(120) == 0, log.read_text()[-3000:]
        finally:
            kill_tree(runner.pid)
        (tmp_path / "stop").unlink()
        write_changes(client, 120, 100)  # while it is down, and a split
        store.split_channel("t", store.list_channels("t")[0].channel_id)
        localhost = emulator.url.replace("127.0.0.1", "localhost")
        runner = start_runner(runner_args(tmp_path, localhost, sink), log, NO_ENV_CREDENTIALS)
        write_changes(client, 220, 60)
        finish_and_verify(tmp_path, store, sink, runner, log)
        assert "CheckpointMismatchError" not in log.read_text()
        with open_meta_store(meta_uri(emulator),
                             {"access_key_id": KEY_ID, "access_key_secret": SECRET}) as meta:
            assert meta.list_namespaces() == [f"tablestore:{INSTANCE}#t#e2e"]
    finally:
        emulator.kill()
        store.close()


def test_a_second_query_on_a_live_tunnel_is_refused(tmp_path: Path) -> None:
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER")], channels=3)
    for i in range(300):
        store.put_row("t", {"id": i % 50}, {"name": f"n{i}", "qty": i})

    def query(name: str) -> tuple[list[str], ExactlyOnceParquetSink]:
        sink = ExactlyOnceParquetSink(tmp_path / f"sink-{name}")
        return ["--store", str(tmp_path / "store.db"), "--table", "t", "--tunnel", "q",
                "--checkpoint", str(tmp_path / f"ckpt-{name}"), "--sink", str(sink.path),
                "--stop-file", str(tmp_path / f"stop-{name}"), "--trigger-ms", "200",
                "--option", "maxOffsetsPerChannel=40"], sink

    first_args, first_sink = query("first")
    first_log = tmp_path / "first.log"
    first = start_runner(first_args, first_log)
    try:
        wait_until("the first query's first batches",
                   lambda: sum(1 for _ in first_sink.deliveries(["id"])) >= 40, timeout=240,
                   process=first)
        second_args, second_sink = query("second")
        second_log = tmp_path / "second.log"
        second = start_runner(second_args, second_log)
        try:
            assert second.wait(240) == 1, second_log.read_text()[-3000:]
        finally:
            kill_tree(second.pid)
        refusal = second_log.read_text()
        assert "SourceInUseError" in refusal and "option 'tunnel.name'" in refusal
        assert "foreachBatch" in refusal
        assert not list(second_sink.path.rglob("*.parquet"))  # it wrote nothing
        for i in range(300, 450):  # the first query goes on
            store.put_row("t", {"id": i % 50}, {"name": f"n{i}", "qty": i})
        store.split_channel("t", store.list_channels("t")[0].channel_id)
        expected = len(store.change_log("t"))
        wait_until(f"{expected} changes delivered by the first query",
                   lambda: sum(1 for _ in first_sink.deliveries(["id"])) >= expected,
                   timeout=240, process=first)
        (tmp_path / "stop-first").touch()
        assert first.wait(120) == 0, first_log.read_text()[-3000:]
    finally:
        kill_tree(first.pid)
    result = verify(store.change_log("t"), first_sink.deliveries(["id"]),
                    rows_by_key(store.scan("t")))
    print(result.summary(), file=sys.stderr)
    assert result.ok, f"{result.summary()} {result.examples}"
    store.close()
