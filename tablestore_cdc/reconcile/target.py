"""The target table as reconcile (and, later, re-snapshot) reads it: its current rows, one Arrow
record batch at a time, from one pinned version, and how far the stream has applied it.

``open_target_table`` takes a ``--target`` URI as ``replicate`` does (parsed by
``tablestore_cdc.lakehouse.open_apply_sink``, which also opens the table) and returns the
reader of its format: ``DeltaTargetTable`` (``deltalake``; the batches from the commit
history) or ``IcebergTargetTable`` (``pyiceberg``; the batches from the snapshot summaries of
the pinned snapshot's ancestors). Readers only read.

The current rows: every row of an SCD type 1 table, except rows whose soft-delete column is
true (they count as deleted); of an SCD type 2 table (it has ``__START_AT`` and ``__END_AT``),
the open versions (``__END_AT IS NULL``). A key range (a re-snapshot's ``--from`` / ``--to``,
``tablestore_cdc.reconcile.keyrange.KeyRange``) is one more predicate pushed into the read:
files (Delta) and data files (Iceberg) whose column statistics lie outside it are not opened.

How far the stream has applied the table (``AppliedBatch``): the apply sink makes one commit
per streaming batch and names the batch in it (Delta: the ``txn`` action and the commit info;
Iceberg: the snapshot summary). The newest such batch, when it was committed, and when the same
query's previous batch was committed: ``tablestore_cdc.reconcile.inflight`` turns that into a
position of the change stream.
"""

from __future__ import annotations

import functools
import operator
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_common.uris import redact_uri
from tablestore_cdc.lakehouse import END_AT, START_AT, open_apply_sink
from tablestore_cdc.lakehouse.delta import BATCH_ID_KEY, QUERY_ID_KEY
from tablestore_cdc.lakehouse.iceberg import (
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
    IcebergApplySink,
    expressions,
)
from tablestore_cdc.reconcile.errors import TargetMissingError

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange

#: commits of a Delta table's history read at a time looking for the apply's two newest batches
HISTORY_PAGE = 200

#: the app id prefix of a re-snapshot's repair commit (``tablestore_cdc.resnapshot``): such a
#: commit is not a batch of the stream, and how far the stream applied is read past it
REPAIR_APP_PREFIX = "resnapshot-"


def is_repair(app_id: object) -> bool:
    """Whether a commit's app id is a re-snapshot's repair, not an apply batch."""
    return str(app_id).startswith(REPAIR_APP_PREFIX)


@dataclass(frozen=True)
class AppliedBatch:
    """The newest batch an apply query committed to the target (times: seconds since the
    epoch, the committing process's clock)."""

    app_id: str
    batch_id: int
    committed_at: float
    #: when the same query's previous batch was committed (None: this is its first)
    previous_committed_at: float | None


def newest_applied(commits: Iterable[tuple[object, object, float]],
                   whole: bool = True) -> AppliedBatch | None:
    """From ``(app id, batch id, commit time)`` of commits, newest first: the newest apply batch
    and its query's previous one. None when there is none, or (``whole`` False: more history
    exists) when the previous one may be further back."""
    newest: tuple[str, int, float] | None = None
    for app_id, batch, at in commits:
        if app_id is None or batch is None or is_repair(app_id):
            continue
        if newest is None:
            newest = (str(app_id), int(str(batch)), at)
        elif app_id == newest[0] and int(str(batch)) < newest[1]:
            return AppliedBatch(*newest, at)
    return AppliedBatch(*newest, None) if newest is not None and whole else None


class TargetTable(ABC):
    """One target table at one version. Opened by ``open_target_table``."""

    #: what reports call the target
    shown: str
    #: the pinned version: Delta's table version, Iceberg's snapshot id ("" for an empty table)
    version: str
    #: the table's columns at the pinned version
    schema: pa.Schema

    def __init__(self, shown: str, soft_delete_column: str | None) -> None:
        self.shown = shown
        self.soft_delete_column = soft_delete_column

    @property
    def scd(self) -> int:
        """2 when the table keeps versions (``__START_AT`` and ``__END_AT``), else 1."""
        names = set(self.schema.names)
        return 2 if {START_AT, END_AT} <= names else 1

    @abstractmethod
    def batches(self, columns: Sequence[str], batch_rows: int,
                span: KeyRange | None = None) -> Iterator[pa.RecordBatch]:
        """The current rows (module docstring; only ``span``'s when given), only ``columns``,
        about ``batch_rows`` a batch."""

    @abstractmethod
    def applied(self) -> AppliedBatch | None:
        """The newest batch of an apply query in the table (None: none recorded). The rows
        ``batches`` reads afterwards hold that batch (the pinned version may move forward)."""

    def estimated_rows(self) -> int | None:
        return None


class DeltaTargetTable(TargetTable):
    """A Delta Lake table (``deltalake``): the pinned version's files as a pyarrow dataset, whose
    fragments carry their files' min/max statistics, so a key range skips files unopened."""

    def __init__(self, shown: str, table: Any, soft_delete_column: str | None) -> None:
        super().__init__(shown, soft_delete_column)
        self._table = table
        self.version = str(table.version())
        self.schema = pa.schema(table.schema().to_arrow())

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
        self.schema = pa.schema(self._table.schema().to_arrow())
        return found


class IcebergTargetTable(TargetTable):
    """An Apache Iceberg table (``pyiceberg``): a scan of the pinned snapshot, whose row filter
    plans only the data files whose bounds overlap a key range."""

    def __init__(self, shown: str, table: Any, soft_delete_column: str | None) -> None:
        super().__init__(shown, soft_delete_column)
        self._table = table
        self._snapshot = table.current_snapshot()
        self.version = "" if self._snapshot is None else str(self._snapshot.snapshot_id)
        self.schema = table.schema().as_arrow()

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


def open_target_table(uri: str, soft_delete_column: str | None = None,
                      target_options: Mapping[str, str] | None = None) -> TargetTable:
    """The reader of the table at ``uri`` (any ``--target`` form: ``delta:///...``,
    ``delta+s3://...``, ``iceberg:///...?table=...``, ``iceberg://CATALOG/ns.table``; with
    replicate's ``--target-option``s as ``target_options``). ``TargetUriError`` for a bad URI,
    ``TargetMissingError`` when no table is there."""
    # parses the URI (one place for its forms) and opens the table
    sink = open_apply_sink(uri, target_options=target_options)
    table = sink.table()  # type: ignore[attr-defined]
    if table is None:
        raise TargetMissingError(target=redact_uri(uri))
    reader = IcebergTargetTable if isinstance(sink, IcebergApplySink) else DeltaTargetTable
    return reader(uri, table, soft_delete_column)
