"""The Tablestore meta store (``tablestore://``) against the local emulator over HTTP.

``TestTablestoreMetaStore`` runs the meta-store contract (``tests/contract/meta_contract.py``,
including the multi-process put-if-absent race: spawned processes reach the emulator over
HTTP) on a fresh table per test. One ``EmulatorServer`` on 127.0.0.1 port 0 serves the whole
module; credentials come from ``ALIBABA_CLOUD_*`` environment variables, as in production.
"""

from __future__ import annotations

import json
import socket
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tablestore")

from tablestore import (  # noqa: E402
    CapacityUnit,
    ReservedThroughput,
    TableMeta,
    TableOptions,
)
from typer.testing import CliRunner  # noqa: E402

from connector.errors import (  # noqa: E402
    MetaStoreRequestError,
    MetaStoreUriError,
    MetaTableMissingError,
    TransientMetaStoreError,
)
from meta_store import BatchState, open_meta_store  # noqa: E402
from meta_store.tablestore import TablestoreMetaStore  # noqa: E402
from tablestore_cdc.commands.app import app as root_app  # noqa: E402
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # noqa: E402
from testkit.tablestore_meta import ENV, sdk_client, table_uri, tablestore_raw_writer  # noqa: E402
from tests.contract.meta_contract import (  # noqa: E402
    NS,
    MetaStoreContract,
    RawWriter,
    make_end,
    make_manifest,
    new_uuid,
)


