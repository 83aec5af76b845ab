"""The target table as reconcile (and, later, re-snapshot) reads it: its current rows, one Arrow
record batch at a time, from one pinned version, and how far the stream has applied it.

``open_target_table`` takes a ``--target`` URI as ``replicate`` does (parsed by
``tablestore_cdc.lakehouse.open_apply_sink``, which also opens the table) and returns the
reader of its format, one module per format: ``target_delta`` (``deltalake``) and
``target_iceberg`` (``pyiceberg``). Readers only read.

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

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from cdc_common.uris import redact_uri
from tablestore_cdc.lakehouse import END_AT, START_AT, open_apply_sink
from tablestore_cdc.reconcile.errors import TargetMissingError

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange

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

    def __init__(self, shown: str, soft_delete_column: str | None) -> None:
        self.shown = shown
        self.soft_delete_column = soft_delete_column

    @property
    @abstractmethod
    def schema(self) -> pa.Schema:
        """The table's columns at the pinned version."""

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


def open_target_table(uri: str, soft_delete_column: str | None = None,
                      target_options: Mapping[str, str] | None = None) -> TargetTable:
    """The reader of the table at ``uri`` (any ``--target`` form: ``delta:///...``,
    ``delta+s3://...``, ``iceberg:///...?table=...``, ``iceberg://CATALOG/ns.table``; with
    replicate's ``--target-option``s as ``target_options``). ``TargetUriError`` for a bad URI,
    ``TargetMissingError`` when no table is there."""
    from tablestore_cdc.lakehouse.iceberg import IcebergApplySink
    from tablestore_cdc.reconcile.target_delta import DeltaTargetTable
    from tablestore_cdc.reconcile.target_iceberg import IcebergTargetTable

    # parses the URI (one place for its forms) and opens the table
    sink = open_apply_sink(uri, target_options=target_options)
    table = sink.table()  # type: ignore[attr-defined]
    if table is None:
        raise TargetMissingError(target=redact_uri(uri))
    reader = IcebergTargetTable if isinstance(sink, IcebergApplySink) else DeltaTargetTable
    return reader(uri, table, soft_delete_column)
