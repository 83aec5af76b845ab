"""Tablestore meta store: the meta table in an Alibaba Tablestore table (or the emulator).

Needs the ``tablestore`` SDK: ``pip install 'tablestore-cdc[tablestore]'``. All requests go
through the SDK's ``OTSClient`` (signing, response validation, its retry policy).

URI: ``tablestore://INSTANCE/TABLE?endpoint=https://INSTANCE.REGION.ots.aliyuncs.com`` (the
local emulator: ``endpoint=http://127.0.0.1:PORT``) with these query parameters (anything else
is refused, naming what is allowed):

- ``endpoint`` (required): ``http(s)://host[:port]``, no path, no credentials;
- ``create_table`` (``true``/``false``, default false): create a missing table (and check an
  existing one has our key); without it a missing table raises ``MetaTableMissingError``;
- ``max_attempts`` (default 8): total attempts of a request, the first included; the SDK
  retries throttling and server errors (every write here is safe to retry), this module
  retries what it does not: network errors (refused, reset, truncated, timed out), a 5xx
  whose body is no service error (a load balancer's page) and an answer that fails the SDK's
  checks (MD5, signature: never used), all with jittered exponential backoff;
- ``socket_timeout`` (seconds, default 20);
- ``page_size``: the ``limit`` of each GetRange page (default: the service's pages, at most
  5000 rows or 4 MB).

Credentials: ``access_key_id`` / ``access_key_secret`` / ``security_token`` keyword arguments
of ``from_uri`` or the constructor (the source's options), else the environment variables
``ALIBABA_CLOUD_ACCESS_KEY_ID``, ``ALIBABA_CLOUD_ACCESS_KEY_SECRET`` and the optional
``ALIBABA_CLOUD_SECURITY_TOKEN`` (STS). A URI that carries credentials (``user:secret@``,
``access_key_secret=``, ``token=``...) is refused with ``MetaStoreUriError`` whose message hides
the values: the URI travels in Spark options, plans and logs. ``.uri``/``repr`` show only the
parameters above.

Who opens it: the driver's planning process, each executor inside ``read()`` (single-row
requests), the inspection CLI and the dashboard. Opening makes no request unless
``create_table=true`` (then DescribeTable, and CreateTable when missing).

Layout: primary key ``ns`` (STRING, the namespace) + ``sk`` (STRING), rows as described in
``meta_store.kv_layout`` (shared with the DynamoDB backend). Here a manifest whose JSON is over
``MAX_COLUMN_BYTES`` is the binary column ``manifest_z`` (zlib-compressed), and every batch row
has a ``version`` column for the optimistic updates below.

Service limits respected: a column value is at most 2 MB (``MAX_COLUMN_BYTES`` keeps a margin;
a manifest still larger after compression raises ``MetaStoreRequestError``), a primary-key
string at most 1 KB (namespace and sort key are checked), a BatchWriteRow at most 200 rows
(deletes are sent in chunks of 200), a GetRange page at most 5000 rows / 4 MB (followed with
``next_start_primary_key``).

Atomicity: put-if-absent is PutRow with ``EXPECT_NOT_EXIST``; every change of a batch row is an
UpdateRow conditioned on ``version`` being the one just read (optimistic concurrency: the
manifest is set once, a state only moves forward, ``committed_at``/``pushed_at`` are set once).
Reads are strongly consistent (as Tablestore's always are).
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from tablestore import (
    INF_MAX,
    INF_MIN,
    BatchWriteRowRequest,
    CapacityUnit,
    ComparatorType,
    Condition,
    DeleteRowItem,
    OTSClient,
    OTSClientError,
    OTSServiceError,
    ReservedThroughput,
    Row,
    RowExistenceExpectation,
    SingleColumnCondition,
    TableInBatchWriteRowItem,
    TableMeta,
    TableOptions,
)
from tablestore.retry import WriteRetryPolicy

from meta_store.base import BatchRecord, BatchState, Manifest
from meta_store.errors import (
    MetaStoreRequestError,
    MetaStoreUriError,
    MetaTableMissingError,
    TransientMetaStoreError,
    UnknownBatchError,
)
from meta_store.kv_layout import (
    INFO_SK,
    ConditionFailed,
    KeyValueMetaStore,
    ManifestStorage,
    PlainRow,
    batch_sk,
)

log = logging.getLogger(__name__)

#: Largest column value written (the service's limit is 2 MB).
MAX_COLUMN_BYTES = 2_000_000
#: Largest primary-key string (the service's limit is 1 KB).
MAX_KEY_BYTES = 1024
#: Rows per BatchWriteRow (the service's limit).
BATCH_WRITE_MAX = 200
#: The environment variables credentials come from when not passed in.
ENV_ACCESS_KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
ENV_ACCESS_KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
ENV_SECURITY_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"
#: The SDK's logger: it logs every service error (expected ones too, such as a lost race).
SDK_LOGGER = "meta_store.tablestore.sdk"

_PARAMS = ("endpoint", "create_table", "max_attempts", "socket_timeout", "page_size")
_SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|access_key|key_id|"
                         r"session|signature|auth", re.IGNORECASE)
_INSTANCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,63}$")
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
_KEY_SCHEMA = [("ns", "STRING"), ("sk", "STRING")]
_TRANSIENT_CODES = frozenset({
    "OTSRowOperationConflict", "OTSNotEnoughCapacityUnit", "OTSTableNotReady",
    "OTSPartitionUnavailable", "OTSServerBusy", "OTSOperationConflict", "OTSOperationThrottled",
    "OTSQuotaExhausted", "OTSTimeout", "OTSInternalServerError", "OTSServerUnavailable",
    "OTSCapacityUnitExhausted",
})
_OPTIMISTIC_ROUNDS = 20
#: how the SDK's message for an error status without a service error body begins
_SDK_BARE_ERROR = "HTTP status:"


class _RetryPolicy(WriteRetryPolicy):  # type: ignore[misc]
    """The SDK's policy for reads and writes alike (all our writes are safe to repeat), with
    ``max_attempts`` total attempts."""

    def __init__(self, max_attempts: int) -> None:
        self.max_retry_times = max_attempts - 1


def _redact(uri: str) -> str:
    """The URI for messages: no userinfo, values of unknown parameters hidden."""
    def strip_userinfo(url: str) -> str:
        netloc = urlsplit(url).netloc
        return url.replace(netloc, netloc.rpartition("@")[2], 1) if "@" in netloc else url

    try:
        base, _, rest = uri.partition("?")
        query = [(k, strip_userinfo(v) if k == "endpoint" else v if k in _PARAMS else "***")
                 for k, v in parse_qsl(rest.partition("#")[0], keep_blank_values=True)]
        base = strip_userinfo(base)
        return f"{base}?{urlencode(query, safe='*/:')}" if query else base
    except ValueError:
        return "tablestore://<unparseable URI>"


def _prefix_end(prefix: str) -> str:
    """The smallest string above every string starting with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _columns(row: PlainRow) -> list[tuple[str, Any]]:
    """A row's values (``meta_store.kv_layout``) as the SDK's columns (binary: bytearray)."""
    return [(name, bytearray(v) if isinstance(v, bytes) else v) for name, v in row.items()]


