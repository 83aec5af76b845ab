"""DynamoDB meta store: a shared meta table for clusters.

Needs boto3: ``pip install 'tablestore-cdc[dynamodb]'``.

URI: ``dynamodb://TABLE?region=us-east-1&endpoint_url=http://127.0.0.1:5000&create_table=true``;
its parameters (``DynamoDbUriQuery``: region, endpoint, profile, ``create_table``, botocore's
retries, timeouts, page size) are described in docs/operations.md.

Credentials: only the standard AWS chain (environment, ``profile``, container/instance role);
never in the URI, which travels in Spark options, plans and logs (``cdc_common.uris`` refuses
them and hides the values).

boto3 sessions are cached per profile for the life of the process (creating one costs
~50 ms, and executors open a store per ``read()``); credentials are therefore resolved once
per process and profile, and refreshable ones (roles, SSO) refresh themselves.

Who opens it: the driver's planning process, each executor inside ``read()`` (its
``put_end_checkpoint``/``get_end_checkpoint`` calls are single-item requests), and the CLI.
Opening makes no request unless ``create_table=true`` (then one ``DescribeTable``), so many
executors opening stores do not hit DynamoDB's control-plane limits.

Layout: partition key ``ns``, sort key ``sk``, rows as in ``meta_store.kv_layout``; here
``committed_not_pushed`` reads the ``N#pending`` index item and the batches it names, not every
batch row of the namespace.

Atomicity: put-if-absent is ``PutItem`` with ``attribute_not_exists(sk)``; the manifest is
set by one conditional ``UpdateItem`` (``attribute_not_exists(manifest)``) together with the
state; a state only moves forward (condition ``state_rank < :new``). Every read is strongly
consistent.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal

import boto3
import botocore.exceptions
from botocore.config import Config
from pydantic import Field

from cdc_common.aws_errors import is_transient
from cdc_common.aws_responses import refuse_damaged_responses
from cdc_common.credentials import AWS_CREDENTIAL_CHAIN, AWS_DEFAULT_REGION
from cdc_common.uris import HttpEndpoint, UriBool, UriQuery, parse_query
from meta_store import query_text, split_store_uri
from meta_store.base import BatchRecord, BatchState, Manifest
from meta_store.errors import (
    MetaStoreRequestError,
    MetaStoreUriError,
    MetaTableMissingError,
    TransientMetaStoreError,
    UnknownBatchError,
)
from meta_store.kv_layout import (
    BATCH_PREFIX,
    INFO_SK,
    PENDING_SK,
    ConditionFailed,
    KeyValueMetaStore,
    ManifestStorage,
    PlainRow,
    backoff,
    batch_sk,
)

log = logging.getLogger(__name__)

#: A manifest whose JSON is larger than this is stored zlib-compressed (binary attribute).
COMPRESS_OVER_BYTES = 300_000
#: Hard stop before DynamoDB's 400 KB item limit (the rest of the row is small).
MAX_MANIFEST_BYTES = 390_000

_TABLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")
_BATCH_GET_MAX = 100
_UNPROCESSED_ROUNDS = 10

_sessions: dict[str | None, boto3.session.Session] = {}
_sessions_lock = threading.Lock()


def _session(profile: str | None) -> boto3.session.Session:
    """A cached boto3 session per profile (creating one reads the SDK's data files)."""
    with _sessions_lock:
        if profile not in _sessions:
            _sessions[profile] = boto3.session.Session(profile_name=profile)
        return _sessions[profile]


class DynamoDbUriQuery(UriQuery):
    """The query of a ``dynamodb://TABLE?...`` URI (module docstring)."""

    credentials_hint: ClassVar[str] = f"use {AWS_CREDENTIAL_CHAIN}"

    region: str | None = None
    endpoint_url: HttpEndpoint | None = Field(None, description="http(s)://host[:port]")
    profile: str | None = None
    create_table: UriBool = False
    retry_mode: Literal["standard", "adaptive"] = Field("standard",
                                                        description="standard or adaptive")
    max_attempts: int = Field(8, ge=1, le=50, description="an integer from 1 to 50")
    connect_timeout: float = Field(5.0, ge=0.001, le=600.0,
                                   description="a number from 0.001 to 600.0")
    read_timeout: float = Field(20.0, ge=0.001, le=600.0,
                                description="a number from 0.001 to 600.0")
    page_size: int | None = Field(None, ge=1, le=10_000, description="an integer from 1 to 10000")


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: float | int) -> dict[str, str]:
    return {"N": repr(value) if isinstance(value, float) else str(value)}


