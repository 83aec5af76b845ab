"""The wire end to end as the integration tests run it (integration/test_tablestore_e2e.py and
its neighbours): an emulator child process serving a store file, the official SDK writing
through it, the query (``testkit.runner``) reading with the vendor connector's option names, and
the verification of its sink against the store's change log."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from tablestore import (
    CapacityUnit,
    Condition,
    OTSClient,
    ReservedThroughput,
    Row,
    RowExistenceExpectation,
    TableMeta,
    TableOptions,
)
from tablestore.retry import WriteRetryPolicy

from connector.local import LocalTablestore
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from tablestore_cdc.verify import read_delta, rows_by_key, table_state, verify
from tablestore_emulator.tunnel_api import wire_change_log
from testkit.emulator import INSTANCE, KEY_ID, SECRET, SOURCE_OPTIONS, EmulatorProcess
from testkit.processes import kill_tree
from testkit.waiting import wait_until

STS = "e2e-StsToken-K3jR8w"
IGNORE = Condition(RowExistenceExpectation.IGNORE)
CATALOG = '{"columns": {"id": {"type": "long"}, "name": {"type": "string"}, ' \
          '"qty": {"type": "long"}}}'


class Emulator(EmulatorProcess):
    """The scenario's emulator: ``tablestore-cdc emulator`` with this instance and key pair and
    two channels per table, as a child process; https when given a PEM file holding the
    certificate chain and its key."""

    def __init__(self, store: Path, log: Path, port: int = 0, tls_pem: Path | None = None
                 ) -> None:
        super().__init__(store, log, INSTANCE, KEY_ID, SECRET, port=port, tls_pem=tls_pem,
                         channels=2)


def sdk_client(url: str, ca: Path | None = None) -> OTSClient:
    client = OTSClient(url, KEY_ID, SECRET, INSTANCE, retry_policy=WriteRetryPolicy(),
                       logger_name="e2e-sdk")
    if ca is not None:  # the SDK takes no CA: the meta store's way of giving it one
        from meta_store.tablestore import _trust_ca

        _trust_ca(client, str(ca))
    return client


def write_changes(client: OTSClient, start: int, n: int, keys: int = 60) -> None:
    """Inserts, updates (one column set, one deleted) and deletes through the official SDK."""
    for i in range(start, start + n):
        pk = [("id", i % keys)]
        if i % 7 == 3:
            client.delete_row("t", Row(pk), IGNORE)
        elif i % 3 == 1:
            update = {"PUT": [("qty", i)]}
            if i % 2:
                update["DELETE_ALL"] = ["name"]  # type: ignore[list-item]
            client.update_row("t", Row(pk, update), IGNORE)
        else:
            client.put_row("t", Row(pk, [("name", f"n{i}"), ("qty", i)]), IGNORE)


def create_source_table(client: OTSClient) -> None:
    client.create_table(TableMeta("t", [("id", "INTEGER")]), TableOptions(),
                        ReservedThroughput(CapacityUnit(0, 0)))


#: what a scenario's ``setup`` fixture yields
WireSetup = tuple[Emulator, LocalTablestore, OTSClient]


@contextmanager
def wire_scenario(tmp_path: Path) -> Iterator[WireSetup]:
    """The emulator serving ``tmp_path/store.db`` with table ``t`` created through the SDK, the
    store file opened beside it (channel splits and merges, verification) and the SDK client;
    the emulator is killed and the store closed at the end. The shared ``wire_setup`` fixture
    (``testkit.fixtures``) yields it."""
    store_path = tmp_path / "store.db"
    emulator = Emulator(store_path, tmp_path / "emulator.log").start()
    client = sdk_client(emulator.url)
    create_source_table(client)
    store = LocalTablestore(store_path)  # the same file: channel splits/merges, verification
    try:
        yield emulator, store, client
    finally:
        emulator.kill()
        store.close()


def runner_args(tmp_path: Path, url: str, sink: ExactlyOnceParquetSink,
                ca: Path | None = None) -> list[str]:
    """The query, with the vendor connector's option names (and the CA of an https one)."""
    options = {**SOURCE_OPTIONS, "security.token": STS, "catalog": CATALOG,
               "maxOffsetsPerChannel": "40", "checkpoint.table": "cdc_meta"}
    if ca is not None:
        options["ssl.ca.bundle"] = str(ca)
    args = ["--endpoint", url, "--table", "t", "--tunnel", "e2e",
            "--checkpoint", str(tmp_path / "ckpt"), "--sink", str(sink.path),
            "--stop-file", str(tmp_path / "stop"), "--trigger-ms", "300"]
    for k, v in options.items():
        args += ["--option", f"{k}={v}"]
    return args


