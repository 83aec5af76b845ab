"""A DynamoDB table (``dynamodb-streams://``) for reconcile: Scan, page after page (boto3, the
``[dynamodb]`` extra), through the same clients and value decoding as the stream's records
(``connector.tunnel.dynamodb_streams``): S -> str, N -> float (Decimal with ``numbers=decimal``),
B -> bytes, BOOL -> bool, maps, lists and sets -> compact JSON text.

A Scan has no key order (items come in hash order), so a key range cannot bound it: the whole
table is scanned and only the range's rows are kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from connector.options import SourceOptions
from connector.tunnel import TableSchema
from connector.tunnel.dynamodb_streams.aws import clients, parse_uri
from connector.tunnel.dynamodb_streams.codec import decode_item
from tablestore_cdc.reconcile.errors import SourceReadError
from tablestore_cdc.reconcile.source import Row, SourceTable

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange


class DynamoDbSourceTable(SourceTable):
    def __init__(self, options: SourceOptions, schema: TableSchema) -> None:
        self.config = parse_uri(options.endpoint.uri)
        self.table = options.table_name
        self.schema = schema
        self.shown = f"{self.config.uri} table {self.table}"
        self._numbers: Any = "decimal" if self.config.numbers == "decimal" else "double"
        self._ddb, _ = clients(self.config)

    def pages(self, page_rows: int, span: KeyRange | None = None) -> Iterator[list[Row]]:
        import botocore.exceptions

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
