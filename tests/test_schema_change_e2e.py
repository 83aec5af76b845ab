"""Schemaless attributes end to end: ``tablestore-cdc replicate`` over the emulator while the
official ``tablestore`` SDK changes an attribute's type twice and adds three attributes.

Everything is real: the emulator (``tablestore-cdc emulator``) serves a store file on
127.0.0.1, the SDK writes a primary-key-only table (every attribute undeclared), ``replicate``
runs as its own process and applies into Delta or Iceberg. The target is read back with
``deltalake`` / ``pyiceberg`` and compared with the table as the SDK reads it (GetRange), value
by value *with its type*: an INTEGER 7 and a DOUBLE 7.0 are different values here. The history
(SCD 2) is compared with the store's change log: a batch applied twice would double versions.

- the default policy (``lenient``) delivers every value: ``qty`` INTEGER -> DOUBLE -> STRING
  lands in its int64 column or typed in ``_extra``; ``colour``, ``size`` and ``flag`` become
  columns (Delta and Iceberg);
- ``exception`` stops the job with the typed error in one line (exit code 2), and the same
  command with ``lenient`` on the same checkpoint delivers the refused batch exactly once;
- SIGKILL between a batch's schema change and its data commit (crash point
  ``after_schema_change``: Delta has committed the new columns on their own; Iceberg has staged
  them in the batch's one catalog commit), then a restart: exact.

And the envelope's snapshot mark over the wire: with a BaseAndStream tunnel and
``snapshot.op=READ`` the rows the table held when the tunnel was created reach the change log
as READ, the later changes as PUT / UPDATE / DELETE, and the target equals the source.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

pytest.importorskip("tablestore")
pytest.importorskip("pyiceberg")

from tablestore import INF_MAX, INF_MIN, OTSClient, Row  # noqa: E402

from tablestore_cdc.commands.app import app as cli_app  # noqa: E402
from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties  # noqa: E402
from tablestore_cdc.verify import read_delta, table_state  # noqa: E402
from tablestore_emulator.tunnel_api import wire_change_log  # noqa: E402
from testkit.changelogs import changelog_rows  # noqa: E402
from testkit.crash_points import environment as crash_environment  # noqa: E402
from testkit.processes import REPO, arm_crash_point, kill_tree  # noqa: E402
from testkit.target_reads import (  # noqa: E402
    history_mismatches,
    read_iceberg,
    source_history,
    table_history,
)
from testkit.waiting import wait_until  # noqa: E402
from testkit.wire_e2e import (  # noqa: E402
    IGNORE,
    INSTANCE,
    KEY_ID,
    META_ENV,
    SECRET,
    meta_uri,
    wire_scenario,
)

pytestmark = pytest.mark.slow

KEYS = 12
NEW_ATTRIBUTES = ("colour", "size", "flag")


# --- the writer: the official SDK -------------------------------------------------------------


def write_integers(client: OTSClient) -> None:
    """Before the drift: ``name`` STRING and ``qty`` INTEGER on every key, an update, a delete."""
    for k in range(KEYS):
        client.put_row("t", Row([("id", k)], [("name", f"n{k}"), ("qty", k * 10)]), IGNORE)
    client.update_row("t", Row([("id", 1)], {"PUT": [("qty", 11)]}), IGNORE)
    client.delete_row("t", Row([("id", KEYS - 1)]), IGNORE)


def write_drift(client: OTSClient) -> None:
    """``qty`` becomes a DOUBLE (a fraction, and a whole 7.0), then a STRING on some keys;
    ``colour`` (STRING), ``size`` (INTEGER) and ``flag`` (BOOLEAN) appear; one is deleted
    from a row again, a key is deleted and one new key is written with every kind."""
    for k in range(0, 8):
        qty = 7.0 if k == 3 else k + 0.5
        client.update_row("t", Row([("id", k)], {"PUT": [("qty", qty)]}), IGNORE)
    for k in range(4, 10):
        client.update_row("t", Row([("id", k)], {"PUT": [("qty", f"q{k}"),
                                                       ("colour", f"c{k}")]}), IGNORE)
    for k in range(0, KEYS, 2):
        client.update_row("t", Row([("id", k)], {"PUT": [("size", k * 3),
                                                       ("flag", k % 4 == 0)]}), IGNORE)
    client.update_row("t", Row([("id", 6)], {"DELETE_ALL": ["colour"]}), IGNORE)
    client.delete_row("t", Row([("id", 9)]), IGNORE)
    client.put_row("t", Row([("id", 40)], [("name", "new"), ("qty", "forty"), ("colour", "red"),
                                           ("size", 40), ("flag", False)]), IGNORE)


def typed(row: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Each value with its kind, so an INTEGER 7 and a DOUBLE 7.0 differ (``7 == 7.0``)."""
    return {name: (type(value).__name__, value) for name, value in row.items()}


