"""A Delta Lake target for reconcile (``deltalake``): the pinned version's files as a pyarrow
dataset, filtered to the current rows; the apply batches from the commit history.

``to_pyarrow_dataset`` gives each file's fragment its min/max statistics as an expression, so a
key range in the dataset's filter skips the files outside it without opening them."""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from tablestore_cdc.lakehouse import END_AT
from tablestore_cdc.lakehouse.delta import BATCH_ID_KEY, QUERY_ID_KEY
from tablestore_cdc.reconcile.target import AppliedBatch, TargetTable, newest_applied

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange

#: commits of the history read at a time while looking for the apply's two newest batches
HISTORY_PAGE = 200


class DeltaTargetTable(TargetTable):
    def __init__(self, shown: str, table: Any, soft_delete_column: str | None) -> None:
        super().__init__(shown, soft_delete_column)
        self._table = table
        self.version = str(table.version())
        self._schema = pa.schema(table.schema().to_arrow())

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def _filter(self, span: KeyRange | None) -> Any:
        """The dataset filter: the range's bounds (typed as the column is), the open SCD 2
        versions, rows not soft-deleted; None: every row."""
        keep: list[Any] = []
        if span is not None:
            key, kind = pc.field(span.column), self.schema.field(span.column).type
            if span.key_from is not None:
                keep.append(key >= pa.scalar(span.key_from).cast(kind))
            if span.key_to is not None:
                keep.append(key < pa.scalar(span.key_to).cast(kind))
        if self.scd == 2:
            keep.append(pc.field(END_AT).is_null())
        flag = self.soft_delete_column
        if flag is not None and flag in self.schema.names:
            keep.append(pc.field(flag).is_null() | ~pc.field(flag))
        return functools.reduce(operator.and_, keep) if keep else None

    def batches(self, columns: Sequence[str], batch_rows: int,
                span: KeyRange | None = None) -> Iterator[pa.RecordBatch]:
        dataset = self._table.to_pyarrow_dataset()
        yield from dataset.to_batches(columns=list(columns), filter=self._filter(span),
                                      batch_size=batch_rows)

    def estimated_rows(self) -> int | None:
        try:
            actions = pa.table(self._table.get_add_actions(flatten=True))
            return int(pc.sum(actions.column("num_records")).as_py() or 0)
        except Exception:  # only a progress bar's total
            return None

    def applied(self) -> AppliedBatch | None:
        """The newest apply batch in the history, the pinned version moved to hold it.

        ``DeltaTable.history`` reads the log from its newest commit, not from the version the
        object holds (deltalake 1.6): a batch committed since the table was opened is named
        while the pinned files lack it. The version is therefore moved to the newest commit
        once the history is read, so the rows compared hold every batch the history named (a
        newer target only labels more differences in flight, never fewer:
        ``tablestore_cdc.reconcile.inflight``). ``reconcile_table`` calls this before it reads
        the rows."""
        limit = HISTORY_PAGE
        while True:
            history = self._table.history(limit=limit)
            whole = len(history) < limit
            found = newest_applied(((c.get(QUERY_ID_KEY), c.get(BATCH_ID_KEY),
                                     float(c["timestamp"]) / 1000) for c in history), whole)
            if found is not None or whole:
                break
            limit *= 4
        self._table.update_incremental()
        self.version = str(self._table.version())
        self._schema = pa.schema(self._table.schema().to_arrow())
        return found

