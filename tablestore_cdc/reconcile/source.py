"""The source table as reconcile (and, later, re-snapshot) reads it: one page of rows at a time.

``SourceSpec`` is what ``tablestore-cdc reconcile`` takes, as ``replicate`` takes it: the
endpoint (``--store`` / ``--endpoint``), the table, the tunnel and the reader options
(``--option``). ``open_source_table`` validates them as the Spark source does
(``connector.options.SourceOptions``: a typed endpoint, its secrets in ``SecretStr`` fields),
reads the table's schema through a tunnel client opened by the source's seam
(``connector.clients``: retries), and opens the reader of the endpoint's scheme, one module per
backend, imported lazily (an SDK a backend needs is only required when that scheme is used):

- ``local://``            ``source_local``: the embedded store's scan, a page per read transaction
- ``http://``, ``https://``  ``source_tablestore``: the table API's GetRange pages (official SDK)
- ``dynamodb-streams://``   ``source_dynamodb``: DynamoDB Scan pages (boto3)

A key range (``tablestore_cdc.reconcile.keyrange.KeyRange``, a re-snapshot's ``--from`` /
``--to`` on the first key column) is read as a range where the backend can: GetRange between
its bounds, the embedded store's scan bounded in its query; a DynamoDB Scan has no key order,
so it reads the whole table and keeps the range's rows.

A reader yields pages of ``(primary key, attribute columns)`` as plain Python values (int,
float, bool, str, bytes), the values the change stream carries for the same row; its
``schema`` is the table's declared schema as the source query declares it (the service's, plus
the ``catalog`` option's columns). Readers only read: no write reaches the source. Runs in the
CLI's process.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from connector.clients import Clients
from connector.options import SourceOptions
from connector.tunnel import TableSchema, TunnelAdministration

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange

#: a page of source rows: (primary key, attribute columns)
Row = tuple[dict[str, Any], dict[str, Any]]

#: scheme -> "module:class" of the reader (this package)
_READERS = {
    "local": "tablestore_cdc.reconcile.source_local:LocalSourceTable",
    "http": "tablestore_cdc.reconcile.source_tablestore:TablestoreSourceTable",
    "https": "tablestore_cdc.reconcile.source_tablestore:TablestoreSourceTable",
    "dynamodb-streams": "tablestore_cdc.reconcile.source_dynamodb:DynamoDbSourceTable",
}


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


def declared_schema(options: SourceOptions, tunnel: TunnelAdministration) -> TableSchema:
    """The table's schema as the source query declares it (the service's and the catalog's)."""
    return options.declared_schema(tunnel.table_schema(options.table_name))


def open_source_table(spec: SourceSpec) -> SourceTable:
    """The reader for ``spec``'s endpoint. Raises ``OptionError`` for a bad endpoint or option
    (as ``replicate`` would) and the backend's error for a missing table."""
    options = spec.source_options()
    module, _, name = _READERS[options.endpoint.scheme].partition(":")
    with Clients().tunnel(options.endpoint) as tunnel:  # the SDK check and the schema
        schema = declared_schema(options, tunnel)
    reader: SourceTable = getattr(importlib.import_module(module), name)(options, schema)
    return reader