def source_as_the_sdk_reads_it(client: OTSClient) -> dict[str, dict[str, tuple[str, Any]]]:
    """key -> the row's attributes, read with the SDK's GetRange (every page)."""
    rows: dict[str, dict[str, tuple[str, Any]]] = {}
    start: Any = [("id", INF_MIN)]
    while start is not None:
        _, start, page, _ = client.get_range("t", "FORWARD", start, [("id", INF_MAX)],
                                             max_version=1)
        for row in page:
            rows[f'{{"id": {dict(row.primary_key)["id"]}}}'] = typed(
                {name: value for name, value, _ts in row.attribute_columns})
    return rows


# --- the target ------------------------------------------------------------------------------


class Target:
    """Where ``replicate`` applies (``--target``) and how the test reads it back."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        if kind == "delta":
            self.path = tmp / "lake" / "t"
            self.uri = f"delta://{self.path}"
        else:
            self.warehouse = tmp / "warehouse"
            self.uri = f"iceberg://{self.warehouse}?table=cdc.t"

    def exists(self) -> bool:
        if self.kind == "delta":
            return (self.path / "_delta_log").exists()
        return (self.warehouse / "catalog.db").exists() and self._iceberg() is not None

    def _iceberg(self) -> Any:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        catalog = load_catalog("tablestore_cdc", **sqlite_catalog_properties(str(self.warehouse)))
        try:
            return catalog.load_table("cdc.t")
        except NoSuchTableError:
            return None

    def rows(self) -> list[dict[str, Any]]:
        if self.kind == "delta":
            return read_delta(str(self.path))
        return read_iceberg(sqlite_catalog_properties(str(self.warehouse)), "cdc.t")

    def columns(self) -> list[str]:
        if self.kind == "delta":
            from deltalake import DeltaTable

            return [f.name for f in DeltaTable(str(self.path)).schema().fields]
        return [f.name for f in self._iceberg().schema().fields]

    def state(self) -> dict[str, dict[str, tuple[str, Any]]]:
        """key -> the live row's attributes, ``_extra``'s typed values merged in."""
        return {k: typed(v) for k, v in table_state(self.rows(), ["id"]).items()}


# --- the job ---------------------------------------------------------------------------------


class Replicate:
    """``tablestore-cdc replicate`` of table ``t`` from the emulator into ``target``, as its own
    process (its output in ``log``); ``flags`` adds to the command."""

    def __init__(self, tmp: Path, url: str, target: Target, *flags: str,
                 env: dict[str, str] | None = None) -> None:
        self.log = tmp / "replicate.log"
        # the stream alone (its history is the change log's), unless a flag names the type
        initial = [] if any("tunnel.type=" in f for f in flags) else ["--initial", "none"]
        self.command = [sys.executable, "-m", "tablestore_cdc", "replicate",
                        "--endpoint", url, "--table", "t", "--output", str(tmp / "out"),
                        "--target", target.uri,
                        "--option", f"instance.name={INSTANCE}",
                        "--option", f"access.key.id={KEY_ID}",
                        "--option", f"access.key.secret={SECRET}",
                        "--trigger-ms", "300", *initial, *flags]
        self.env = {**os.environ, **META_ENV, "PYSPARK_PYTHON": sys.executable, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(self.command, cwd=REPO, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self.process

    def stop(self) -> int:
        """SIGTERM (the job stops cleanly); its exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(120)

    def kill(self) -> None:
        if self.process is not None:
            kill_tree(self.process.pid)

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


@contextmanager
def running(job: Replicate) -> Iterator[subprocess.Popen[bytes]]:
    process = job.start()
    try:
        yield process
    finally:
        job.kill()


def wait_equal(client: OTSClient, target: Target, job: Replicate, what: str) -> None:
    def compare() -> tuple[bool, Any]:
        if not target.exists():
            return False, "no table yet"
        source, got = source_as_the_sdk_reads_it(client), target.state()
        return source == got, {k: (source.get(k), got.get(k)) for k in set(source) | set(got)
                               if source.get(k) != got.get(k)}

    wait_until(what, compare, lambda result: result[0], timeout=240, interval=1.0,
               process=job.process)


