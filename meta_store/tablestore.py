"""Tablestore meta store: the meta table in an Alibaba Tablestore table (or the emulator).

Needs the ``tablestore`` SDK: ``pip install 'tablestore-cdc[tablestore]'``. All requests go
through the SDK's ``OTSClient`` (signing, response validation, its retry policy).

URI: ``tablestore://INSTANCE/TABLE?endpoint=https://INSTANCE.REGION.ots.aliyuncs.com`` (the
local emulator: ``endpoint=http://127.0.0.1:PORT``); its parameters (``TablestoreUriQuery``)
are described in docs/tablestore-meta.md. The SDK retries throttling and server errors (every
write here is safe to retry); ``_call`` retries what it does not. The SDK takes no CA bundle,
so its connection pool is rebuilt with ``ca_bundle``'s (``_trust_ca``); a certificate that
does not verify is a ``MetaStoreRequestError`` at once (``cdc_common.tls``).

Credentials: the source's options (keyword arguments of ``from_uri``), else the
``ALIBABA_CLOUD_*`` environment (``cdc_common.credentials``); never in the URI, which travels
in Spark options, plans and logs (``cdc_common.uris`` refuses them and hides the values).

Who opens it: the driver's planning process, each executor inside ``read()`` (single-row
requests), the inspection CLI and the dashboard. Opening makes no request unless
``create_table=true`` (then DescribeTable, and CreateTable when missing).

Layout: primary key ``ns`` + ``sk`` (STRING), rows as in ``meta_store.kv_layout``; here a
compressed manifest is the column ``manifest_z``, and batch rows have a ``version``.

Service limits respected (docs/tablestore-meta.md): a column of 2 MB (``MAX_COLUMN_BYTES``), a
key of 1 KB (``MAX_KEY_BYTES``), 200 rows per BatchWriteRow, GetRange pages (followed).

Atomicity: put-if-absent is PutRow with ``EXPECT_NOT_EXIST``; every change of a batch row is an
UpdateRow conditioned on ``version`` being the one just read (optimistic concurrency: the
manifest is set once, a state only moves forward, ``committed_at``/``pushed_at`` are set once).
Reads are strongly consistent (as Tablestore's always are).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from pydantic import Field
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

from cdc_common import tls
from cdc_common.credentials import (
    ALIBABA_ACCESS_KEY_ID,
    ALIBABA_ACCESS_KEY_SECRET,
    ALIBABA_SECURITY_TOKEN,
    alibaba_credentials,
)
from cdc_common.first_contact import at_query_start, unreachable_problem
from cdc_common.uris import (
    TABLESTORE_INSTANCE,
    HttpOrigin,
    UriBool,
    UriQuery,
    parse_query,
)
from meta_store import query_text, split_store_uri
from meta_store.base import (
    BatchRecord,
    BatchState,
    Manifest,
    first_times,
    with_manifest,
)
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
    backoff,
    batch_sk,
)

log = logging.getLogger(__name__)

#: Largest column value written (the service's limit is 2 MB).
MAX_COLUMN_BYTES = 2_000_000
#: Largest primary-key string (the service's limit is 1 KB).
MAX_KEY_BYTES = 1024
#: Rows per BatchWriteRow (the service's limit).
BATCH_WRITE_MAX = 200
#: The SDK's logger: it logs every service error (expected ones too, such as a lost race).
SDK_LOGGER = "meta_store.tablestore.sdk"

#: where credentials come from instead of the URI
_CREDENTIALS = (f"set {ALIBABA_ACCESS_KEY_ID}/{ALIBABA_ACCESS_KEY_SECRET} or pass them in the "
                "source's options")
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
#: the service refused the credentials: a configuration error, named with what to fix
_AUTH_CODES = frozenset({"OTSAuthFailed", "OTSPermissionDenied"})


def _credentials_hint(code: str) -> str:
    """What to fix when the meta store's credentials are refused: they are the source's own
    options (or the environment), and a meta table in another instance needs a key valid
    there."""
    keys = (f"access.key.id / access.key.secret (or {ALIBABA_ACCESS_KEY_ID} / "
            f"{ALIBABA_ACCESS_KEY_SECRET})")
    if code == "OTSPermissionDenied":
        return f"the meta store's key lacks a permission on its table: grant it or change {keys}"
    return (f"the meta store's credentials were refused: it uses the source's {keys} and "
            f"{ALIBABA_SECURITY_TOKEN} for STS; check them for the meta table's instance")


def _trust_ca(client: OTSClient, bundle: str) -> None:
    """Make the SDK's connections verify the server with ``bundle``. The SDK (6.4) builds its
    urllib3 pool with certifi's CAs and takes no CA option, so the pool
    (``OTSClient.connection.pool``) is rebuilt with the SDK's own settings and this bundle.
    The SDK is pinned to 6.4.x; tests/test_meta_store_tablestore.py covers this over https."""
    import urllib3

    connection = client.connection
    connection.pool = urllib3.PoolManager(
        connection.NUM_POOLS, headers=None, cert_reqs="CERT_REQUIRED", ca_certs=bundle,
        timeout=client.socket_timeout, maxsize=client.max_connection, block=True,
        ssl_version=client.ssl_version,
    )


class TablestoreUriQuery(UriQuery):
    """The query of a ``tablestore://INSTANCE/TABLE?...`` URI (module docstring)."""

    credentials_hint: ClassVar[str] = _CREDENTIALS

    endpoint: HttpOrigin = Field(description="http(s)://host[:port], e.g. "
                                 "https://INSTANCE.cn-hangzhou.ots.aliyuncs.com")
    create_table: UriBool = False
    max_attempts: int = Field(8, ge=1, le=50, description="an integer from 1 to 50")
    socket_timeout: float = Field(20.0, ge=0.001, le=600.0,
                                  description="a number from 0.001 to 600.0")
    page_size: int | None = Field(None, ge=1, le=5000, description="an integer from 1 to 5000")
    ca_bundle: str | None = Field(None, description="the path of a PEM file of CA certificates")