def _attribute(value: Any) -> dict[str, Any]:
    """A row's value (``meta_store.kv_layout``) as a DynamoDB attribute value."""
    if isinstance(value, str):
        return _s(value)
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float):
        return _n(value)
    if isinstance(value, bytes):
        return {"B": value}
    if isinstance(value, list):
        return {"SS": value}
    raise TypeError(f"no DynamoDB attribute type for {value!r}")


def _row(item: dict[str, Any]) -> PlainRow:
    """A DynamoDB item as a row: numbers as int or float, binary as bytes, a set as a list."""
    row: PlainRow = {}
    for name, attribute in item.items():
        kind, value = next(iter(attribute.items()))
        if kind == "N":
            try:
                value = int(value)
            except ValueError:
                value = float(value)
        elif kind == "NULL":
            value = None
        elif kind in ("SS", "NS", "BS"):
            value = list(value)
        row[name] = value
    return row


class DynamoDbMetaStore(KeyValueMetaStore):
    """A meta table in one DynamoDB table (see the module docstring for URI, layout, atomicity).
    Open with ``from_uri`` or ``meta_store.open_meta_store``; one instance per process (the
    boto3 client inside is thread-safe)."""

    manifest_storage = ManifestStorage(
        compress_over=COMPRESS_OVER_BYTES, max_bytes=MAX_MANIFEST_BYTES,
        compressed_column="manifest", limit="DynamoDB items are limited to 400 KB")
    cell = "attribute"
    max_deletes_per_request = 25
    delete_rounds = _UNPROCESSED_ROUNDS

    def __init__(self, table: str, query: DynamoDbUriQuery) -> None:
        self.uri = f"dynamodb://{table}{query_text(query)}"
        self.table, self.endpoint_url, self.page_size = table, query.endpoint_url, query.page_size
        try:
            session = _session(query.profile)
        except botocore.exceptions.ProfileNotFound as exc:
            raise MetaStoreUriError(uri=self.uri, reason=f"profile: {exc}") from None
        self.region = query.region or session.region_name
        if not self.region:
            raise MetaStoreUriError(
                uri=self.uri, reason="no AWS region: pass region=... in the URI or set "
                f"{AWS_DEFAULT_REGION} / a profile region",
            )
        settings: dict[str, Any] = {
            "region_name": self.region,
            "retries": {"mode": query.retry_mode, "total_max_attempts": query.max_attempts},
            "connect_timeout": query.connect_timeout,
            "read_timeout": query.read_timeout,
            "user_agent_extra": "tablestore-cdc-meta",
        }
        try:
            # the regional endpoint, not the account-based one: works for DynamoDB, for
            # moto's in-process mock_aws (no endpoint_url) and for DynamoDB Local alike
            config = Config(**settings, account_id_endpoint_mode="disabled")
        except TypeError:  # a botocore older than account-based endpoints
            config = Config(**settings)
        with _sessions_lock:  # creating clients from one session is not thread-safe
            self._client = refuse_damaged_responses(
                session.client("dynamodb", endpoint_url=self.endpoint_url, config=config))
        if query.create_table:
            self._ensure_table()

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def from_uri(cls, uri: str) -> DynamoDbMetaStore:
        """Open ``dynamodb://TABLE?...`` (driver, executors, CLI); see the module docstring."""
        parts, refuse = split_store_uri(uri, "dynamodb", DynamoDbUriQuery)
        table = parts.netloc
        if not table:
            raise refuse("no table name: use dynamodb://TABLE?region=...")
        if not _TABLE_NAME.match(table):
            raise refuse(f"table name {table!r} is not valid (3-255 characters of "
                         "A-Z a-z 0-9 _ . -)")
        if parts.path not in ("", "/") or parts.fragment:
            raise refuse("nothing may follow the table name but ?parameters")
        return cls(table, parse_query(parts.query, DynamoDbUriQuery, refuse))

    def _ensure_table(self) -> None:
        """``create_table=true``: create the table when missing, wait until active, and check
        that an existing table has our key schema."""
        try:
            description = self._call("DescribeTable", "describe_table", TableName=self.table)
        except MetaTableMissingError:
            try:
                self._call(
                    "CreateTable", "create_table", TableName=self.table,
                    BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[{"AttributeName": "ns", "AttributeType": "S"},
                                          {"AttributeName": "sk", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "ns", "KeyType": "HASH"},
                               {"AttributeName": "sk", "KeyType": "RANGE"}],
                )
                log.info("created meta table %s (%s)", self.table, self.uri)
            except MetaStoreRequestError as exc:
                if "ResourceInUseException" not in str(exc):  # another process created it
                    raise
            try:
                self._client.get_waiter("table_exists").wait(
                    TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 300})
            except botocore.exceptions.WaiterError as exc:
                raise TransientMetaStoreError(
                    detail=f"{self.uri}: table {self.table} did not become active: {exc}"
                ) from None
            description = self._call("DescribeTable", "describe_table", TableName=self.table)
        keys = {(k["AttributeName"], k["KeyType"]) for k in description["Table"]["KeySchema"]}
        if keys != {("ns", "HASH"), ("sk", "RANGE")}:
            raise MetaStoreUriError(
                uri=self.uri, reason=f"table {self.table} has key schema {sorted(keys)}, not "
                "ns (HASH) + sk (RANGE): it is not a tablestore-cdc meta table",
            )

    # --- request plumbing -----------------------------------------------------------------

    def _location(self) -> str:
        return f"endpoint {self.endpoint_url}" if self.endpoint_url else f"region {self.region}"

    def _call(self, operation: str, method: str, **kwargs: Any) -> Any:
        """One DynamoDB request; botocore retries transient failures itself (backoff with
        jitter). What still fails is mapped to our errors; a false condition raises
        ``ConditionFailed`` with the stored row when DynamoDB returned it."""
        self._check_open(operation)

        def refused(reason: str) -> MetaStoreRequestError:
            return MetaStoreRequestError(store=self.uri, operation=f"DynamoDB {operation}",
                                         reason=reason)

        try:
            return getattr(self._client, method)(**kwargs)
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            message = str(error.get("Message", "")) or str(exc)
            meta = exc.response.get("ResponseMetadata", {})
            status = int(meta.get("HTTPStatusCode") or 0)
            if code == "ConditionalCheckFailedException":
                item = exc.response.get("Item")
                raise ConditionFailed(_row(item) if item else None) from None
            if code == "ResourceNotFoundException":
                raise MetaTableMissingError(table=self.table, location=self._location()) from None
            if is_transient(code, status):
                raise TransientMetaStoreError(
                    detail=f"{self.uri}: DynamoDB {operation} failed with {code or status} after "
                    f"{int(meta.get('RetryAttempts') or 0) + 1} attempt(s): {message}",
                ) from None
            if code == "ValidationException" and ("key element does not match" in message
                                                  or "Missing the key" in message):
                message += (f" (table {self.table} must have key schema ns (HASH, string) + "
                            "sk (RANGE, string): is it another application's table?)")
            raise refused(f"{code}: {message}") from None
        except (botocore.exceptions.ConnectionError,
                botocore.exceptions.HTTPClientError) as exc:
            raise TransientMetaStoreError(
                detail=f"{self.uri}: DynamoDB {operation} could not reach {self._location()}: "
                f"{exc}",
            ) from None
        except botocore.exceptions.NoCredentialsError:
            raise refused(f"no AWS credentials found; provide them through "
                          f"{AWS_CREDENTIAL_CHAIN}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise refused(str(exc)) from None

    # --- rows: the primitives of meta_store.kv_layout -------------------------------------

    def _key(self, namespace: str, sk: str) -> dict[str, dict[str, str]]:
        return {"ns": _s(namespace), "sk": _s(sk)}

    def _item(self, namespace: str, sk: str, row: PlainRow) -> dict[str, Any]:
        return {**self._key(namespace, sk), **{k: _attribute(v) for k, v in row.items()}}

    def _get_row(self, operation: str, namespace: str, sk: str) -> PlainRow | None:
        response = self._call(operation, "get_item", TableName=self.table,
                              Key=self._key(namespace, sk), ConsistentRead=True)
        item = response.get("Item")
        return None if item is None else _row(item)

    def _rows(self, operation: str, namespace: str, prefix: str, *, keys_only: bool = False,
              state_rank: int | None = None) -> Iterator[PlainRow]:
        """All items of ``namespace`` whose sort key starts with ``prefix``, page by page
        (only batches with ``state_rank`` when given: filtered by the service, so the other
        rows' manifests are not transferred or decoded)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table, "ConsistentRead": True,
            "KeyConditionExpression": "ns = :ns AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":ns": _s(namespace), ":prefix": _s(prefix)},
        }
        if keys_only:
            kwargs["ProjectionExpression"] = "sk"
        if state_rank is not None:
            kwargs["FilterExpression"] = "state_rank = :rank"
            kwargs["ExpressionAttributeValues"][":rank"] = _n(state_rank)
        return map(_row, self._items(operation, "query", kwargs))

    def _items(self, operation: str, method: str, kwargs: dict[str, Any]
               ) -> Iterator[dict[str, Any]]:
        """The items of a paginated ``query`` or ``scan``, page after page."""
        if self.page_size:
            kwargs["Limit"] = self.page_size
        while True:
            page = self._call(operation, method, **kwargs)
            yield from page.get("Items", [])
            if not page.get("LastEvaluatedKey"):
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _put_row(self, operation: str, namespace: str, sk: str, row: PlainRow,
                 **condition: Any) -> None:
        self._call(operation, "put_item", TableName=self.table,
                   Item=self._item(namespace, sk, row), **condition)

    def _insert_row(self, operation: str, namespace: str, sk: str, row: PlainRow) -> None:
        self._put_row(operation, namespace, sk, row,
                      ConditionExpression="attribute_not_exists(sk)",
                      ReturnValuesOnConditionCheckFailure="ALL_OLD")

    def _replace_row_if(self, operation: str, namespace: str, sk: str, column: str,
                        expected: str, row: PlainRow) -> None:
        self._put_row(operation, namespace, sk, row, ConditionExpression="#c = :expected",
                      ExpressionAttributeNames={"#c": column},
                      ExpressionAttributeValues={":expected": _s(expected)})

    # --- writes that change a batch row ---------------------------------------------------

    def _set_manifest_if_absent(
        self, namespace: str, uuid: str, manifest: Manifest
    ) -> BatchRecord:
        ((_, encoded),) = self._manifest_cells(uuid, manifest).items()
        values = {":m": _attribute(encoded)}
        # the usual case: a minted row becomes planned with its manifest, in one write
        stored = self._update_manifest(
            namespace, uuid, "SET manifest = :m, #state = :planned, state_rank = :rank",
            {**values, ":planned": _s(BatchState.PLANNED.value),
             ":rank": _n(BatchState.PLANNED.rank), ":minted": _n(BatchState.MINTED.rank)},
            " AND state_rank = :minted", {"#state": "state"})
        if stored is not None and "manifest" not in stored:
            # a row already past minted without a manifest: set the manifest alone
            stored = self._update_manifest(namespace, uuid, "SET manifest = :m", values)
        if stored is None:
            raise UnknownBatchError(uuid=uuid, namespace=namespace)
        return self._decode_batch(namespace, stored)

    def _update_manifest(self, namespace: str, uuid: str, update: str, values: dict[str, Any],
                         condition: str = "", names: dict[str, str] | None = None
                         ) -> PlainRow | None:
        """One ``UpdateItem`` of the batch row, conditioned on its having no manifest yet: the
        row as written, or as stored when the condition failed (None: there is no row)."""
        try:
            response = self._call(
                "put_manifest", "update_item", TableName=self.table,
                Key=self._key(namespace, batch_sk(uuid)), UpdateExpression=update,
                ConditionExpression="attribute_exists(sk) AND attribute_not_exists(manifest)"
                + condition, ExpressionAttributeValues=values,
                **({"ExpressionAttributeNames": names} if names else {}),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
            return _row(response["Attributes"])
        except ConditionFailed as failed:
            return failed.row or self._get_row("put_manifest", namespace, batch_sk(uuid))

    def _advance_state(
        self, namespace: str, uuid: str, state: BatchState, at: float,
        spark_batch_id: int | None = None,
    ) -> None:
        once = {name: value for name, value in (  # each set the first time only
            ("committed_at", at if state.rank >= BatchState.COMMITTED.rank else None),
            ("pushed_at", at if state is BatchState.PUSHED else None),
            ("spark_batch_id", spark_batch_id)) if value is not None}
        sets = ["#state = :state", "state_rank = :rank",
                *(f"{name} = if_not_exists({name}, :{name})" for name in once)]
        values = {":state": _s(state.value), ":rank": _n(state.rank),
                  **{f":{name}": _n(value) for name, value in once.items()}}
        if state is BatchState.COMMITTED:  # indexed before it is committed: a superset
            self._update_pending(namespace, "ADD", [uuid])
        try:
            self._call(
                f"mark {state.value}", "update_item", TableName=self.table,
                Key=self._key(namespace, batch_sk(uuid)),
                UpdateExpression="SET " + ", ".join(sets),
                ConditionExpression="attribute_exists(sk) AND state_rank < :rank",
                ExpressionAttributeNames={"#state": "state"}, ExpressionAttributeValues=values,
            )
        except ConditionFailed:
            pass  # missing, or already at or past ``state``: never backward
        if state is BatchState.PUSHED:  # leaves the index only once it is pushed
            self._update_pending(namespace, "DELETE", [uuid])

    # --- the committed-not-pushed index ---------------------------------------------------

    def _update_pending(self, namespace: str, action: str, uuids: Sequence[str],
                        seeded: bool = False) -> None:
        """ADD ``uuids`` to, or DELETE them from, the namespace's committed-not-pushed set
        (idempotent both ways); ``seeded`` also marks the set as complete."""
        expression = f"{action} uuids :u" if uuids else ""
        values: dict[str, Any] = {":u": {"SS": list(dict.fromkeys(uuids))}} if uuids else {}
        if seeded:
            expression = f"SET seeded = :t {expression}".strip()
            values[":t"] = {"BOOL": True}
        if not expression:
            return
        self._call("committed_not_pushed index", "update_item", TableName=self.table,
                   Key=self._key(namespace, PENDING_SK), UpdateExpression=expression,
                   ExpressionAttributeValues=values)

    def _batch_get(self, operation: str, namespace: str,
                   sort_keys: Sequence[str]) -> list[PlainRow]:
        """The rows of ``sort_keys`` that exist (strongly consistent ``BatchGetItem``s)."""
        found: list[PlainRow] = []
        keys = [self._key(namespace, sk) for sk in dict.fromkeys(sort_keys)]
        for i in range(0, len(keys), _BATCH_GET_MAX):
            request: dict[str, Any] = {self.table: {"Keys": keys[i:i + _BATCH_GET_MAX],
                                                    "ConsistentRead": True}}
            for attempt in range(_UNPROCESSED_ROUNDS + 1):
                response = self._call(operation, "batch_get_item", RequestItems=request)
                found += map(_row, response.get("Responses", {}).get(self.table, []))
                request = response.get("UnprocessedKeys") or {}
                if not request:
                    break
                if attempt == _UNPROCESSED_ROUNDS:
                    raise TransientMetaStoreError(
                        detail=f"{self.uri}: DynamoDB {operation} left keys unprocessed after "
                        f"{_UNPROCESSED_ROUNDS} rounds")
                backoff(attempt)
        return found

    def _list_batches_in_state(self, namespace: str, state: BatchState) -> list[BatchRecord]:
        if state is not BatchState.COMMITTED:
            return [self._decode_batch(namespace, row) for row in
                    self._rows("list_batches", namespace, BATCH_PREFIX, state_rank=state.rank)]
        # the index item and the batches it names: not every batch row of the namespace
        index = self._get_row("committed_not_pushed", namespace, PENDING_SK) or {}
        if index.get("seeded") is not True:
            # a table from before the index: list once, then the index is complete (batches
            # committed from now on add themselves before they are marked)
            batches = [self._decode_batch(namespace, row) for row in
                       self._rows("list_batches", namespace, BATCH_PREFIX, state_rank=state.rank)]
            self._update_pending(namespace, "ADD", [b.uuid for b in batches], seeded=True)
            return batches
        named = sorted(index.get("uuids", []))
        rows = self._batch_get("committed_not_pushed", namespace, [batch_sk(u) for u in named])
        batches = [self._decode_batch(namespace, row) for row in rows]
        stale = set(named) - {b.uuid for b in batches if b.state is BatchState.COMMITTED}
        if stale:  # pushed (a crash before its removal) or deleted: drop from the index
            self._update_pending(namespace, "DELETE", sorted(stale))
        return sorted((b for b in batches if b.state is BatchState.COMMITTED),
                      key=lambda b: (b.created_at, b.uuid))

    # --- deletes and the namespace listing ------------------------------------------------

    def _delete_some(self, namespace: str, sort_keys: Sequence[str]) -> list[str]:
        """One ``BatchWriteItem``; DynamoDB may accept part of it (throttled) and name the
        rest in ``UnprocessedItems``."""
        response = self._call("gc", "batch_write_item", RequestItems={self.table: [
            {"DeleteRequest": {"Key": self._key(namespace, sk)}} for sk in sort_keys]})
        return [request["DeleteRequest"]["Key"]["sk"]["S"]
                for request in response.get("UnprocessedItems", {}).get(self.table, [])]

    def list_namespaces(self) -> list[str]:
        """Namespaces that have a description (``set_namespace_info``), sorted: a paginated
        Scan filtered on ``sk = "N#info"``. CLI, read-only; it reads the whole table."""
        items = self._items("list_namespaces", "scan", {
            "TableName": self.table, "ConsistentRead": True, "ProjectionExpression": "ns",
            "FilterExpression": "sk = :info", "ExpressionAttributeValues": {":info": _s(INFO_SK)},
        })
        # a key of another type (a foreign table): its typed value, refused as not text
        return self._sorted_namespaces(item["ns"].get("S", item["ns"]) for item in items)

    def _close_client(self) -> None:
        self._client.close()
