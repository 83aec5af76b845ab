"""A Tablestore table over the wire (``http://``, ``https://``) for reconcile: the table API's
GetRange, page after page in primary-key order, through the official ``tablestore`` SDK (the
``[tablestore]`` extra). A key range on the first key column is GetRange's own bounds: from
``(from, INF_MIN, ...)`` inclusive to ``(to, INF_MIN, ...)`` exclusive.

The endpoint, instance and credentials are the ones the source query uses (the options fold
them into a typed endpoint, ``connector.tunnel.tablestore.endpoint.TablestoreEndpoint``). Values
come back as the change stream carries them: INTEGER -> int, DOUBLE -> float, BOOLEAN -> bool,
STRING -> str, BINARY -> bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from connector.options import SourceOptions
from connector.tunnel import TableSchema
from connector.tunnel.tablestore.endpoint import TablestoreEndpoint
from tablestore_cdc.reconcile.errors import SourceReadError
from tablestore_cdc.reconcile.source import Row, SourceTable

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange

#: the SDK's logger: its own lines are kept quiet (our errors say what went wrong)
SDK_LOGGER = "tablestore-cdc-reconcile"
#: GetRange answers at most 5000 rows a page
MAX_PAGE_ROWS = 5000


class TablestoreSourceTable(SourceTable):
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
