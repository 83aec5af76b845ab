"""The source table as reconcile (and, later, re-snapshot) reads it: one page of rows at a time.

``SourceSpec`` is what ``tablestore-cdc reconcile`` takes, as ``replicate`` takes it: the
endpoint (``--store`` / ``--endpoint``), the table, the tunnel and the reader options
(``--option``). ``open_source_table`` validates them as the Spark source does
(``connector.options.SourceOptions``: a typed endpoint, its secrets in ``SecretStr`` fields),
reads the table's schema through a tunnel client opened by the source's seam
(``connector.clients``: retries), and opens the reader of the endpoint's scheme, one module per
backend, its SDK imported lazily (only required when that scheme is used):

- ``local://``            ``LocalSourceTable``: the embedded store's scan, a page per read
  transaction
- ``http://``, ``https://``  ``TablestoreSourceTable``: the table API's GetRange pages (official
  SDK)
- ``dynamodb-streams://``   ``DynamoDbSourceTable``: DynamoDB Scan pages (boto3)

A key range (``tablestore_cdc.reconcile.keyrange.KeyRange``, a re-snapshot's ``--from`` /
``--to`` on the first key column) is read as a range where the backend can (each reader says
how).

A reader yields pages of ``(primary key, attribute columns)`` as plain Python values (int,
float, bool, str, bytes), the values the change stream carries for the same row; its
``schema`` is the table's declared schema as the source query declares it (the service's, plus
the ``catalog`` option's columns). Readers only read: no write reaches the source. Runs in the
CLI's process.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from connector.clients import Clients
from connector.options import SourceOptions
from connector.tunnel import TableSchema, TunnelAdministration
from connector.tunnel.local import LocalTablestore
from connector.tunnel.tablestore.endpoint import TablestoreEndpoint
from tablestore_cdc.reconcile.errors import SourceReadError

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange

#: a page of source rows: (primary key, attribute columns)
Row = tuple[dict[str, Any], dict[str, Any]]

#: the SDK's logger: its own lines are kept quiet (our errors say what went wrong)
SDK_LOGGER = "tablestore-cdc-reconcile"
#: GetRange answers at most 5000 rows a page
MAX_PAGE_ROWS = 5000


@dataclass(frozen=True)
class SourceSpec:
    """Where the source is, as ``replicate`` takes it: ``endpoint`` is the reader's endpoint
    option, ``options`` the extra reader options (``--option KEY=VALUE``)."""

    endpoint: str
    table: str
    tunnel: str = "replicate"
    options: Mapping[str, str] = field(default_factory=dict)

    def source_options(self) -> SourceOptions:
        """The options validated as the Spark source validates them (``OptionError``)."""
        return SourceOptions.from_spark({**self.options, "endpoint": self.endpoint,
                                         "table.name": self.table,
                                         "tunnel.name": self.tunnel})


class SourceTable(ABC):
    """One source table, read a page at a time (``pages``). Opened by ``open_source_table``;
    close it (or use ``with``)."""

    #: the table's declared schema (key columns, declared attribute columns)
    schema: TableSchema
    #: what reports call the source (no secret)
    shown: str

    @abstractmethod
    def pages(self, page_rows: int, span: KeyRange | None = None) -> Iterator[list[Row]]:
        """Every row of the table (or of ``span``, its first key column's range), ``page_rows``
        (about) at a time, in the backend's order. A row changed while the scan runs may
        appear as it was before or after the change."""

    def estimated_rows(self) -> int | None:
        """About how many rows the table holds (for a progress bar), None when unknown."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call twice."""

    def __enter__(self) -> SourceTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalSourceTable(SourceTable):
    """The embedded store's table (``local://``): ``LocalTablestore.scan_pages``, opened without
    creating anything; each page is its own read transaction, so a scan of a large table
    never holds the file's WAL while the writer and the stream go on. A key range is the
    scan's own bounds (in its SQL query)."""

    def __init__(self, options: SourceOptions, schema: TableSchema) -> None:
        self.path = urlsplit(options.endpoint.uri).path
        self.table = options.table_name
        self.schema = schema
        self.shown = f"local://{self.path} table {self.table}"
        self._store = LocalTablestore(self.path, create=False)

    def pages(self, page_rows: int, span: KeyRange | None = None) -> Iterator[list[Row]]:
        if span is None:
            yield from self._store.scan_pages(self.table, page_rows)
        else:
            yield from self._store.scan_pages(self.table, page_rows, column=span.column,
                                              low=span.key_from, high=span.key_to)

    def estimated_rows(self) -> int | None:
        return self._store.count_rows(self.table)

    def close(self) -> None:
        self._store.close()


class TablestoreSourceTable(SourceTable):
    """A Tablestore table over the wire (``http://``, ``https://``): GetRange, page after page in
    primary-key order, through the official ``tablestore`` SDK (the ``[tablestore]`` extra),
    with the source query's endpoint, instance and credentials. A key range is GetRange's
    bounds: ``(from, INF_MIN, ...)`` inclusive to ``(to, INF_MIN, ...)`` exclusive. Values
    come back as the change stream carries them (INTEGER -> int, DOUBLE -> float, BOOLEAN ->
    bool, STRING -> str, BINARY -> bytes)."""

    def __init__(self, options: SourceOptions, schema: TableSchema) -> None:
        from tablestore import OTSClient

        endpoint = options.endpoint
        assert isinstance(endpoint, TablestoreEndpoint)  # the reader of http(s):// endpoints
        creds = endpoint.credentials()
        self.table = options.table_name
        self.schema = schema
        self.shown = f"{options.safe_endpoint} table {self.table}"
        sdk_log = logging.getLogger(SDK_LOGGER)
        if sdk_log.level == logging.NOTSET:
            sdk_log.setLevel(logging.CRITICAL)
        self._client = OTSClient(endpoint.origin, creds["access_key_id"],
                                 creds["access_key_secret"], endpoint.instance,
                                 sts_token=creds.get("security_token"), logger_name=SDK_LOGGER)

    def pages(self, page_rows: int, span: KeyRange | None = None) -> Iterator[list[Row]]:
        from tablestore import INF_MAX, INF_MIN, Direction, OTSClientError, OTSServiceError

        first, *rest = [c.name for c in self.schema.primary_key]
        low = None if span is None else span.key_from
        high = None if span is None else span.key_to
        start: Any = [(first, INF_MIN if low is None else low), *((k, INF_MIN) for k in rest)]
        end = ([(k, INF_MAX) for k in (first, *rest)] if high is None
               else [(first, high), *((k, INF_MIN) for k in rest)])
        while start:
            try:
                _, start, rows, _ = self._client.get_range(
                    self.table, Direction.FORWARD, start, end,
                    limit=min(page_rows, MAX_PAGE_ROWS), max_version=1)
            except (OTSServiceError, OTSClientError) as exc:
                raise SourceReadError(source=self.shown, problem=f"GetRange: {exc}") from None
            if rows:
                yield [({name: _plain(v) for name, v in row.primary_key},
                        {cell[0]: _plain(cell[1]) for cell in row.attribute_columns})
                       for row in rows]


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, bytearray) else value