def _if_equal(column: str, value: Any) -> Condition:
    """The row exists and holds ``value`` in ``column``."""
    return Condition(RowExistenceExpectation.EXPECT_EXIST,
                     SingleColumnCondition(column, value, ComparatorType.EQUAL,
                                           pass_if_missing=False))


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

    def __init__(self, instance: str, table: str, query: TablestoreUriQuery,
                 access_key_id: str | None = None, access_key_secret: str | None = None,
                 security_token: str | None = None) -> None:
        self.uri = f"tablestore://{instance}/{table}{query_text(query)}"
        self.instance, self.table, self.endpoint = instance, table, query.endpoint
        self.page_size = query.page_size
        self.max_attempts = self.delete_rounds = query.max_attempts
        creds = alibaba_credentials(access_key_id, access_key_secret, security_token)
        if not creds.complete:
            raise MetaStoreRequestError(
                store=self.uri, operation="open",
                reason=f"no Tablestore credentials: set {ALIBABA_ACCESS_KEY_ID} and "
                f"{ALIBABA_ACCESS_KEY_SECRET} (and {ALIBABA_SECURITY_TOKEN} for STS), or pass "
                "them in the source's options",
            )
        sdk_log = logging.getLogger(SDK_LOGGER)
        if sdk_log.level == logging.NOTSET:
            sdk_log.setLevel(logging.CRITICAL)  # our typed errors carry what it would log
        retries = WriteRetryPolicy()  # reads and writes alike: every write is safe to repeat
        retries.max_retry_times = self.max_attempts - 1
        try:
            self._client = OTSClient(
                self.endpoint, creds.access_key_id, creds.access_key_secret, instance,
                sts_token=creds.security_token, socket_timeout=query.socket_timeout,
                retry_policy=retries, logger_name=SDK_LOGGER,
            )
        except OTSClientError as exc:
            raise MetaStoreUriError(uri=self.uri, reason=str(exc)) from None
        bundle = tls.ca_bundle(query.ca_bundle) if self.endpoint.startswith("https://") else None
        if bundle:
            problem = tls.ca_bundle_problem(bundle)
            if problem:
                raise MetaStoreUriError(uri=self.uri, reason=f"ca_bundle: {problem}")
            _trust_ca(self._client, bundle)
        #: has the endpoint answered a request (``cdc_common.first_contact``)?
        self._answered = False
        if query.create_table:
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
        parts, refuse = split_store_uri(uri, "tablestore", TablestoreUriQuery)
        instance, table = parts.netloc, parts.path.removeprefix("/")
        if not instance or not table:
            raise refuse("use tablestore://INSTANCE/TABLE?endpoint=https://...")
        if not TABLESTORE_INSTANCE.match(instance):
            raise refuse(f"instance name {instance!r} is not valid (a letter, then letters, "
                         "digits or -)")
        if not _TABLE_NAME.match(table):
            raise refuse(f"table name {table!r} is not valid (a letter or _, then up to 254 "
                         "letters, digits or _)")
        if parts.fragment:
            raise refuse("a URI fragment (#...) is not allowed")
        query = parse_query(parts.query, TablestoreUriQuery, refuse)
        query = query.model_copy(update={"endpoint": query.endpoint.rstrip("/")})
        return cls(instance, table, query, access_key_id, access_key_secret, security_token)

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

    def _call(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One SDK call, mapped to our errors. The SDK retries service errors itself (its
        policy, ``max_attempts``); network errors, which it does not retry, are retried here.
        A false row condition raises ``ConditionFailed``."""
        self._check_open(operation)

        def refused(reason: str) -> MetaStoreRequestError:
            return MetaStoreRequestError(store=self.uri, operation=f"Tablestore {operation}",
                                         reason=reason)

        for attempt in range(1, self.max_attempts + 1):
            try:
                result = fn(*args, **kwargs)
                self._answered = True
                return result
            except OTSServiceError as exc:
                self._answered = True
                code, status = exc.get_error_code(), exc.get_http_status()
                said = f"{code} (HTTP {status}): {exc.get_error_message()}"
                if code == "OTSConditionCheckFail":
                    raise ConditionFailed() from None
                if code == "OTSObjectNotExist":
                    raise MetaTableMissingError(
                        table=self.table, location=f"instance {self.instance} at {self.endpoint}"
                    ) from None
                if code in _AUTH_CODES:
                    raise refused(f"{said}; {_credentials_hint(code)}") from None
                if code in _TRANSIENT_CODES or (status or 0) >= 500:
                    raise TransientMetaStoreError(
                        detail=f"{self.uri}: Tablestore {operation} failed with {said}") from None
                raise refused(said) from None
            except OTSClientError as exc:
                status = exc.get_http_status()
                if status is None:  # raised before sending: a bad argument, not transient
                    raise refused(str(exc)) from None
                if str(exc).startswith(_SDK_BARE_ERROR):
                    # an error status whose body is no service error: a 5xx of that kind is
                    # what a load balancer or proxy sends, and the SDK does not retry it; the
                    # service may not have seen the request. Any other is a real refusal.
                    if status < 500:
                        raise refused(str(exc)) from None
                    if attempt == self.max_attempts:
                        raise TransientMetaStoreError(
                            detail=f"{self.uri}: Tablestore {operation} failed at "
                            f"{self.endpoint} after {attempt} attempt(s): {exc}",
                        ) from None
                elif attempt == self.max_attempts:
                    # the answer failed the SDK's checks (MD5, signature, headers, date): it is
                    # never used; the request may have taken effect, and every write is safe
                    # to repeat, so it is sent again; always failing is not transient
                    raise refused(f"every answer from {self.endpoint} failed validation "
                                  f"({attempt} attempt(s)): {exc}") from None
            except Exception as exc:  # urllib3/socket errors: the request may not have arrived
                problem = tls.tls_problem(exc, self.endpoint)
                if problem is None and at_query_start() and not self._answered:
                    problem = unreachable_problem(exc, self.endpoint, "meta.store endpoint")
                if problem is not None:  # a configuration error: retrying cannot fix it
                    raise refused(problem) from None
                if attempt == self.max_attempts:
                    raise TransientMetaStoreError(
                        detail=f"{self.uri}: Tablestore {operation} could not reach "
                        f"{self.endpoint} after {attempt} attempt(s): {exc}",
                    ) from None
            backoff(attempt)
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
        above = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # above every key starting with prefix
        rows = self._range(operation, self._pk(namespace, prefix), self._pk(namespace, above),
                           ["doc"] if keys_only else None)
        return (_row(dict(row.primary_key)["sk"], row) for row in rows)

    def _range(self, operation: str, start: Any, end: Any, columns: list[str] | None
               ) -> Iterator[Any]:
        """The SDK rows from ``start`` to ``end``, GetRange page after page."""
        while start is not None:
            _, start, rows, _ = self._call(
                operation, self._client.get_range, self.table, "FORWARD", start, end,
                columns_to_get=columns, limit=self.page_size, max_version=1)
            yield from rows

    def _put(self, operation: str, namespace: str, sk: str, row: PlainRow,
             condition: Condition) -> None:
        self._call(operation, self._client.put_row, self.table,
                   Row(self._pk(namespace, sk), _columns(row)), condition)

    def _insert_row(self, operation: str, namespace: str, sk: str, row: PlainRow) -> None:
        self._put(operation, namespace, sk, row,
                  Condition(RowExistenceExpectation.EXPECT_NOT_EXIST))

    def _put_row(self, operation: str, namespace: str, sk: str, row: PlainRow) -> None:
        self._put(operation, namespace, sk, row, Condition(RowExistenceExpectation.IGNORE))

    def _replace_row_if(self, operation: str, namespace: str, sk: str, column: str,
                        expected: str, row: PlainRow) -> None:
        self._put(operation, namespace, sk, row, _if_equal(column, expected))

    # --- writes that change a batch row: optimistic, on its version -----------------------

    def _change_batch(self, operation: str, what: str, namespace: str, uuid: str,
                      change: Callable[[BatchRecord], PlainRow | None]) -> BatchRecord | None:
        """Write ``change(batch)``'s columns (None: nothing to write) to the stored batch by an
        UpdateRow conditioned on the ``version`` just read, read again while another writer
        wins; returns the batch as read before the write (None: there is no such batch)."""
        for _ in range(_OPTIMISTIC_ROUNDS):
            row = self._get_row(operation, namespace, batch_sk(uuid))
            if row is None:
                return None
            batch = self._decode_batch(namespace, row)
            try:
                version = int(row.get("version", 0))
            except (ValueError, TypeError) as exc:
                raise self._corrupt(f"{namespace}/{row['sk']}", f"version: {exc}") from None
            changes = change(batch)
            if changes is None:
                return batch
            try:
                self._call(operation, self._client.update_row, self.table,
                           Row(self._pk(namespace, batch_sk(uuid)),
                               {"put": [*_columns(changes), ("version", version + 1)]}),
                           _if_equal("version", version))
                return batch
            except ConditionFailed:
                pass
        raise TransientMetaStoreError(
            detail=f"{self.uri}: batch {uuid!r}: {what} lost {_OPTIMISTIC_ROUNDS} races in a row")

    def _set_manifest_if_absent(
        self, namespace: str, uuid: str, manifest: Manifest
    ) -> BatchRecord:
        encoded = self._manifest_cells(uuid, manifest)

        def change(batch: BatchRecord) -> PlainRow | None:
            state = with_manifest(batch, manifest).state
            return None if batch.manifest is not None else encoded | (
                {} if state is batch.state else {"state": state.value, "state_rank": state.rank})

        batch = self._change_batch("put_manifest", "the manifest write", namespace, uuid, change)
        if batch is None:
            raise UnknownBatchError(uuid=uuid, namespace=namespace)
        return batch if batch.manifest is not None else with_manifest(batch, manifest)

    def _advance_state(
        self, namespace: str, uuid: str, state: BatchState, at: float,
        spark_batch_id: int | None = None,
    ) -> None:
        self._change_batch(  # a missing batch, or one at or past ``state``: nothing to write
            f"mark {state.value}", f"marking it {state.value}", namespace, uuid,
            lambda batch: None if batch.state.rank >= state.rank else {
                "state": state.value, "state_rank": state.rank,
                **first_times(batch, state, float(at), spark_batch_id)})

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
        keys = (dict(row.primary_key) for row in self._range(
            "list_namespaces", [("ns", INF_MIN), ("sk", INF_MIN)],
            [("ns", INF_MAX), ("sk", INF_MAX)], ["info"]))
        return self._sorted_namespaces(k.get("ns") for k in keys if k.get("sk") == INFO_SK)

    def _close_client(self) -> None:
        with contextlib.suppress(Exception):  # closing is best effort
            self._client.connection.pool.clear()