#: the CLI commands (meta export, progress) take the meta table's credentials from the
#: environment; the query itself needs none there: its options carry them to every executor
META_ENV = {"ALIBABA_CLOUD_ACCESS_KEY_ID": KEY_ID, "ALIBABA_CLOUD_ACCESS_KEY_SECRET": SECRET}
NO_ENV_CREDENTIALS = {name: "" for name in META_ENV}


def replicate_process(url: str, source: list[str], output: Path, log: Path, *flags: str,
                      env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``tablestore-cdc replicate`` as its own process (a new session: ``kill_tree`` ends it
    and its Spark) against the emulator at ``url``: ``source`` the table flags (``--table t``
    or ``--tables t,u``), the emulator's credentials as ``--option``s, then ``flags``; its
    meta table's credentials and ``env`` in its environment, its console into ``log``."""
    command = [sys.executable, "-m", "tablestore_cdc", "replicate", "--endpoint", url,
               *source, "--output", str(output),
               *[arg for k, v in SOURCE_OPTIONS.items() for arg in ("--option", f"{k}={v}")],
               *flags]
    environment = {**os.environ, **META_ENV, "PYSPARK_PYTHON": sys.executable, **(env or {})}
    with open(log, "w") as sink:
        return subprocess.Popen(command, env=environment, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


def delta_equals_source(store: LocalTablestore, table: str, target: Path) -> bool:
    """Is the Delta table at ``target`` (``replicate``'s apply) equal to the store's
    ``table``, row by row (null columns and ``_extra`` aside)? False before its first commit."""
    if not (target / "_delta_log").exists():
        return False
    expected = {k: {c: v for c, v in row.items() if v is not None}
                for k, row in rows_by_key(store.scan(table)).items()}
    got = {k: {c: v for c, v in row.items() if v is not None and c != "_extra"}
           for k, row in table_state(read_delta(str(target)), ["id"]).items()}
    return got == expected


def meta_uri(emulator: Emulator, ca: Path | None = None) -> str:
    """The meta table the query's options name (``checkpoint.table=cdc_meta``)."""
    uri = f"tablestore://{INSTANCE}/cdc_meta?endpoint={quote(emulator.url, safe='')}"
    return uri + (f"&ca_bundle={quote(str(ca), safe='')}" if ca else "")


def delivered(sink: ExactlyOnceParquetSink) -> int:
    return sum(1 for _ in sink.deliveries(["id"]))


def assert_exactly_once(store: LocalTablestore, sink: ExactlyOnceParquetSink) -> None:
    """The sink holds table ``t``'s change log once, each key in order, and its state."""
    result = verify(wire_change_log(store.change_log("t")), sink.deliveries(["id"]),
                    rows_by_key(store.scan("t")))
    print(result.summary(), file=sys.stderr)
    assert result.ok, f"{result.summary()} {result.examples}"


def finish_and_verify(tmp_path: Path, store: LocalTablestore, sink: ExactlyOnceParquetSink,
                      runner: subprocess.Popen, log: Path) -> None:
    """Wait until the query delivered every change, stop it by its stop file, then
    ``assert_exactly_once``."""
    expected = len(store.change_log("t"))
    try:
        wait_until(f"{expected} changes delivered", lambda: delivered(sink),
                   lambda n: n >= expected, timeout=300, process=runner)
        (tmp_path / "stop").touch()
        assert runner.wait(120) == 0, log.read_text()[-3000:]
    finally:
        kill_tree(runner.pid)
    assert_exactly_once(store, sink)