@pytest.fixture
def ots_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Credentials in the environment (inherited by the race test's spawned processes)."""
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ALIBABA_CLOUD_SECURITY_TOKEN", raising=False)
    return dict(ENV)


class TestTablestoreMetaStore(MetaStoreContract):
    @pytest.fixture
    def meta_store_uri(self, ots_emulator: EmulatorServer, ots_env: dict[str, str]) -> str:
        return table_uri(ots_emulator, create_table="true")

    @pytest.fixture
    def meta_raw_writer(self, ots_emulator: EmulatorServer, meta_store_uri: str) -> RawWriter:
        return tablestore_raw_writer(ots_emulator, meta_store_uri)


# --- URIs and credentials -----------------------------------------------------------------------


class TestUrisAndCredentials:
    @pytest.mark.parametrize("uri, message", [
        ("tablestore://", "INSTANCE/TABLE"),
        ("tablestore://emu", "INSTANCE/TABLE"),
        ("tablestore://emu/", "INSTANCE/TABLE"),
        ("tablestore://emu/bad-table?endpoint=http://127.0.0.1:1", "table name"),
        ("tablestore://1emu/t?endpoint=http://127.0.0.1:1", "instance name"),
        ("tablestore://emu/t", "'endpoint' is required"),
        ("tablestore://emu/t?endpoint=ftp://127.0.0.1", "endpoint must be"),
        ("tablestore://emu/t?endpoint=http://127.0.0.1:1/path", "endpoint must be"),
        ("tablestore://emu/t?endpoint=http://127.0.0.1:1&create_table=maybe", "create_table"),
        ("tablestore://emu/t?endpoint=http://127.0.0.1:1&max_attempts=0", "max_attempts"),
        ("tablestore://emu/t?endpoint=http://127.0.0.1:1&page_size=9999", "page_size"),
        ("tablestore://emu/t?endpoint=http://127.0.0.1:1&colour=blue", "unknown parameter"),
        ("tablestore://emu/t?endpoint=http://a:1&endpoint=http://b:1", "given twice"),
    ])
    def test_bad_uris_are_refused(self, ots_env: dict[str, str], uri: str, message: str) -> None:
        with pytest.raises(MetaStoreUriError, match=message):
            open_meta_store(uri)

    @pytest.mark.parametrize("uri", [
        "tablestore://emu/t?endpoint=http://127.0.0.1:1&access_key_secret=SuperSecret123",
        "tablestore://emu/t?endpoint=http://127.0.0.1:1&access_key_id=SuperSecret123",
        "tablestore://emu/t?endpoint=http://127.0.0.1:1&sts_token=SuperSecret123",
        "tablestore://AK:SuperSecret123@emu/t?endpoint=http://127.0.0.1:1",
        "tablestore://emu/t?endpoint=http://AK:SuperSecret123@127.0.0.1:1",
    ])
    def test_credentials_in_the_uri_are_refused_and_not_shown(
        self, ots_env: dict[str, str], uri: str
    ) -> None:
        with pytest.raises(MetaStoreUriError, match="credential") as info:
            open_meta_store(uri)
        assert "SuperSecret123" not in str(info.value)

    def test_no_credentials_is_a_clear_error(self, monkeypatch: pytest.MonkeyPatch,
                                             ots_emulator: EmulatorServer) -> None:
        for key in (*ENV, "ALIBABA_CLOUD_SECURITY_TOKEN"):
            monkeypatch.delenv(key, raising=False)
        with pytest.raises(MetaStoreRequestError, match="ALIBABA_CLOUD_ACCESS_KEY_ID"):
            open_meta_store(table_uri(ots_emulator))

    def test_credentials_from_the_sources_options(self, monkeypatch: pytest.MonkeyPatch,
                                                  ots_emulator: EmulatorServer) -> None:
        for key in ENV:
            monkeypatch.delenv(key, raising=False)
        uri = table_uri(ots_emulator, create_table="true")
        with TablestoreMetaStore.from_uri(uri, access_key_id=KEY_ID,
                                          access_key_secret=SECRET) as store:
            store.create_batch(NS, new_uuid(), None)
            assert len(store.list_batches(NS)) == 1
            assert SECRET not in store.uri and SECRET not in repr(store)

    def test_wrong_secret_is_refused(self, ots_emulator: EmulatorServer) -> None:
        uri = table_uri(ots_emulator, create_table="true")
        with pytest.raises(MetaStoreRequestError, match="OTSAuthFailed"):
            TablestoreMetaStore.from_uri(uri, access_key_id=KEY_ID, access_key_secret="wrong")


# --- backend specifics ----------------------------------------------------------------------------


class TestTablestoreSpecifics:
    def test_missing_table_without_create_table(self, ots_emulator: EmulatorServer,
                                                ots_env: dict[str, str]) -> None:
        uri = table_uri(ots_emulator)
        store = open_meta_store(uri)  # opening makes no request
        with pytest.raises(MetaTableMissingError, match="create_table=true"):
            store.list_batches(NS)
        store.close()

    def test_a_foreign_table_is_refused(self, ots_emulator: EmulatorServer,
                                        ots_env: dict[str, str]) -> None:
        table = f"other_{uuidlib.uuid4().hex[:8]}"
        sdk_client(ots_emulator).create_table(
            TableMeta(table, [("id", "INTEGER")]), TableOptions(),
            ReservedThroughput(CapacityUnit(0, 0)))
        with pytest.raises(MetaStoreUriError, match="not a tablestore-cdc meta table"):
            open_meta_store(table_uri(ots_emulator, table, create_table="true"))

    def test_paginated_reads_and_chunked_deletes(self, ots_emulator: EmulatorServer,
                                                 ots_env: dict[str, str]) -> None:
        """Lists follow next_start_primary_key over small pages; gc deletes more end
        checkpoints than one BatchWriteRow may carry (200)."""
        with open_meta_store(table_uri(ots_emulator, create_table="true",
                                       page_size="7")) as store:
            chain, prev = [], None
            for i in range(23):
                u = new_uuid()
                store.create_batch(NS, u, prev, now=1000.0 + i)
                store.put_manifest(NS, u, prev, make_manifest(1))
                chain.append(u)
                prev = u
            assert [b.uuid for b in store.list_batches(NS)] == chain
            for c in range(230):
                store.put_end_checkpoint(NS, chain[0], make_end(channel_id=f"c{c:03d}"))
            assert len(store.get_end_checkpoints(NS, chain[0])) == 230
            store.mark_committed(NS, chain[-1])
            store.mark_pushed(NS, chain)
            deleted = store.gc(NS, keep_committed=1)
            assert chain[0] in deleted and len(deleted) == 22
            assert store.get_end_checkpoints(NS, chain[0]) == {}
            assert [b.uuid for b in store.list_batches(NS)] == chain[-1:]

    def test_state_fields_are_set_once(self, ots_emulator: EmulatorServer,
                                       ots_env: dict[str, str]) -> None:
        with open_meta_store(table_uri(ots_emulator, create_table="true")) as store:
            u = new_uuid()
            store.put_manifest(NS, u, None, make_manifest(2))
            store.mark_committed(NS, u, spark_batch_id=4, now=10.0)
            store.mark_committed(NS, u, spark_batch_id=5, now=20.0)
            store.mark_pushed(NS, [u], now=30.0)
            store.mark_pushed(NS, [u], now=40.0)
            batch = store.get_batch(NS, u)
            assert (batch.state, batch.spark_batch_id) == (BatchState.PUSHED, 4)
            assert (batch.committed_at, batch.pushed_at) == (10.0, 30.0)

    def test_an_unreachable_endpoint_is_transient(self, ots_env: dict[str, str]) -> None:
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        uri = f"tablestore://{INSTANCE}/t?endpoint=http://127.0.0.1:{port}&max_attempts=2"
        with open_meta_store(uri) as store, pytest.raises(TransientMetaStoreError):
            store.get_batch(NS, new_uuid())

    def test_a_response_failing_the_sdk_validation_is_an_error(
        self, ots_emulator: EmulatorServer, ots_env: dict[str, str]
    ) -> None:
        with open_meta_store(table_uri(ots_emulator, create_table="true")) as store:
            ots_emulator.corrupt_response_signatures = True
            try:
                with pytest.raises(MetaStoreRequestError, match="Invalid signature"):
                    store.create_batch(NS, new_uuid(), None)
            finally:
                ots_emulator.corrupt_response_signatures = False

    def test_inspection_cli_reads_it(self, ots_emulator: EmulatorServer,
                                     ots_env: dict[str, str], tmp_path: Path) -> None:
        uri = table_uri(ots_emulator, create_table="true")
        with open_meta_store(uri) as store:
            store.set_namespace_info(NS, {"endpoint": "local", "table": "orders",
                                          "tunnel": "t1"})
            u, v = new_uuid(), new_uuid()
            store.put_manifest(NS, u, None, make_manifest(2))
            store.put_end_checkpoint(NS, u, make_end(channel_id="ch-00000", records=5))
            store.create_batch(NS, v, u)
            store.mark_committed(NS, u, spark_batch_id=0)
        result = CliRunner().invoke(root_app, ["meta", "batches", "--meta", uri, "--json"])
        assert result.exit_code == 0, result.output
        rows: list[dict[str, Any]] = json.loads(result.output)["batches"]
        assert [(r["uuid"], r["state"], r["records"]) for r in rows] == [
            (u, "committed", 5), (v, "minted", 0)]
        result = CliRunner().invoke(root_app, ["meta", "namespaces", "--meta", uri, "--json"])
        assert result.exit_code == 0, result.output
        assert [n["namespace"] for n in json.loads(result.output)["namespaces"]] == [NS]
        # inspection never creates a table
        missing = table_uri(ots_emulator, create_table="true")
        result = CliRunner().invoke(root_app, ["meta", "batches", "--meta", missing])
        assert result.exit_code == 2 and "does not exist" in result.output
