"""The ``foreachBatch`` side every target shares (driver).

``query = changes.writeStream.foreachBatch(DeltaApplySink(...)).start()``: Spark calls the sink
on the driver with each micro-batch and its batch id. The sink collects the batch to Arrow on
the driver (bound the batch with ``maxOffsetsPerTrigger``), finds the streaming query's id, and
hands both to its target (``apply``), which makes **one commit** carrying the pair
(query id, batch id) and skips a batch whose id is already recorded for that query: a batch
Spark replays after a crash changes nothing. Why the query id: it is stored in the checkpoint
and survives restarts, and a new checkpoint (batch ids from 0 again) gets a new one.

A target's commit can lose a race with another writer of the same table (optimistic
concurrency); ``apply`` then reloads the table, checks again whether the batch is already
there (the other writer may have been a zombie of this very query), plans again and retries.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_common.schema_change import DEFAULT_POLICY, IGNORE
from connector.crash_hook import crash_point
from tablestore_cdc.lakehouse.errors import (
    ApplyOptionError,
    ChangeBatchError,
    QueryIdUnknownError,
)
from tablestore_cdc.lakehouse.ownership import Marker, claim
from tablestore_cdc.lakehouse.plan import ApplyOptions, ApplyPlan, key_columns_of

log = logging.getLogger("tablestore_cdc.lakehouse")

#: Spark sets it on the thread that runs a streaming batch (``foreachBatch`` included)
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: commits tried per batch when other writers keep winning the race
COMMIT_ATTEMPTS = 5
#: from this many upserts a batch's data files are written by Spark's executors
EXECUTOR_WRITE_ROWS = 200_000
#: the key in a commit's metadata (Delta commit info, Iceberg snapshot summary) that records
#: the schema changes the commit made, "; "-separated
SCHEMA_CHANGES_PROPERTY = "tablestore-cdc.schema-changes"


@dataclass(frozen=True)
class ApplyResult:
    """What ``apply`` did with one batch."""

    batch_id: int
    #: False when the batch was already in the target (a replay) or had no effect
    committed: bool
    changes: int = 0
    upserts: int = 0
    deletes: int = 0
    #: the target version (Delta) or snapshot id (Iceberg) after the commit
    version: int | None = None
    attempts: int = 1
    #: what the batch changed in the target's schema ("add column colour string", "widen
    #: column qty int -> long"), also in the target's history and the log
    schema_changes: tuple[str, ...] = ()
    #: values written into ``_extra`` because they fit no column (a warning is logged)
    values_in_extra: int = 0
    #: the batch's keys were all new to the table: its rows were appended, not merged
    appended: bool = False
    #: the ids of the executor processes that wrote the batch's files (empty: the driver)
    written_by: tuple[int, ...] = ()
    #: the table's maintenance run after this batch (``upkeep.MaintenanceRun``; None: none due)
    maintenance: Any = None
    #: the committed batch's changes by ``_op`` (PUT, UPDATE, DELETE, READ), sorted
    ops: tuple[tuple[str, int], ...] = ()


def op_counts(batch: pa.Table) -> tuple[tuple[str, int], ...]:
    """A change batch's rows by ``_op`` (driver, the sink's ``apply``): ((op, n), ...) sorted;
    empty for a batch without ``_op``."""
    if "_op" not in batch.column_names or not batch.num_rows:
        return ()
    counted = pc.value_counts(batch.column("_op")).to_pylist()
    return tuple(sorted((str(c["values"]), int(c["counts"])) for c in counted
                        if c["values"] is not None))


class ApplySink(ABC):
    """Base of ``DeltaApplySink`` and ``IcebergApplySink``: options, ``foreachBatch`` entry,
    the conflict-retry loop. Subclasses implement ``_apply_once``, ``committed_batch`` and
    ``target_properties``.

    Options (docs/lakehouse.md, "Options"): ``key_columns``, ``scd``, ``schema_drift``
    (drift.py), ``soft_delete_column``, ``app_id``, ``widen_to_string``, ``source`` and
    ``adopt_target`` (ownership.py), ``executor_write_rows`` (the files of a batch of that
    many upserts written by the executors)."""

    def __init__(self, *, key_columns: tuple[str, ...] | list[str] | None = None,
                 scd: int = 1, schema_drift: str = DEFAULT_POLICY,
                 soft_delete_column: str | None = None, app_id: str | None = None,
                 widen_to_string: bool = False, source: str | None = None,
                 adopt_target: bool = False,
                 executor_write_rows: int | None = EXECUTOR_WRITE_ROWS) -> None:
        self.key_columns = tuple(key_columns) if key_columns else None
        self.scd, self.schema_drift = scd, schema_drift
        self.soft_delete_column = soft_delete_column
        self.app_id = app_id
        self.widen_to_string = widen_to_string
        #: the source's identity in the table's marker (ownership.py); adopt_target: take
        #: over a table this job did not create
        self.source, self.adopt_target = source or "", adopt_target
        #: an appended batch of at least this many rows has its files written by Spark's
        #: executors (in a foreachBatch; None: never), the driver making the one commit
        self.executor_write_rows = executor_write_rows
        self._spark_context: Any = None
        self.last_result: ApplyResult | None = None
        #: the job's maintenance of this table after its committed batches
        #: (``upkeep.Upkeep``, set by ``replicate``; None: none)
        self.upkeep: Any = None
        #: the job named in the table's marker when it is not the commit's ``app_id``: a
        #: re-snapshot's repair commits under its own app id for the job that owns the table
        #: (``tablestore_cdc.resnapshot.repair``)
        self.marker_job: str | None = None
        # fail at construction on a bad option (keys, when not given, come with the batch)
        self.options(self.key_columns or ("<key>",))

    def options(self, key_columns: tuple[str, ...]) -> ApplyOptions:
        return ApplyOptions(key_columns=key_columns, scd=self.scd,
                            schema_drift=self.schema_drift,
                            soft_delete_column=self.soft_delete_column,
                            widen_to_string=self.widen_to_string)

    # --- foreachBatch ------------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` function (driver)."""
        app_id = self.app_id or query_id_of(df, batch_id)
        key_columns = self.key_columns or key_columns_of(df.schema)
        if not key_columns:
            raise ApplyOptionError(option="key_columns", value=None,
                                   problem="the batch's schema marks no key column (a change "
                                   "log read back from files loses the marks)",
                                   allowed="key_columns=[...] given to the sink")
        try:
            self._spark_context = df.sparkSession.sparkContext
        except Exception:  # Spark Connect has no SparkContext: the driver writes
            self._spark_context = None
        try:
            self.apply(df.toArrow(), app_id, batch_id, key_columns)
        finally:
            self._spark_context = None

    def _executors_for(self, plan: ApplyPlan) -> Any:
        """The SparkContext whose executors write this batch's data files, or None."""
        if (self._spark_context is None or self.executor_write_rows is None
                or plan.upsert_table.num_rows < self.executor_write_rows):
            return None
        return self._spark_context

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_spark_context": None}

    # --- one batch ---------------------------------------------------------------------------

    def apply(self, batch: pa.Table, app_id: str, batch_id: int,
              key_columns: tuple[str, ...] | None = None) -> ApplyResult:
        """Apply one batch of changes (the source's output schema) exactly once."""
        options = self.options(tuple(key_columns or self.key_columns or ()))
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                result = self._apply_once(batch, app_id, batch_id, options)
            except self.conflict_errors as exc:
                if attempt == COMMIT_ATTEMPTS:
                    raise
                log.warning("batch %d: commit lost a race (%s); reloading and retrying",
                            batch_id, exc)
                continue
            if attempt > 1:
                result = dataclasses.replace(result, attempts=attempt)
            if result.committed:
                result = dataclasses.replace(result, ops=op_counts(batch))
            log.info("batch %d: %s", batch_id, result)
            if self.upkeep is not None and result.committed:  # between batches: never raises
                result = dataclasses.replace(result, maintenance=self.upkeep.after_batch(self))
            self.last_result = result
            if result.values_in_extra and options.schema_drift != IGNORE:
                _, named, table = self.source.rpartition("#")  # ENDPOINT#TABLE, as replicate
                log.warning("batch %d%s into %s: %d value(s) fit no column of the target and "
                            "were kept in _extra", batch_id, f" of table {table}" if named else "",
                            self, result.values_in_extra)
            return result
        raise AssertionError("unreachable")

    @property
    def conflict_errors(self) -> tuple[type[BaseException], ...]:
        """Exceptions that mean "another writer committed first": reload and try again."""
        return (TableCreatedMeanwhile,)

    def _marker(self, app_id: str, options: ApplyOptions) -> Marker:
        """This job's marker of the tables it writes (ownership.py)."""
        return Marker(self.source, self.marker_job or app_id, options.key_columns)

    @staticmethod
    def _batch_keys(batch: pa.Table, options: ApplyOptions) -> pa.Schema:
        """The key columns as the batch carries them (``ChangeBatchError`` if one is missing)."""
        for name in options.key_columns:
            if name not in batch.column_names:
                raise ChangeBatchError(column=name)
        return pa.schema([batch.schema.field(k) for k in options.key_columns])

    @abstractmethod
    def _apply_once(self, batch: pa.Table, app_id: str, batch_id: int,
                    options: ApplyOptions) -> ApplyResult:
        """Load the table, skip if ``batch_id`` is recorded for ``app_id``, plan, commit."""

    @abstractmethod
    def committed_batch(self, app_id: str) -> int | None:
        """The highest batch id of ``app_id`` the target holds (None: none)."""

    @abstractmethod
    def target_properties(self) -> dict[str, str] | None:
        """The target table's properties (None: the table does not exist yet)."""

    def check_target(self, app_id: str | None) -> None:
        """Refuse, before a query starts, a target this job may not write: the check every
        batch makes first (ownership.py), without the keys (not known yet). ``app_id``: the
        query id kept in the checkpoint; None for a new checkpoint (a job that wrote nothing)."""
        properties = self.target_properties()
        if properties is None:
            return
        written = app_id is not None and self.committed_batch(app_id) is not None
        claim(str(self), properties, pa.schema([]), pa.schema([]),
              Marker(self.source, app_id or "(a new query)", ()), self.adopt_target, written)

    @staticmethod
    def _before_commit() -> None:
        """The crash point once a batch's files are written, before its commit (a test may
        make another writer commit here)."""
        crash_point("before_target_commit")

    @staticmethod
    def _result(batch_id: int, plan: ApplyPlan, version: int | None, appended: bool = False,
                written_by: Iterable[int] = ()) -> ApplyResult:
        return ApplyResult(batch_id=batch_id, committed=True, changes=plan.changes,
                           appended=appended, written_by=tuple(sorted(written_by)),
                           upserts=plan.upsert_table.num_rows,
                           deletes=plan.delete_keys.num_rows + plan.close_table.num_rows,
                           version=version,
                           schema_changes=tuple(plan.layout.schema_changes()),
                           values_in_extra=plan.values_in_extra)

    @staticmethod
    def _log_schema_changes(table: str, batch_id: int, plan: ApplyPlan) -> None:
        """One log line per batch that changes the target's schema."""
        changes = plan.layout.schema_changes()
        if changes:
            log.info("table %s: schema change by batch %d: %s", table, batch_id,
                     "; ".join(changes))


class TableCreatedMeanwhile(Exception):
    """Another writer created the target between the sink's look and its own create: reload
    (and check whose it is) like any lost race."""


def query_id_of(df: Any, batch_id: int) -> str:
    """The running streaming query's id (a local property of the batch's thread)."""
    try:
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:  # Spark Connect has no SparkContext
        query_id = None
    if not query_id:
        raise QueryIdUnknownError(batch_id=batch_id)
    return str(query_id)
