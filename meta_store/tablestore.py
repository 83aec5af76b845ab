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
  retries network errors, both with jittered exponential backoff;
- ``socket_timeout`` (seconds, default 20);
- ``page_size``: the ``limit`` of each GetRange page (default: the service's pages, at most
  5000 rows or 4 MB);
- ``ca_bundle``: a PEM file of CA certificates that verifies an ``https`` endpoint (the source
  passes its ``ssl.ca.bundle`` option here); else ``REQUESTS_CA_BUNDLE`` / ``SSL_CERT_FILE``,
  else the SDK's own (certifi). The SDK takes no CA of its own, so its connection pool is
  rebuilt with this one (``_trust_ca``). A certificate or host name that does not verify is a
  ``MetaStoreRequestError`` at once, naming the endpoint and what to fix (``meta_store.tls``).

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

Table layout (the DynamoDB backend's single-table layout), primary key ``ns`` (STRING, the
namespace) + ``sk`` (STRING):

- ``B#<uuid>`` batch rows: ``doc`` (the ``BatchRecord`` JSON without the fields below),
  ``state``, ``state_rank``, ``version`` (bumped by every change of the row),
  ``committed_at``, ``pushed_at``, ``spark_batch_id``, and the manifest: ``manifest`` (its JSON,
  a string) or, when that JSON is over ``MAX_COLUMN_BYTES``, ``manifest_z`` (zlib-compressed,
  binary);
- ``E#<uuid>#<channel id>`` end checkpoints: ``doc`` (the ``EndCheckpoint`` JSON);
- ``N#info``: ``info`` (a JSON object of strings).

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

import json
import logging
import os
import random
import re
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import TypeAdapter, ValidationError
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

