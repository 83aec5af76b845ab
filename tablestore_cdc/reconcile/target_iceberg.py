"""An Apache Iceberg target for reconcile (``pyiceberg``): a scan of the pinned snapshot filtered
to the current rows; the apply batches from the snapshot summaries of its ancestors.

The scan's ``row_filter`` carries a key range too: pyiceberg plans only the data files whose
column bounds (in the manifests) overlap it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tablestore_cdc.lakehouse import END_AT
from tablestore_cdc.lakehouse.iceberg import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, expressions
from tablestore_cdc.reconcile.target import AppliedBatch, TargetTable, newest_applied

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange


class IcebergTargetTable(TargetTable):
    def __init__(self, shown: str, table: Any, soft_delete_column: str | None) -> None:
        super().__init__(shown, soft_delete_column)
        self._table = table
        self._snapshot = table.current_snapshot()
        self.version = "" if self._snapshot is None else str(self._snapshot.snapshot_id)
        self._schema = table.schema().as_arrow()

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def _filter(self, span: KeyRange | None) -> Any:
        e = expressions()
        keep: Any = e.AlwaysTrue()
        if span is not None and span.key_from is not None:
            keep = e.And(keep, e.GreaterThanOrEqual(span.column, span.key_from))
        if span is not None and span.key_to is not None:
            keep = e.And(keep, e.LessThan(span.column, span.key_to))
        if self.scd == 2:
            keep = e.And(keep, e.IsNull(END_AT))
        flag = self.soft_delete_column
        if flag is not None and flag in self.schema.names:
            keep = e.And(keep, e.Or(e.IsNull(flag), e.EqualTo(flag, False)))
        return keep

    def batches(self, columns: Sequence[str], batch_rows: int,
                span: KeyRange | None = None) -> Iterator[pa.RecordBatch]:
        if self._snapshot is None:
            return
        scan = self._table.scan(row_filter=self._filter(span), selected_fields=tuple(columns),
                                snapshot_id=self._snapshot.snapshot_id)
        for batch in scan.to_arrow_batch_reader():
            for offset in range(0, batch.num_rows, batch_rows):
                yield batch.slice(offset, batch_rows)

    def estimated_rows(self) -> int | None:
        summary = self._snapshot.summary if self._snapshot is not None else None
        total = summary.get("total-records") if summary is not None else None
        return int(total) if total is not None else None

    def applied(self) -> AppliedBatch | None:
        from pyiceberg.table.snapshots import ancestors_of

        return newest_applied(
            (s.summary.get(QUERY_ID_PROPERTY), s.summary.get(BATCH_ID_PROPERTY),
             s.timestamp_ms / 1000)
            for s in ancestors_of(self._snapshot, self._table.metadata) if s.summary is not None)
