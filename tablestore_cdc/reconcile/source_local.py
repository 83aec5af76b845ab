"""The embedded store's table (``local://``) for reconcile: ``LocalTablestore.scan_pages``.

Opened without creating anything; each page is its own read transaction, so a scan of a large
table never holds the file's WAL while the writer and the stream go on. A key range is the
scan's own bounds (chosen in its SQL query).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from connector.options import SourceOptions
from connector.tunnel import TableSchema
from connector.tunnel.local import LocalTablestore
from tablestore_cdc.reconcile.source import Row, SourceTable

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange


class LocalSourceTable(SourceTable):
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