class DynamoDbSourceTable(SourceTable):
    """A DynamoDB table (``dynamodb-streams://``): Scan, page after page (boto3, the
    ``[dynamodb]`` extra), through the stream's clients and value decoding
    (``connector.tunnel.dynamodb_streams``): S -> str, N -> float (Decimal with
    ``numbers=decimal``), B -> bytes, BOOL -> bool, maps, lists and sets -> compact JSON text.
    A Scan has no key order, so a key range is kept from the whole table's rows."""

    def __init__(self, options: SourceOptions, schema: TableSchema) -> None:
        from connector.tunnel.dynamodb_streams.aws import clients, parse_uri

        self.config = parse_uri(options.endpoint.uri)
        self.table = options.table_name
        self.schema = schema
        self.shown = f"{self.config.uri} table {self.table}"
        self._numbers: Any = "decimal" if self.config.numbers == "decimal" else "double"
        self._ddb, _ = clients(self.config)

    def pages(self, page_rows: int, span: KeyRange | None = None) -> Iterator[list[Row]]:
        import botocore.exceptions

        from connector.tunnel.dynamodb_streams.codec import decode_item

        keys = [c.name for c in self.schema.primary_key]
        pages = self._ddb.get_paginator("scan").paginate(
            TableName=self.table, ConsistentRead=True,
            PaginationConfig={"PageSize": page_rows})
        try:
            for page in pages:
                rows = []
                for item in page.get("Items", []):
                    values = decode_item(item, self._numbers) or {}
                    key = {k: values.pop(k) for k in keys}
                    if span is None or span.holds(tuple(key.values())):
                        rows.append((key, values))
                if rows:
                    yield rows
        except botocore.exceptions.ClientError as exc:
            raise SourceReadError(source=self.shown, problem=f"Scan: {exc}") from None

    def estimated_rows(self) -> int | None:
        try:
            count = self._ddb.describe_table(TableName=self.table)["Table"].get("ItemCount")
        except Exception:  # only a progress bar's total
            return None
        return int(count) if count else None


#: scheme -> the reader of its tables
_READERS: dict[str, Callable[[SourceOptions, TableSchema], SourceTable]] = {
    "local": LocalSourceTable, "http": TablestoreSourceTable, "https": TablestoreSourceTable,
    "dynamodb-streams": DynamoDbSourceTable}


def declared_schema(options: SourceOptions, tunnel: TunnelAdministration) -> TableSchema:
    """The table's schema as the source query declares it (the service's and the catalog's)."""
    return options.declared_schema(tunnel.table_schema(options.table_name))


def open_source_table(spec: SourceSpec) -> SourceTable:
    """The reader for ``spec``'s endpoint. Raises ``OptionError`` for a bad endpoint or option
    (as ``replicate`` would) and the backend's error for a missing table."""
    options = spec.source_options()
    with Clients().tunnel(options.endpoint) as tunnel:  # the SDK check and the schema
        schema = declared_schema(options, tunnel)
    return _READERS[options.endpoint.scheme](options, schema)
