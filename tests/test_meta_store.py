"""Meta-store backends: each passes the contract suite, plus backend-specific behaviour.

- ``TestSqliteMetaStore``: a real SQLite file in a temp directory;
- ``TestDynamoDbInProcess``: moto's in-process ``mock_aws`` (a URI without ``endpoint_url``);
- ``TestDynamoDbServer``: a moto server on 127.0.0.1 (``testkit/aws.py``), shared by
  child processes in the race test.

Throttling and service errors are injected with a botocore ``before-send`` hook that answers
the first k requests itself; everything after goes to moto, so botocore's real retry handler
and our error mapping run unchanged.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from moto import mock_aws

from connector.errors import (
    MetaStoreAbsentError,
    MetaStoreError,
    MetaStoreRequestError,
    MetaStoreUriError,
    MetaTableMissingError,
    TransientMetaStoreError,
)
from meta_store import open_meta_store
from meta_store.dynamodb import COMPRESS_OVER_BYTES, DynamoDbMetaStore
from meta_store.sqlite import SCHEMA_VERSION, SqliteMetaStore
from tests.contract.meta_contract import (
    NS,
    MetaStoreContract,
    RawWriter,
    make_end,
    make_manifest,
    new_uuid,
)

REGION = "us-east-1"


# --- helpers ----------------------------------------------------------------------------------


def sqlite_raw_writer(path: str) -> RawWriter:
    def write(namespace: str, uuid: str, channel_id: str | None, payload: str) -> None:
        with closing(sqlite3.connect(path)) as conn, conn:
            if channel_id is None:
                cur = conn.execute("UPDATE cdc_batches SET record = ? WHERE ns = ? AND uuid = ?",
                                   (payload, namespace, uuid))
            else:
                cur = conn.execute(
                    "UPDATE cdc_end_checkpoints SET record = ? WHERE ns = ? AND uuid = ?"
                    " AND channel_id = ?", (payload, namespace, uuid, channel_id))
            assert cur.rowcount == 1, "the raw writer overwrites existing rows only"

    return write


def dynamo_client(endpoint_url: str | None = None) -> Any:
    return boto3.client("dynamodb", region_name=REGION, endpoint_url=endpoint_url)


def dynamo_raw_writer(uri: str) -> RawWriter:
    parts = urlsplit(uri)
    endpoint = dict(p.split("=", 1) for p in parts.query.split("&")).get("endpoint_url")

    def write(namespace: str, uuid: str, channel_id: str | None, payload: str) -> None:
        sk = f"B#{uuid}" if channel_id is None else f"E#{uuid}#{channel_id}"
        dynamo_client(endpoint).update_item(
            TableName=parts.netloc, Key={"ns": {"S": namespace}, "sk": {"S": sk}},
            UpdateExpression="SET doc = :p", ConditionExpression="attribute_exists(sk)",
            ExpressionAttributeValues={":p": {"S": payload}})

    return write


class _Body:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


class FailFirst:
    """A botocore ``before-send`` hook: answers the first ``count`` requests of ``operation``
    with the DynamoDB error ``code`` (HTTP ``status``) instead of sending them; the rest go
    to the service. ``calls`` counts every attempt botocore made."""

    def __init__(self, operation: str, count: int, code: str = "ThrottlingException",
                 status: int = 400) -> None:
        self.operation, self.count, self.code, self.status = operation, count, code, status
        self.calls = 0

    def install(self, store: DynamoDbMetaStore) -> FailFirst:
        store.client.meta.events.register_first(f"before-send.dynamodb.{self.operation}", self)
        return self

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        self.calls += 1
        if self.calls > self.count:
            return None
        body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{self.code}",
                           "message": "injected by the test"}).encode()
        return AWSResponse(request.url, self.status,
                           {"Content-Type": "application/x-amz-json-1.0",
                            "x-amzn-RequestId": "injected"}, _Body(body))


# --- the contract on every backend -------------------------------------------------------------


class TestSqliteMetaStore(MetaStoreContract):
    @pytest.fixture
    def meta_store_uri(self, tmp_path: Any) -> str:
        return f"sqlite://{tmp_path}/meta.db"

    @pytest.fixture
    def meta_raw_writer(self, meta_store_uri: str) -> RawWriter:
        return sqlite_raw_writer(urlsplit(meta_store_uri).path)


class TestDynamoDbInProcess(MetaStoreContract):
    multi_process_skip = ("moto's in-process mock_aws exists only in this process; "
                          "TestDynamoDbServer runs the multi-process race on a moto server")

    @pytest.fixture
    def meta_store_uri(self, aws_env: dict[str, str]) -> Iterator[str]:
        with mock_aws():
            # no endpoint_url: the store must reach moto through the regular AWS endpoint
            yield f"dynamodb://cdc-meta?region={REGION}&create_table=true"

    @pytest.fixture
    def meta_raw_writer(self, meta_store_uri: str) -> RawWriter:
        return dynamo_raw_writer(meta_store_uri)


class TestDynamoDbServer(MetaStoreContract):
    @pytest.fixture
    def meta_store_uri(self, moto_endpoint: str) -> str:
        table = f"cdc-meta-{uuidlib.uuid4().hex[:12]}"
        return f"dynamodb://{table}?region={REGION}&endpoint_url={moto_endpoint}&create_table=true"

    @pytest.fixture
    def meta_raw_writer(self, meta_store_uri: str) -> RawWriter:
        return dynamo_raw_writer(meta_store_uri)


# --- URIs ---------------------------------------------------------------------------------------


class TestUris:
    @pytest.mark.parametrize("uri", [
        "sqlite://relative/meta.db",
        "sqlite:relative/meta.db",
        "sqlite:///",
        "sqlite:///tmp/",
        "sqlite:///no/such/directory/meta.db",
        "sqlite:///tmp/meta.db?journal=off",
        "sqlite:///tmp/meta.db?busy_timeout_ms=soon",
        "sqlite:///tmp/meta.db?lock_retries=-1",
        "mysql://db.example/meta",
        "meta.db",
        "dynamodb://",
        "dynamodb:///",
        "dynamodb://?region=us-east-1",
        "dynamodb://a?region=us-east-1",
        "dynamodb://table/extra?region=us-east-1",
        "dynamodb://table?region=us-east-1&create_table=maybe",
        "dynamodb://table?region=us-east-1&retry_mode=legacy",
        "dynamodb://table?region=us-east-1&max_attempts=0",
        "dynamodb://table?region=us-east-1&endpoint_url=ftp://127.0.0.1",
        "dynamodb://table?region=us-east-1&colour=blue",
        "dynamodb://table?region=us-east-1&region=eu-west-1",
    ])
    def test_bad_uri_names_the_uri(self, uri: str) -> None:
        with pytest.raises(MetaStoreUriError) as info:
            open_meta_store(uri)
        assert repr(info.value.uri)[1:-1] in str(info.value)
        assert info.value.uri.split("?")[0] == uri.split("?")[0]

    def test_sqlite_directory_instead_of_file(self, tmp_path: Any) -> None:
        (tmp_path / "meta.db").mkdir()
        with pytest.raises(MetaStoreUriError, match="is a directory"):
            open_meta_store(f"sqlite://{tmp_path}/meta.db")

    def test_dynamodb_without_region(self, aws_env: dict[str, str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("AWS_DEFAULT_REGION")
        monkeypatch.delenv("AWS_REGION", raising=False)
        with pytest.raises(MetaStoreUriError, match="no AWS region"):
            DynamoDbMetaStore.from_uri("dynamodb://cdc-meta")

    @pytest.mark.parametrize("uri", [
        "dynamodb://cdc-meta?region=us-east-1&aws_secret_access_key=SuperSecret123",
        "dynamodb://cdc-meta?region=us-east-1&aws_access_key_id=SuperSecret123",
        "dynamodb://cdc-meta?region=us-east-1&session_token=SuperSecret123",
        "dynamodb://cdc-meta?region=us-east-1&password=SuperSecret123",
        "dynamodb://AKIAEXAMPLE:SuperSecret123@cdc-meta?region=us-east-1",
        "dynamodb://cdc-meta?region=us-east-1&endpoint_url=http://u:SuperSecret123@127.0.0.1:1",
        "dynamodb://cdc-meta?region=us-east-1&other=SuperSecret123",
        "sqlite:///tmp/meta.db?password=SuperSecret123",
    ])
    def test_credentials_in_the_uri_are_refused_and_never_echoed(self, uri: str) -> None:
        with pytest.raises(MetaStoreUriError) as info:
            open_meta_store(uri)
        err = info.value
        for text in (str(err), repr(err), err.uri, repr(err.args)):
            assert "SuperSecret123" not in text
        if "@" in uri or "secret" in uri or "key_id" in uri or "token" in uri:
            assert "credentials are not accepted" in str(err)


# --- SQLite specifics ---------------------------------------------------------------------------


class TestSqliteSpecifics:
    def test_creates_file_and_schema_in_wal_mode(self, tmp_path: Any) -> None:
        path = tmp_path / "new.db"
        with open_meta_store(f"sqlite://{path}") as store:
            assert isinstance(store, SqliteMetaStore)
            assert store.uri == f"sqlite://{path}" and str(path) in repr(store)
        with closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            marker = dict(conn.execute("SELECT key, value FROM cdc_meta_schema"))
        assert marker == {"product": "tablestore-cdc-meta", "schema_version": str(SCHEMA_VERSION)}
        with open_meta_store(f"sqlite://{path}?busy_timeout_ms=500") as again:  # reopen
            assert again.uri == f"sqlite://{path}?busy_timeout_ms=500"
            assert again.list_batches(NS) == []

    @pytest.mark.parametrize("setup, message", [
        (["CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)"],
         "not a tablestore-cdc meta store"),
        (["CREATE TABLE cdc_meta_schema (key TEXT, value TEXT)",
          "CREATE TABLE cdc_batches (id INTEGER)"], "cdc_batches has columns"),
        (["CREATE TABLE cdc_meta_schema (k TEXT, v TEXT)"], "cdc_meta_schema has columns"),
    ])
    def test_foreign_sqlite_database_is_refused(self, tmp_path: Any, setup: list[str],
                                                message: str) -> None:
        path = tmp_path / "other-app.db"
        with closing(sqlite3.connect(path)) as conn, conn:
            for statement in setup:
                conn.execute(statement)
        with pytest.raises(MetaStoreUriError, match=message):
            open_meta_store(f"sqlite://{path}")
        with closing(sqlite3.connect(path)) as conn:  # and left as it was
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "cdc_end_checkpoints" not in names

    def test_not_an_sqlite_file_is_refused(self, tmp_path: Any) -> None:
        path = tmp_path / "notes.txt"
        path.write_text("these are not the rows you are looking for\n" * 100)
        with pytest.raises(MetaStoreUriError, match="not a database"):
            open_meta_store(f"sqlite://{path}")

    def test_newer_schema_version_is_refused(self, tmp_path: Any) -> None:
        path = tmp_path / "meta.db"
        open_meta_store(f"sqlite://{path}").close()
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("UPDATE cdc_meta_schema SET value = '99' WHERE key = 'schema_version'")
        with pytest.raises(MetaStoreUriError, match="version '99'.*upgrade"):
            open_meta_store(f"sqlite://{path}")

    def test_locked_database_is_retried_then_transient(self, tmp_path: Any) -> None:
        path = tmp_path / "meta.db"
        uri = f"sqlite://{path}?busy_timeout_ms=50&lock_retries=2"
        store = open_meta_store(uri)
        u = new_uuid()
        store.put_end_checkpoint(NS, u, make_end(channel_id="before"))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            started = time.monotonic()
            with pytest.raises(TransientMetaStoreError) as info:
                store.put_end_checkpoint(NS, u, make_end())
            assert info.value.retryable and "locked" in str(info.value)
            assert "3 attempts" in str(info.value)
            assert time.monotonic() - started < 5
            # WAL: readers are not blocked by a writer
            assert store.get_end_checkpoint(NS, u, "before") is not None
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.put_end_checkpoint(NS, u, make_end()) == make_end()
        store.close()

    def test_lock_released_during_retries_succeeds(self, tmp_path: Any) -> None:
        path = tmp_path / "meta.db"
        store = open_meta_store(f"sqlite://{path}?busy_timeout_ms=100&lock_retries=50")
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.5, lambda: holder.execute("ROLLBACK"))
        release.start()
        try:
            started = time.monotonic()
            store.create_batch(NS, "u-1", None)  # waits longer than one busy timeout
            assert time.monotonic() - started >= 0.4
        finally:
            release.join()
            holder.close()
        assert store.get_batch(NS, "u-1").uuid == "u-1"
        store.close()

    def test_a_file_from_before_leases_gets_the_lease_table_when_opened(self, tmp_path: Any
                                                                         ) -> None:
        path = tmp_path / "meta.db"
        with open_meta_store(f"sqlite://{path}") as store:
            store.set_namespace_info(NS, {"table": "t"})
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DROP TABLE cdc_leases")  # as an earlier version left it
        with open_meta_store(f"sqlite://{path}") as store:
            assert store.get_namespace_info(NS) == {"table": "t"}
            assert store.take_lease(NS, "a", 60, namespace=NS, now=1) is None
            assert store.get_lease(NS).owner == "a"

    def test_opened_without_creating_a_missing_file_stays_missing(self, tmp_path: Any) -> None:
        path = tmp_path / "absent.meta.db"
        with pytest.raises(MetaStoreAbsentError, match="no meta store at"):
            open_meta_store(f"sqlite://{path}", create=False)
        assert not path.exists()
        open_meta_store(f"sqlite://{path}").close()
        open_meta_store(f"sqlite://{path}", create=False).close()  # it exists now

    def test_closed_store_raises(self, tmp_path: Any) -> None:
        store = open_meta_store(f"sqlite://{tmp_path}/meta.db")
        store.close()
        with pytest.raises(MetaStoreError, match="closed"):
            store.get_batch(NS, "u")


# --- DynamoDB specifics (moto server) ------------------------------------------------------------


@pytest.fixture
def table_name() -> str:
    return f"cdc-meta-{uuidlib.uuid4().hex[:12]}"


@pytest.fixture
def dynamo_uri(moto_endpoint: str, table_name: str) -> Callable[..., str]:
    def make(**params: Any) -> str:
        query = "&".join([f"region={REGION}", f"endpoint_url={moto_endpoint}"]
                         + [f"{k}={v}" for k, v in params.items()])
        return f"dynamodb://{table_name}?{query}"

    return make


class TestDynamoDbSpecifics:
    def test_missing_table_without_create_table(self, dynamo_uri: Callable[..., str],
                                                table_name: str, moto_endpoint: str) -> None:
        store = open_meta_store(dynamo_uri())  # opening makes no request
        with pytest.raises(MetaTableMissingError) as info:
            store.get_batch(NS, "u")
        message = str(info.value)
        assert table_name in message and "create_table=true" in message
        assert moto_endpoint in message
        with pytest.raises(MetaTableMissingError):
            store.put_end_checkpoint(NS, "u", make_end())
        assert table_name not in dynamo_client(moto_endpoint).list_tables()["TableNames"]

    def test_create_table_makes_a_pay_per_request_table(
        self, dynamo_uri: Callable[..., str], table_name: str, moto_endpoint: str,
    ) -> None:
        with open_meta_store(dynamo_uri(create_table="true")) as store:
            store.create_batch(NS, "u", None)
        table = dynamo_client(moto_endpoint).describe_table(TableName=table_name)["Table"]
        assert table["TableStatus"] == "ACTIVE"
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        assert {(k["AttributeName"], k["KeyType"]) for k in table["KeySchema"]} == {
            ("ns", "HASH"), ("sk", "RANGE")}
        with open_meta_store(dynamo_uri(create_table="true")) as again:  # exists: reused
            assert again.get_batch(NS, "u").uuid == "u"

    def test_foreign_table_is_refused(self, dynamo_uri: Callable[..., str], table_name: str,
                                      moto_endpoint: str) -> None:
        dynamo_client(moto_endpoint).create_table(
            TableName=table_name, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
        with pytest.raises(MetaStoreUriError, match="not a tablestore-cdc meta table"):
            open_meta_store(dynamo_uri(create_table="true"))
        with open_meta_store(dynamo_uri()) as store, pytest.raises(MetaStoreRequestError,
                                                                     match="key schema"):
            store.create_batch(NS, "u", None)

    def test_throttled_requests_are_retried_then_succeed(
        self, dynamo_uri: Callable[..., str]
    ) -> None:
        with open_meta_store(dynamo_uri(create_table="true", max_attempts=4)) as store:
            assert isinstance(store, DynamoDbMetaStore)
            hook = FailFirst("PutItem", count=2).install(store)
            end = make_end()
            assert store.put_end_checkpoint(NS, "u", end) == end
            assert hook.calls == 3  # two throttled attempts, then the real one
            assert store.get_end_checkpoint(NS, "u", end.channel_id) == end

    def test_persistent_throttling_is_transient(self, dynamo_uri: Callable[..., str]) -> None:
        with open_meta_store(dynamo_uri(create_table="true", max_attempts=2)) as store:
            assert isinstance(store, DynamoDbMetaStore)
            hook = FailFirst("PutItem", count=1000).install(store)
            with pytest.raises(TransientMetaStoreError) as info:
                store.put_end_checkpoint(NS, "u", make_end())
            assert hook.calls == 2
            assert info.value.retryable
            assert "ThrottlingException" in str(info.value) and "2 attempt" in str(info.value)

    @pytest.mark.parametrize("code, status, attempts", [
        ("ProvisionedThroughputExceededException", 400, 1),
        ("RequestLimitExceeded", 400, 1),
        ("InternalServerError", 500, 3),
    ])
    def test_service_errors_after_retries_are_transient(
        self, dynamo_uri: Callable[..., str], code: str, status: int, attempts: int,
    ) -> None:
        with open_meta_store(dynamo_uri(create_table="true", max_attempts=attempts)) as store:
            assert isinstance(store, DynamoDbMetaStore)
            hook = FailFirst("GetItem", count=1000, code=code, status=status).install(store)
            with pytest.raises(TransientMetaStoreError, match=code):
                store.get_batch(NS, "u")
            assert hook.calls == attempts

    def test_other_client_errors_are_not_retried(self, dynamo_uri: Callable[..., str]) -> None:
        with open_meta_store(dynamo_uri(create_table="true", max_attempts=5)) as store:
            assert isinstance(store, DynamoDbMetaStore)
            hook = FailFirst("GetItem", count=1000, code="AccessDeniedException").install(store)
            with pytest.raises(MetaStoreRequestError, match="AccessDeniedException") as info:
                store.get_batch(NS, "u")
            assert not info.value.retryable
            assert hook.calls == 1

    def test_unreachable_endpoint_is_transient(self, aws_env: dict[str, str]) -> None:
        import socket

        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        uri = (f"dynamodb://cdc-meta?region={REGION}&endpoint_url=http://127.0.0.1:{port}"
               "&max_attempts=2&connect_timeout=1")
        with open_meta_store(uri) as store, pytest.raises(TransientMetaStoreError,
                                                          match="could not reach"):
            store.get_batch(NS, "u")

    def test_unprocessed_deletes_are_resent(self, dynamo_uri: Callable[..., str]) -> None:
        with open_meta_store(dynamo_uri(create_table="true")) as store:
            assert isinstance(store, DynamoDbMetaStore)
            uuids = [new_uuid() for _ in range(3)]
            prev = None
            for u in uuids:
                store.put_manifest(NS, u, prev, make_manifest(1))
                for c in range(30):  # more ends than one BatchWriteItem takes
                    store.put_end_checkpoint(NS, u, make_end(channel_id=f"c{c}"))
                prev = u
            store.mark_committed(NS, uuids[-1])
            store.mark_pushed(NS, uuids)
            calls = {"n": 0}

            def first_unprocessed(request: Any, **_: Any) -> AWSResponse | None:
                calls["n"] += 1
                if calls["n"] > 1:
                    return None
                unprocessed = json.loads(request.body)["RequestItems"]
                return AWSResponse(request.url, 200,
                                   {"Content-Type": "application/x-amz-json-1.0"},
                                   _Body(json.dumps({"UnprocessedItems": unprocessed}).encode()))

            store.client.meta.events.register_first("before-send.dynamodb.BatchWriteItem",
                                                    first_unprocessed)
            assert sorted(store.gc(NS, keep_committed=1)) == sorted(uuids[:2])
            assert calls["n"] >= 2
            for u in uuids[:2]:
                assert store.get_end_checkpoints(NS, u) == {}
                assert store.find_batch(NS, u) is None
            assert len(store.get_end_checkpoints(NS, uuids[2])) == 30

    def test_listing_follows_pages(self, dynamo_uri: Callable[..., str]) -> None:
        with open_meta_store(dynamo_uri(create_table="true", page_size=2)) as store:
            assert isinstance(store, DynamoDbMetaStore)
            pages = {"Query": 0, "Scan": 0}

            def count(event_name: str, **_: Any) -> None:
                pages[event_name.rsplit(".", 1)[-1]] += 1

            store.client.meta.events.register("after-call.dynamodb.Query", count)
            store.client.meta.events.register("after-call.dynamodb.Scan", count)
            chain, prev = [], None
            for _ in range(7):
                u = new_uuid()
                store.put_manifest(NS, u, prev, make_manifest(1))
                chain.append(u)
                prev = u
            for c in range(5):
                store.put_end_checkpoint(NS, chain[0], make_end(channel_id=f"c{c}"))
            namespaces = [f"ns-{i}" for i in range(5)]
            for ns in namespaces:
                store.set_namespace_info(ns, {"table": ns})
            assert [b.uuid for b in store.list_batches(NS)] == chain
            assert len(store.get_end_checkpoints(NS, chain[0])) == 5
            assert store.list_namespaces() == namespaces
            assert pages["Query"] >= 4 + 3 and pages["Scan"] >= 3

    def test_large_manifest_is_stored_compressed(self, dynamo_uri: Callable[..., str],
                                                 table_name: str, moto_endpoint: str) -> None:
        manifest = make_manifest(2500, tag="huge", token_len=150)
        assert len(manifest.model_dump_json()) > COMPRESS_OVER_BYTES
        with open_meta_store(dynamo_uri(create_table="true")) as store:
            assert store.put_manifest(NS, "u", None, manifest) == manifest
            assert store.get_batch(NS, "u").manifest == manifest
            assert store.put_manifest(NS, "v", None, make_manifest(2)).channels[0].token
        raw = dynamo_client(moto_endpoint).get_item(
            TableName=table_name, Key={"ns": {"S": NS}, "sk": {"S": "B#u"}})["Item"]
        assert "B" in raw["manifest"] and len(raw["manifest"]["B"]) < 300_000
        small = dynamo_client(moto_endpoint).get_item(
            TableName=table_name, Key={"ns": {"S": NS}, "sk": {"S": "B#v"}})["Item"]
        assert "S" in small["manifest"]

    def test_secrets_are_never_shown_or_stored(
        self, dynamo_uri: Callable[..., str], table_name: str, moto_endpoint: str,
        aws_env: dict[str, str],
    ) -> None:
        secret = aws_env["AWS_SECRET_ACCESS_KEY"]
        uri = dynamo_uri(create_table="true", profile="no-such-profile")
        with pytest.raises(MetaStoreUriError, match="profile"):  # no such profile here
            open_meta_store(uri)
        with open_meta_store(dynamo_uri(create_table="true")) as store:
            store.set_namespace_info(NS, {"table": "orders"})
            store.put_manifest(NS, "u", None, make_manifest(2))
            store.put_end_checkpoint(NS, "u", make_end())
            for text in (store.uri, repr(store), str(store)):
                assert secret not in text and aws_env["AWS_ACCESS_KEY_ID"] + ":" not in text
            assert store.uri == dynamo_uri(create_table="true")
        items = dynamo_client(moto_endpoint).scan(TableName=table_name)["Items"]
        assert items and secret not in json.dumps(items, default=str)
        assert aws_env["AWS_SESSION_TOKEN"] not in json.dumps(items, default=str)