from meta_store import tls
from meta_store.base import (
    BatchRecord,
    BatchState,
    EndCheckpoint,
    Manifest,
    MetaStore,
    parse_record,
)
from meta_store.errors import (
    CorruptMetaRecordError,
    MetaStoreRequestError,
    MetaStoreUriError,
    MetaTableMissingError,
    TransientMetaStoreError,
    UnknownBatchError,
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

_PARAMS = ("endpoint", "create_table", "max_attempts", "socket_timeout", "page_size",
           "ca_bundle")
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
_INFO = TypeAdapter(dict[str, str])
_BATCH_STATE_FIELDS = ("manifest", "state", "committed_at", "pushed_at", "spark_batch_id")
_OPTIMISTIC_ROUNDS = 20


class _ConditionFailed(Exception):
    """Internal: a conditional write found its condition false."""


class _RetryPolicy(WriteRetryPolicy):  # type: ignore[misc]
    """The SDK's policy for reads and writes alike (all our writes are safe to repeat), with
    ``max_attempts`` total attempts."""

    def __init__(self, max_attempts: int) -> None:
        self.max_retry_times = max_attempts - 1


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


class TablestoreMetaStore(MetaStore):
    """A meta table in one Tablestore table (see the module docstring for URI, layout,
    atomicity). Open with ``from_uri`` or ``meta_store.open_meta_store``; one instance per
    process (the ``OTSClient`` inside is thread-safe)."""

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
        ca_bundle: str | None = None,
        access_key_id: str | None = None,
        access_key_secret: str | None = None,
        security_token: str | None = None,
        uri: str | None = None,
    ) -> None:
        given = {"endpoint": endpoint, "create_table": "true" if create_table else None,
                 "max_attempts": max_attempts if max_attempts != 8 else None,
                 "socket_timeout": socket_timeout if socket_timeout != 20.0 else None,
                 "page_size": page_size, "ca_bundle": ca_bundle}
        query = urlencode({k: v for k, v in given.items() if v is not None}, safe="/:")
        self.uri = uri or f"tablestore://{instance}/{table}?{query}"
        self.instance, self.table, self.endpoint = instance, table, endpoint
        self.page_size = page_size
        self.max_attempts = max_attempts
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
        bundle = tls.ca_bundle(ca_bundle) if endpoint.startswith("https://") else None
        if bundle:
            problem = tls.ca_bundle_problem(bundle)
            if problem:
                raise MetaStoreUriError(uri=self.uri, reason=f"ca_bundle: {problem}")
            _trust_ca(self._client, bundle)
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
        if "ca_bundle" in raw:
            options["ca_bundle"] = raw["ca_bundle"]
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
        A false row condition raises ``_ConditionFailed``."""
        if self._closed:
            raise MetaStoreRequestError(store=self.uri, operation=operation,
                                        reason="the store is closed")
        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn(*args, **kwargs)
            except OTSServiceError as exc:
                code, status = exc.get_error_code(), exc.get_http_status()
                if code == "OTSConditionCheckFail":
                    raise _ConditionFailed() from None
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
                # a response that failed the SDK's validation, a bad argument: not transient
                raise MetaStoreRequestError(
                    store=self.uri, operation=f"Tablestore {operation}", reason=str(exc),
                ) from None
            except Exception as exc:  # urllib3/socket errors: the request may not have arrived
                problem = tls.tls_problem(exc, self.endpoint)
                if problem is not None:  # a configuration error: retrying cannot fix it
                    raise MetaStoreRequestError(
                        store=self.uri, operation=f"Tablestore {operation}", reason=problem,
                    ) from None
                if attempt == self.max_attempts:
                    raise TransientMetaStoreError(
                        detail=f"{self.uri}: Tablestore {operation} could not reach "
                        f"{self.endpoint} after {attempt} attempt(s): {exc}",
                    ) from None
                time.sleep(random.uniform(0, min(2.0, 0.05 * 2 ** attempt)))
        raise AssertionError("unreachable")  # pragma: no cover

    def _pk(self, namespace: str, sk: str) -> list[tuple[str, str]]:
        for what, value in (("namespace", namespace), ("key", sk)):
            if len(value.encode()) > MAX_KEY_BYTES:
                raise MetaStoreRequestError(
                    store=self.uri, operation="key",
                    reason=f"{what} {value[:60]!r}... is over Tablestore's {MAX_KEY_BYTES}-byte "
                    "primary-key limit",
                )
        return [("ns", namespace), ("sk", sk)]

    @staticmethod
    def _batch_sk(uuid: str) -> str:
        return f"B#{uuid}"

    def _ends_prefix(self, uuid: str) -> str:
        if "#" in uuid:
            raise MetaStoreRequestError(store=self.uri, operation="end checkpoint key",
                                        reason=f"batch UUID {uuid!r} must not contain '#'")
        return f"E#{uuid}#"

    def _get(self, operation: str, namespace: str, sk: str) -> dict[str, Any] | None:
        _, row, _ = self._call(operation, self._client.get_row, self.table,
                               self._pk(namespace, sk), max_version=1)
        if row is None:
            return None
        return {"sk": sk, **self._columns(row)}

    @staticmethod
    def _columns(row: Any) -> dict[str, Any]:
        return {name: bytes(v) if isinstance(v, bytearray) else v
                for name, v, *_ in row.attribute_columns}

    def _range(self, operation: str, namespace: str, prefix: str,
               columns: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
        """Rows of ``namespace`` whose sort key starts with ``prefix``, page by page."""
        start: Any = self._pk(namespace, prefix)
        end = self._pk(namespace, _prefix_end(prefix))
        while start is not None:
            _, start, rows, _ = self._call(
                operation, self._client.get_range, self.table, "FORWARD", start, end,
                columns_to_get=list(columns) if columns else None, limit=self.page_size,
                max_version=1,
            )
            for row in rows:
                yield {"sk": dict(row.primary_key)["sk"], **self._columns(row)}

    # --- encoding -------------------------------------------------------------------------

    def _corrupt(self, key: str, reason: str) -> CorruptMetaRecordError:
        return CorruptMetaRecordError(store=self.uri, key=key, reason=reason)

    def _manifest_columns(self, uuid: str, manifest: Manifest) -> list[tuple[str, Any]]:
        raw = manifest.model_dump_json().encode()
        if len(raw) <= MAX_COLUMN_BYTES:
            return [("manifest", raw.decode())]
        packed = zlib.compress(raw, 6)
        if len(packed) > MAX_COLUMN_BYTES:
            raise MetaStoreRequestError(
                store=self.uri, operation="put_manifest",
                reason=f"batch {uuid!r}: the manifest of {len(manifest.channels)} channels is "
                f"{len(packed)} bytes even compressed; a Tablestore column holds at most 2 MB "
                "(use the sqlite backend or read fewer channels per tunnel)",
            )
        return [("manifest_z", bytearray(packed))]

    def _batch_columns(self, record: BatchRecord) -> list[tuple[str, Any]]:
        cols: list[tuple[str, Any]] = [
            ("doc", record.model_dump_json(exclude=set(_BATCH_STATE_FIELDS))),
            ("state", record.state.value),
            ("state_rank", record.state.rank),
            ("version", 0),
        ]
        if record.committed_at is not None:
            cols.append(("committed_at", float(record.committed_at)))
        if record.pushed_at is not None:
            cols.append(("pushed_at", float(record.pushed_at)))
        if record.spark_batch_id is not None:
            cols.append(("spark_batch_id", record.spark_batch_id))
        if record.manifest is not None:
            cols += self._manifest_columns(record.uuid, record.manifest)
        return cols

    def _decode_batch(self, namespace: str, item: dict[str, Any]) -> tuple[BatchRecord, int]:
        """The batch and the row's ``version``."""
        sk = str(item.get("sk", "?"))
        key = f"{namespace}/{sk}"
        try:
            fields = json.loads(item["doc"])
            if not isinstance(fields, dict):
                raise ValueError(f"doc is a JSON {type(fields).__name__}, not an object")
            fields["state"] = item["state"]
            for name in ("committed_at", "pushed_at", "spark_batch_id"):
                if name in item:
                    fields[name] = item[name]
            manifest: Manifest | None = None
            if "manifest" in item or "manifest_z" in item:
                raw = (zlib.decompress(item["manifest_z"]) if "manifest_z" in item
                       else item["manifest"])
                parsed = parse_record(Manifest, raw, store=self.uri, key=key + "/manifest")
                assert isinstance(parsed, Manifest)
                manifest = parsed
            fields["manifest"] = manifest
            batch = BatchRecord.model_validate(fields)
            version = int(item.get("version", 0))
        except CorruptMetaRecordError:
            raise
        except KeyError as exc:
            raise self._corrupt(key, f"column {exc} is missing") from None
        except ValidationError as exc:
            raise self._corrupt(key, exc.errors()[0].get("msg", str(exc))) from None
        except (ValueError, TypeError, zlib.error) as exc:
            raise self._corrupt(key, str(exc)) from None
        if sk != self._batch_sk(batch.uuid):
            raise self._corrupt(key, f"the row holds batch {batch.uuid!r}")
        return batch, version

    def _decode_end(self, namespace: str, uuid: str, item: dict[str, Any]) -> EndCheckpoint:
        sk = str(item.get("sk", "?"))
        key = f"{namespace}/{sk}"
        doc = item.get("doc")
        if not isinstance(doc, str):
            raise self._corrupt(key, "column 'doc' (a JSON string) is missing")
        end = parse_record(EndCheckpoint, doc, store=self.uri, key=key)
        assert isinstance(end, EndCheckpoint)
        if sk != self._ends_prefix(uuid) + end.channel_id:
            raise self._corrupt(key, f"the row holds channel {end.channel_id!r}")
        return end

    # --- primitives -----------------------------------------------------------------------

    def _put_if_absent(self, operation: str, namespace: str, sk: str,
                       columns: list[tuple[str, Any]]) -> dict[str, Any] | None:
        """PutRow with EXPECT_NOT_EXIST; ``None`` when ours was written, else the stored row."""
        for _ in range(3):  # the stored row may be deleted (gc) between put and read
            try:
                self._call(operation, self._client.put_row, self.table,
                           Row(self._pk(namespace, sk), columns),
                           Condition(RowExistenceExpectation.EXPECT_NOT_EXIST))
                return None
            except _ConditionFailed:
                stored = self._get(operation, namespace, sk)
                if stored is not None:
                    return stored
        raise TransientMetaStoreError(
            detail=f"{self.uri}: row {sk!r} kept appearing and disappearing")

    def _update_if_version(self, operation: str, namespace: str, sk: str, version: int,
                           columns: list[tuple[str, Any]]) -> bool:
        """UpdateRow conditioned on the row's ``version``; False when another writer won."""
        condition = Condition(
            RowExistenceExpectation.EXPECT_EXIST,
            SingleColumnCondition("version", version, ComparatorType.EQUAL,
                                  pass_if_missing=False),
        )
        try:
            self._call(operation, self._client.update_row, self.table,
                       Row(self._pk(namespace, sk),
                           {"put": [*columns, ("version", version + 1)]}),
                       condition)
            return True
        except _ConditionFailed:
            return False

    def _put_batch_if_absent(self, namespace: str, record: BatchRecord) -> BatchRecord:
        sk = self._batch_sk(record.uuid)
        stored = self._put_if_absent("create_batch", namespace, sk, self._batch_columns(record))
        return record if stored is None else self._decode_batch(namespace, stored)[0]

    def _get_batch(self, namespace: str, uuid: str) -> BatchRecord | None:
        item = self._get("get_batch", namespace, self._batch_sk(uuid))
        return None if item is None else self._decode_batch(namespace, item)[0]

    def _set_manifest_if_absent(
        self, namespace: str, uuid: str, manifest: Manifest
    ) -> BatchRecord:
        sk = self._batch_sk(uuid)
        encoded = self._manifest_columns(uuid, manifest)
        for _ in range(_OPTIMISTIC_ROUNDS):
            item = self._get("put_manifest", namespace, sk)
            if item is None:
                raise UnknownBatchError(uuid=uuid, namespace=namespace)
            batch, version = self._decode_batch(namespace, item)
            if batch.manifest is not None:
                return batch
            columns = list(encoded)
            updated = batch.model_copy(update={"manifest": manifest})
            if batch.state is BatchState.MINTED:
                columns += [("state", BatchState.PLANNED.value),
                            ("state_rank", BatchState.PLANNED.rank)]
                updated = updated.model_copy(update={"state": BatchState.PLANNED})
            if self._update_if_version("put_manifest", namespace, sk, version, columns):
                return updated
        raise TransientMetaStoreError(
            detail=f"{self.uri}: batch {uuid!r}: the manifest write lost "
            f"{_OPTIMISTIC_ROUNDS} races in a row")

    def _advance_state(
        self, namespace: str, uuid: str, state: BatchState, at: float,
        spark_batch_id: int | None = None,
    ) -> None:
        sk = self._batch_sk(uuid)
        for _ in range(_OPTIMISTIC_ROUNDS):
            item = self._get(f"mark {state.value}", namespace, sk)
            if item is None:
                return  # missing: no-op
            batch, version = self._decode_batch(namespace, item)
            if batch.state.rank >= state.rank:
                return  # never backward
            columns: list[tuple[str, Any]] = [("state", state.value),
                                              ("state_rank", state.rank)]
            if state.rank >= BatchState.COMMITTED.rank and batch.committed_at is None:
                columns.append(("committed_at", float(at)))
            if state is BatchState.PUSHED and batch.pushed_at is None:
                columns.append(("pushed_at", float(at)))
            if spark_batch_id is not None and batch.spark_batch_id is None:
                columns.append(("spark_batch_id", spark_batch_id))
            if self._update_if_version(f"mark {state.value}", namespace, sk, version, columns):
                return
        raise TransientMetaStoreError(
            detail=f"{self.uri}: batch {uuid!r}: marking it {state.value} lost "
            f"{_OPTIMISTIC_ROUNDS} races in a row")

    def _put_end_if_absent(self, namespace: str, uuid: str, end: EndCheckpoint) -> EndCheckpoint:
        sk = self._ends_prefix(uuid) + end.channel_id
        stored = self._put_if_absent("put_end_checkpoint", namespace, sk,
                                     [("doc", end.model_dump_json())])
        return end if stored is None else self._decode_end(namespace, uuid, stored)

    def _get_end(self, namespace: str, uuid: str, channel_id: str) -> EndCheckpoint | None:
        item = self._get("get_end_checkpoint", namespace, self._ends_prefix(uuid) + channel_id)
        return None if item is None else self._decode_end(namespace, uuid, item)

    def _list_ends(self, namespace: str, uuid: str) -> list[EndCheckpoint]:
        return [self._decode_end(namespace, uuid, item)
                for item in self._range("get_end_checkpoints", namespace,
                                        self._ends_prefix(uuid))]

    def _list_batches(self, namespace: str) -> list[BatchRecord]:
        return [self._decode_batch(namespace, item)[0]
                for item in self._range("list_batches", namespace, "B#")]

    def _delete_batches(self, namespace: str, uuids: Sequence[str]) -> None:
        unique = list(dict.fromkeys(uuids))
        end_keys = [item["sk"] for u in unique
                    for item in self._range("gc", namespace, self._ends_prefix(u), ["doc"])]
        self._batch_delete(namespace, end_keys)  # ends first: no end outlives its batch
        self._batch_delete(namespace, [self._batch_sk(u) for u in unique])

    def _batch_delete(self, namespace: str, sort_keys: list[str]) -> None:
        for i in range(0, len(sort_keys), BATCH_WRITE_MAX):
            pending = sort_keys[i:i + BATCH_WRITE_MAX]
            for round_ in range(self.max_attempts):
                request = BatchWriteRowRequest()
                request.add(TableInBatchWriteRowItem(self.table, [
                    DeleteRowItem(Row(self._pk(namespace, sk)),
                                  Condition(RowExistenceExpectation.IGNORE))
                    for sk in pending]))
                result = self._call("gc", self._client.batch_write_row, request)
                _, failed = result.get_delete()
                # BatchWriteRow succeeds row by row: resend the rows that failed
                pending = [pending[f.index] for f in failed]
                if not pending:
                    break
                time.sleep(random.uniform(0, min(2.0, 0.05 * 2 ** round_)))
            else:
                raise TransientMetaStoreError(
                    detail=f"{self.uri}: gc: {len(pending)} deletes still failing after "
                    f"{self.max_attempts} rounds",
                )

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
                if pk.get("sk") == "N#info":
                    found.add(pk["ns"])
        return sorted(found)

    def set_namespace_info(self, namespace: str, info: dict[str, str]) -> None:
        payload = json.dumps(_INFO.validate_python(dict(info)), sort_keys=True)
        self._call("set_namespace_info", self._client.put_row, self.table,
                   Row(self._pk(namespace, "N#info"), [("info", payload)]),
                   Condition(RowExistenceExpectation.IGNORE))

    def get_namespace_info(self, namespace: str) -> dict[str, str] | None:
        item = self._get("get_namespace_info", namespace, "N#info")
        if item is None:
            return None
        try:
            return _INFO.validate_json(item["info"])
        except (KeyError, ValidationError) as exc:
            raise self._corrupt(f"{namespace}/N#info", str(exc).splitlines()[0]) from None

    def close(self) -> None:
        """Close the client's connection pool (idempotent)."""
        if not self._closed:
            self._closed = True
            try:
                self._client.connection.pool.clear()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    def __repr__(self) -> str:
        return f"TablestoreMetaStore(uri={self.uri!r})"

    __str__ = __repr__