def _row(sk: str, row: Any) -> PlainRow:
    """An SDK row as a row of ``meta_store.kv_layout`` (binary as bytes)."""
    return {"sk": sk, **{name: bytes(v) if isinstance(v, bytearray) else v
                         for name, v, *_ in row.attribute_columns}}


class TablestoreMetaStore(KeyValueMetaStore):
    """A meta table in one Tablestore table (see the module docstring for URI, layout,
    atomicity). Open with ``from_uri`` or ``meta_store.open_meta_store``; one instance per
    process (the ``OTSClient`` inside is thread-safe)."""

    manifest_storage = ManifestStorage(
        compress_over=MAX_COLUMN_BYTES, max_bytes=MAX_COLUMN_BYTES,
        compressed_column="manifest_z", limit="a Tablestore column holds at most 2 MB")
    cell = "column"
    new_batch_columns = {"version": 0}
    max_deletes_per_request = BATCH_WRITE_MAX

    def __init__(
        self,
        instance: str,
        table: str,
        *,
        endpoint: str,
        create_table: bool = False,
        max_attempts: int = 8,
        socket_timeout: float = 20.0,
        page_size: int | None = None,
        access_key_id: str | None = None,
        access_key_secret: str | None = None,
        security_token: str | None = None,
        uri: str | None = None,
    ) -> None:
        given = {"endpoint": endpoint, "create_table": "true" if create_table else None,
                 "max_attempts": max_attempts if max_attempts != 8 else None,
                 "socket_timeout": socket_timeout if socket_timeout != 20.0 else None,
                 "page_size": page_size}
        query = urlencode({k: v for k, v in given.items() if v is not None}, safe="/:")
        self.uri = uri or f"tablestore://{instance}/{table}?{query}"
        self.instance, self.table, self.endpoint = instance, table, endpoint
        self.page_size = page_size
        self.max_attempts = self.delete_rounds = max_attempts
        key_id = access_key_id or os.environ.get(ENV_ACCESS_KEY_ID)
        secret = access_key_secret or os.environ.get(ENV_ACCESS_KEY_SECRET)
        token = security_token or os.environ.get(ENV_SECURITY_TOKEN) or None
        if not key_id or not secret:
            raise MetaStoreRequestError(
                store=self.uri, operation="open",
                reason=f"no Tablestore credentials: set {ENV_ACCESS_KEY_ID} and "
                f"{ENV_ACCESS_KEY_SECRET} (and {ENV_SECURITY_TOKEN} for STS), or pass them "
                "in the source's options",
            )
        sdk_log = logging.getLogger(SDK_LOGGER)
        if sdk_log.level == logging.NOTSET:
            sdk_log.setLevel(logging.CRITICAL)  # our typed errors carry what it would log
        try:
            self._client = OTSClient(
                endpoint, key_id, secret, instance, sts_token=token,
                socket_timeout=socket_timeout, retry_policy=_RetryPolicy(max_attempts),
                logger_name=SDK_LOGGER,
            )
        except OTSClientError as exc:
            raise MetaStoreUriError(uri=self.uri, reason=str(exc)) from None
        self._closed = False
        if create_table:
            self._ensure_table()

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def from_uri(
        cls,
        uri: str,
        *,
        access_key_id: str | None = None,
        access_key_secret: str | None = None,
        security_token: str | None = None,
    ) -> TablestoreMetaStore:
        """Open ``tablestore://INSTANCE/TABLE?endpoint=...`` (driver, executors, CLI);
        credentials as keyword arguments or from the environment (module docstring)."""
        shown = _redact(uri)
        try:
            parts = urlsplit(uri)
        except ValueError as exc:
            raise MetaStoreUriError(uri=shown, reason=str(exc)) from None
        if parts.scheme != "tablestore":
            raise MetaStoreUriError(uri=shown, reason="not a tablestore:// URI")
        if "@" in parts.netloc:
            raise MetaStoreUriError(
                uri=shown, reason="credentials are not accepted in the URI; set "
                f"{ENV_ACCESS_KEY_ID}/{ENV_ACCESS_KEY_SECRET} or pass them in the source's "
                "options",
            )
        instance, table = parts.netloc, parts.path.removeprefix("/")
        if not instance or not table:
            raise MetaStoreUriError(
                uri=shown, reason="use tablestore://INSTANCE/TABLE?endpoint=https://...",
            )
        if not _INSTANCE_NAME.match(instance):
            raise MetaStoreUriError(
                uri=shown, reason=f"instance name {instance!r} is not valid (a letter, then "
                "letters, digits or -)",
            )
        if not _TABLE_NAME.match(table):
            raise MetaStoreUriError(
                uri=shown, reason=f"table name {table!r} is not valid (a letter or _, then up "
                "to 254 letters, digits or _)",
            )
        if parts.fragment:
            raise MetaStoreUriError(uri=shown, reason="a URI fragment (#...) is not allowed")
        raw: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if _SECRET_KEY.search(key) and key not in _PARAMS:
                raise MetaStoreUriError(
                    uri=shown, reason=f"parameter {key!r} looks like a credential; credentials "
                    "are not accepted in the URI (it is shown in logs and Spark plans); set "
                    f"{ENV_ACCESS_KEY_ID}/{ENV_ACCESS_KEY_SECRET} or use the source's options",
                )
            if key not in _PARAMS:
                raise MetaStoreUriError(
                    uri=shown, reason=f"unknown parameter {key!r}; allowed: " + ", ".join(_PARAMS),
                )
            if key in raw:
                raise MetaStoreUriError(uri=shown, reason=f"parameter {key!r} given twice")
            if not value:
                raise MetaStoreUriError(uri=shown, reason=f"parameter {key!r} is empty")
            raw[key] = value
        if "endpoint" not in raw:
            raise MetaStoreUriError(
                uri=shown, reason="parameter 'endpoint' is required, e.g. "
                "endpoint=https://INSTANCE.cn-hangzhou.ots.aliyuncs.com",
            )
        endpoint = urlsplit(raw["endpoint"])
        if (endpoint.scheme not in ("http", "https") or not endpoint.hostname
                or endpoint.path not in ("", "/") or endpoint.query):
            raise MetaStoreUriError(
                uri=shown, reason=f"endpoint must be http(s)://host[:port], got "
                f"{raw['endpoint']!r}",
            )
        if "@" in endpoint.netloc:
            raise MetaStoreUriError(
                uri=shown, reason="credentials are not accepted in endpoint; set "
                f"{ENV_ACCESS_KEY_ID}/{ENV_ACCESS_KEY_SECRET}",
            )
        options: dict[str, Any] = {"endpoint": raw["endpoint"].rstrip("/")}
        if "create_table" in raw:
            flag = raw["create_table"].lower()
            if flag not in ("true", "false"):
                raise MetaStoreUriError(
                    uri=shown, reason=f"create_table must be true or false, got "
                    f"{raw['create_table']!r}",
                )
            options["create_table"] = flag == "true"
        for key, low, high, kind in (("max_attempts", 1, 50, int), ("page_size", 1, 5000, int),
                                     ("socket_timeout", 0.001, 600.0, float)):
            if key not in raw:
                continue
            try:
                number = kind(raw[key])
            except ValueError:
                number = None
            if number is None or not low <= number <= high:
                raise MetaStoreUriError(
                    uri=shown, reason=f"{key} must be a{'n integer' if kind is int else ' number'}"
                    f" from {low} to {high}, got {raw[key]!r}",
                )
            options[key] = number
        return cls(instance, table, access_key_id=access_key_id,
                   access_key_secret=access_key_secret, security_token=security_token,
                   **options)

    def _ensure_table(self) -> None:
        """``create_table=true``: create the table when missing; check an existing table's key."""
        try:
            described = self._call("DescribeTable", self._client.describe_table, self.table)
        except MetaTableMissingError:
            try:
                self._call(
                    "CreateTable", self._client.create_table,
                    TableMeta(self.table, list(_KEY_SCHEMA)),
                    TableOptions(time_to_live=-1, max_version=1),
                    ReservedThroughput(CapacityUnit(0, 0)),
                )
                log.info("created meta table %s (%s)", self.table, self.uri)
            except MetaStoreRequestError as exc:
                if "OTSObjectAlreadyExist" not in str(exc):  # another process created it
                    raise
            described = self._call("DescribeTable", self._client.describe_table, self.table)
        keys = [tuple(k[:2]) for k in described.table_meta.schema_of_primary_key]
        if keys != _KEY_SCHEMA:
            raise MetaStoreUriError(
                uri=self.uri, reason=f"table {self.table} has primary key {keys}, not "
                f"{_KEY_SCHEMA}: it is not a tablestore-cdc meta table",
            )

    # --- request plumbing -----------------------------------------------------------------

    @property
    def client(self) -> OTSClient:
        """The SDK client (for operators and tests)."""
        return self._client

    def _call(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One SDK call, mapped to our errors. The SDK retries service errors itself (its
        policy, ``max_attempts``); network errors, which it does not retry, are retried here.
        A false row condition raises ``ConditionFailed``."""
        if self._closed:
            raise MetaStoreRequestError(store=self.uri, operation=operation,
                                        reason="the store is closed")
        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn(*args, **kwargs)
            except OTSServiceError as exc:
                code, status = exc.get_error_code(), exc.get_http_status()
                if code == "OTSConditionCheckFail":
                    raise ConditionFailed() from None
                if code == "OTSObjectNotExist":
                    raise MetaTableMissingError(
                        table=self.table, location=f"instance {self.instance} at {self.endpoint}"
                    ) from None
                if code in _TRANSIENT_CODES or (status or 0) >= 500:
                    raise TransientMetaStoreError(
                        detail=f"{self.uri}: Tablestore {operation} failed with {code} "
                        f"(HTTP {status}): {exc.get_error_message()}",
                    ) from None
                raise MetaStoreRequestError(
                    store=self.uri, operation=f"Tablestore {operation}",
                    reason=f"{code} (HTTP {status}): {exc.get_error_message()}",
                ) from None
            except OTSClientError as exc:
                status = exc.get_http_status()
                if status is None:  # raised before sending: a bad argument, not transient
                    raise MetaStoreRequestError(
                        store=self.uri, operation=f"Tablestore {operation}", reason=str(exc),
                    ) from None
                if str(exc).startswith(_SDK_BARE_ERROR):
                    # an error status whose body is no service error: a 5xx of that kind is
                    # what a load balancer or proxy sends, and the SDK does not retry it; the
                    # service may not have seen the request. Any other is a real refusal.
                    if status < 500:
                        raise MetaStoreRequestError(
                            store=self.uri, operation=f"Tablestore {operation}",
                            reason=str(exc)) from None
                    if attempt == self.max_attempts:
                        raise TransientMetaStoreError(
                            detail=f"{self.uri}: Tablestore {operation} failed at "
                            f"{self.endpoint} after {attempt} attempt(s): {exc}",
                        ) from None
                elif attempt == self.max_attempts:
                    # the answer failed the SDK's checks (MD5, signature, headers, date): it is
                    # never used; the request may have taken effect, and every write is safe
                    # to repeat, so it is sent again; always failing is not transient
                    raise MetaStoreRequestError(
                        store=self.uri, operation=f"Tablestore {operation}",
                        reason=f"every answer from {self.endpoint} failed validation "
                        f"({attempt} attempt(s)): {exc}",
                    ) from None
                time.sleep(random.uniform(0, min(2.0, 0.05 * 2 ** attempt)))
            except Exception as exc:  # urllib3/socket errors: the request may not have arrived
                if attempt == self.max_attempts:
                    raise TransientMetaStoreError(
                        detail=f"{self.uri}: Tablestore {operation} could not reach "
                        f"{self.endpoint} after {attempt} attempt(s): {exc}",
                    ) from None
                time.sleep(random.uniform(0, min(2.0, 0.05 * 2 ** attempt)))
        raise AssertionError("unreachable")  # pragma: no cover

    # --- rows: the primitives of meta_store.kv_layout -------------------------------------

    def _pk(self, namespace: str, sk: str) -> list[tuple[str, str]]:
        for what, value in (("namespace", namespace), ("key", sk)):
            if len(value.encode()) > MAX_KEY_BYTES:
                raise MetaStoreRequestError(
                    store=self.uri, operation="key",
                    reason=f"{what} {value[:60]!r}... is over Tablestore's {MAX_KEY_BYTES}-byte "
                    "primary-key limit",
                )
        return [("ns", namespace), ("sk", sk)]

    def _get_row(self, operation: str, namespace: str, sk: str) -> PlainRow | None:
        _, row, _ = self._call(operation, self._client.get_row, self.table,
                               self._pk(namespace, sk), max_version=1)
        return None if row is None else _row(sk, row)

    def _rows(self, operation: str, namespace: str, prefix: str, *,
              keys_only: bool = False) -> Iterator[PlainRow]:
        start: Any = self._pk(namespace, prefix)
        end = self._pk(namespace, _prefix_end(prefix))
        while start is not None:
            _, start, rows, _ = self._call(
                operation, self._client.get_range, self.table, "FORWARD", start, end,
                columns_to_get=["doc"] if keys_only else None, limit=self.page_size,
                max_version=1,
            )
            for row in rows:
                yield _row(dict(row.primary_key)["sk"], row)

    def _insert_row(self, operation: str, namespace: str, sk: str, row: PlainRow) -> None:
        self._call(operation, self._client.put_row, self.table,
                   Row(self._pk(namespace, sk), _columns(row)),
                   Condition(RowExistenceExpectation.EXPECT_NOT_EXIST))

    def _put_row(self, operation: str, namespace: str, sk: str, row: PlainRow) -> None:
        self._call(operation, self._client.put_row, self.table,
                   Row(self._pk(namespace, sk), _columns(row)),
                   Condition(RowExistenceExpectation.IGNORE))

    # --- writes that change a batch row: optimistic, on its version -----------------------

    def _read_batch(self, operation: str, namespace: str, uuid: str
                    ) -> tuple[BatchRecord, int] | None:
        """The batch and its row's ``version``, or None."""
        row = self._get_row(operation, namespace, batch_sk(uuid))
        if row is None:
            return None
        batch = self._decode_batch(namespace, row)
        try:
            return batch, int(row.get("version", 0))
        except (ValueError, TypeError) as exc:
            raise self._corrupt(f"{namespace}/{row['sk']}", f"version: {exc}") from None

    def _update_if_version(self, operation: str, namespace: str, uuid: str, version: int,
                           row: PlainRow) -> bool:
        """UpdateRow conditioned on the row's ``version``; False when another writer won."""
        condition = Condition(
            RowExistenceExpectation.EXPECT_EXIST,
            SingleColumnCondition("version", version, ComparatorType.EQUAL,
                                  pass_if_missing=False),
        )
        try:
            self._call(operation, self._client.update_row, self.table,
                       Row(self._pk(namespace, batch_sk(uuid)),
                           {"put": [*_columns(row), ("version", version + 1)]}),
                       condition)
            return True
        except ConditionFailed:
            return False

    def _set_manifest_if_absent(
        self, namespace: str, uuid: str, manifest: Manifest
    ) -> BatchRecord:
        encoded = self._manifest_cells(uuid, manifest)
        for _ in range(_OPTIMISTIC_ROUNDS):
            read = self._read_batch("put_manifest", namespace, uuid)
            if read is None:
                raise UnknownBatchError(uuid=uuid, namespace=namespace)
            batch, version = read
            if batch.manifest is not None:
                return batch
            changes = dict(encoded)
            updated = batch.model_copy(update={"manifest": manifest})
            if batch.state is BatchState.MINTED:
                changes |= {"state": BatchState.PLANNED.value,
                            "state_rank": BatchState.PLANNED.rank}
                updated = updated.model_copy(update={"state": BatchState.PLANNED})
            if self._update_if_version("put_manifest", namespace, uuid, version, changes):
                return updated
        raise TransientMetaStoreError(
            detail=f"{self.uri}: batch {uuid!r}: the manifest write lost "
            f"{_OPTIMISTIC_ROUNDS} races in a row")

    def _advance_state(
        self, namespace: str, uuid: str, state: BatchState, at: float,
        spark_batch_id: int | None = None,
    ) -> None:
        for _ in range(_OPTIMISTIC_ROUNDS):
            read = self._read_batch(f"mark {state.value}", namespace, uuid)
            if read is None:
                return  # missing: no-op
            batch, version = read
            if batch.state.rank >= state.rank:
                return  # never backward
            changes: PlainRow = {"state": state.value, "state_rank": state.rank}
            if state.rank >= BatchState.COMMITTED.rank and batch.committed_at is None:
                changes["committed_at"] = float(at)
            if state is BatchState.PUSHED and batch.pushed_at is None:
                changes["pushed_at"] = float(at)
            if spark_batch_id is not None and batch.spark_batch_id is None:
                changes["spark_batch_id"] = spark_batch_id
            if self._update_if_version(f"mark {state.value}", namespace, uuid, version, changes):
                return
        raise TransientMetaStoreError(
            detail=f"{self.uri}: batch {uuid!r}: marking it {state.value} lost "
            f"{_OPTIMISTIC_ROUNDS} races in a row")

    # --- deletes and the namespace listing ------------------------------------------------

    def _delete_some(self, namespace: str, sort_keys: Sequence[str]) -> list[str]:
        """One BatchWriteRow; it succeeds row by row, and names the rows that failed."""
        request = BatchWriteRowRequest()
        request.add(TableInBatchWriteRowItem(self.table, [
            DeleteRowItem(Row(self._pk(namespace, sk)), Condition(RowExistenceExpectation.IGNORE))
            for sk in sort_keys]))
        _, failed = self._call("gc", self._client.batch_write_row, request).get_delete()
        return [sort_keys[f.index] for f in failed]

    def list_namespaces(self) -> list[str]:
        """Namespaces that have a description (``set_namespace_info``), sorted. CLI,
        read-only; it reads the whole table (only its ``info`` column)."""
        start: Any = [("ns", INF_MIN), ("sk", INF_MIN)]
        end = [("ns", INF_MAX), ("sk", INF_MAX)]
        found: set[str] = set()
        while start is not None:
            _, start, rows, _ = self._call(
                "list_namespaces", self._client.get_range, self.table, "FORWARD", start, end,
                columns_to_get=["info"], limit=self.page_size, max_version=1,
            )
            for row in rows:
                pk = dict(row.primary_key)
                if pk.get("sk") == INFO_SK:
                    found.add(pk["ns"])
        return sorted(found)

    def close(self) -> None:
        """Close the client's connection pool (idempotent)."""
        if not self._closed:
            self._closed = True
            try:
                self._client.connection.pool.clear()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