def assert_every_value_kept(target: Target) -> None:
    """The new attributes are columns; ``qty``'s DOUBLEs and STRINGs are typed in ``_extra``."""
    columns = target.columns()
    assert {"qty", "_extra", *NEW_ATTRIBUTES} <= set(columns), columns
    live = {row["id"]: row for row in target.rows() if row.get("__END_AT") is None}
    assert live[0]["qty"] is None and '"qty":0.5' in live[0]["_extra"]
    assert live[3]["qty"] is None and '"qty":7.0' in live[3]["_extra"]  # the DOUBLE, typed
    assert live[5]["qty"] is None and '"qty":"q5"' in live[5]["_extra"]
    assert live[10]["qty"] == 100 and live[10]["size"] == 30 and live[10]["flag"] is False


def assert_history_is_the_change_log(store: Any, target: Target) -> None:
    """SCD 2: every key's versions are the change log's, none missing and none twice."""
    mismatches = history_mismatches(source_history(wire_change_log(store.change_log("t"))),
                                    table_history(target.rows(), ["id"]))
    assert not mismatches, mismatches[:3]


# --- the tests -------------------------------------------------------------------------------


def shown_statuses(emulator: Any) -> list[dict[str, Any]]:
    """The tables' records in the operator's view: ``tablestore-cdc meta tables --json`` over
    the job's meta table (the feed's ``table_status``). The job's watch loop writes them, so a
    record may follow the data it describes by a look (a few seconds on a loaded machine)."""
    result = CliRunner(env=META_ENV).invoke(cli_app, ["meta", "tables", "--meta",
                                                      meta_uri(emulator), "--json"])
    assert result.exit_code == 0, result.output
    return [dict(row) for row in json.loads(result.stdout)["tables"]]


@pytest.mark.parametrize("kind", ["delta", pytest.param("iceberg", marks=pytest.mark.extended)])
def test_the_default_policy_delivers_every_value_of_a_drifting_table(
        tmp_path: Path, kind: str) -> None:
    with wire_scenario(tmp_path) as (emulator, _store, client):
        target = Target(kind, tmp_path)
        job = Replicate(tmp_path, emulator.url, target, "--option", "checkpoint.table=cdc_meta")
        with running(job):
            write_integers(client)
            wait_equal(client, target, job, "the integers applied")
            assert target.columns()[:3] == ["id", "name", "qty"]
            write_drift(client)
            wait_equal(client, target, job, "every drifted value applied")
            assert_every_value_kept(target)
            # each schema change is in the operator's view: what, when, the target version
            (status,) = wait_until(
                "the schema change in the feed", lambda: shown_statuses(emulator),
                lambda rows: len(rows) == 1 and "add column" in (rows[0]["last_schema_change"]
                                                                 or ""),
                timeout=60, process=job.process)
            assert status["table"] == "t" and status["state"] == "streaming"
            assert re.fullmatch(r"batch \d+: add column \w+ \w+(; .+)?",
                                status["last_schema_change"]), status
            assert 0 < status["last_schema_change_at"] <= status["at"]
            assert status["last_schema_change_version"] is not None
            if kind == "delta":  # Iceberg's versions are snapshot ids, not ordered
                assert status["last_schema_change_version"] <= status["target_version"]
            assert status["target"] == target.uri and status["rows_applied"] > 0
            assert job.stop() == 0, job.tail()
        log = job.log.read_text()
        assert "Traceback" not in log
        assert "schema change of the target: batch " in log  # the job's own line
        (stopped,) = shown_statuses(emulator)  # a clean stop keeps the last schema change
        assert stopped["state"] == "stopped"
        assert stopped["last_schema_change"] == status["last_schema_change"]


@pytest.mark.extended  # the same two policies on one batch: tests/test_misfits_spark.py
def test_exception_fails_in_one_line_then_lenient_delivers_the_batch_exactly_once(
        tmp_path: Path) -> None:
    with wire_scenario(tmp_path) as (emulator, store, client):
        target = Target("delta", tmp_path)
        refusing = Replicate(tmp_path, emulator.url, target, "--scd", "2",
                             "--schema-drift", "exception")
        with running(refusing) as process:
            write_integers(client)
            wait_equal(client, target, refusing, "the integers applied under exception")
            client.update_row("t", Row([("id", 2)], {"PUT": [("qty", 2.5)]}), IGNORE)
            assert process.wait(180) == 2, refusing.tail()  # a configuration error
        failed = [line for line in refusing.log.read_text().splitlines()
                  if line.startswith("failed: ")]
        assert len(failed) == 1, refusing.tail()
        assert failed[0].startswith("failed: ColumnTypeConflictError: table ")
        assert "column 'qty' is int64" in failed[0] and "double (2.5)" in failed[0], failed[0]
        assert "Traceback" not in refusing.log.read_text()
        assert source_as_the_sdk_reads_it(client) != target.state()  # the batch is not in
        write_drift(client)
        lenient = Replicate(tmp_path, emulator.url, target, "--scd", "2")
        with running(lenient):
            wait_equal(client, target, lenient, "the refused batch and the rest applied")
            assert lenient.stop() == 0, lenient.tail()
        assert_every_value_kept(target)
        assert_history_is_the_change_log(store, target)


def _kill_between_schema_change_and_data(tmp_path: Path, kind: str) -> None:
    faults = tmp_path / "faults"
    faults.mkdir()
    with wire_scenario(tmp_path) as (emulator, store, client):
        target = Target(kind, tmp_path)
        job = Replicate(tmp_path, emulator.url, target, "--scd", "2",
                        env=crash_environment(faults))
        with running(job):
            write_integers(client)
            wait_equal(client, target, job, "the integers applied")
            before = table_history(target.rows(), ["id"])
            arm_crash_point(faults, "after_schema_change")
            write_drift(client)
            wait_until("the apply at its schema change", (faults / "hit-after_schema_change")
                       .exists, timeout=180, process=job.process)
            job.kill()
        # Delta: the new columns are committed, the batch's data is not; Iceberg: nothing is
        assert (set(NEW_ATTRIBUTES) <= set(target.columns())) == (kind == "delta")
        assert table_history(target.rows(), ["id"]) == before
        again = Replicate(tmp_path, emulator.url, target, "--scd", "2", "--once")
        with running(again) as process:
            assert process.wait(240) == 0, again.tail()
        assert source_as_the_sdk_reads_it(client) == target.state()
        assert_every_value_kept(target)
        assert_history_is_the_change_log(store, target)


def test_a_kill_between_a_delta_schema_change_and_its_data_commit_is_exact(
        tmp_path: Path) -> None:
    """Delta's schema change is a commit of its own before the batch's data commit."""
    _kill_between_schema_change_and_data(tmp_path, "delta")


@pytest.mark.faults_full
def test_a_kill_at_an_iceberg_schema_change_is_exact(tmp_path: Path) -> None:
    """Iceberg's schema change is staged in the batch's one catalog commit: a kill there
    leaves the table as it was."""
    _kill_between_schema_change_and_data(tmp_path, "iceberg")


@pytest.mark.extended  # the embedded store's run is in the default suite (test_snapshot_op_spark)
def test_snapshot_rows_arrive_as_reads_then_the_stream(tmp_path: Path) -> None:
    with wire_scenario(tmp_path) as (emulator, _store, client):
        write_integers(client)  # before the tunnel: its base data
        target = Target("delta", tmp_path)
        job = Replicate(tmp_path, emulator.url, target, "--option", "tunnel.type=BaseAndStream",
                        "--option", "snapshot.op=READ")
        with running(job):
            wait_equal(client, target, job, "the snapshot applied")
            client.update_row("t", Row([("id", 1)], {"PUT": [("qty", 12)]}), IGNORE)
            client.delete_row("t", Row([("id", 2)]), IGNORE)
            client.put_row("t", Row([("id", 30)], [("qty", 30)]), IGNORE)
            wait_equal(client, target, job, "the stream after the snapshot applied")
            assert job.stop() == 0, job.tail()
        log = changelog_rows(tmp_path / "out", "t")
        reads = sorted(r["id"] for r in log if r["_op"] == "READ")
        assert reads == [k for k in range(KEYS) if k != KEYS - 1]  # the rows the table held
        assert all(r["_sequence"].startswith("!") for r in log if r["_op"] == "READ")
        assert sorted((r["id"], r["_op"]) for r in log if r["_op"] != "READ") == [
            (1, "UPDATE"), (2, "DELETE"), (30, "PUT")]
