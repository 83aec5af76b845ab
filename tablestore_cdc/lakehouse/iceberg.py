"""Apply changes into an Apache Iceberg table with ``pyiceberg`` (driver, no JVM).

Exactly once through the **snapshot summary** and the catalog's optimistic concurrency: every
snapshot a batch makes carries ``tablestore-cdc.query-id`` and ``tablestore-cdc.batch-id``.
Before committing, the sink walks the table's snapshots from the current one back to the
newest of its query and skips a batch at or below the batch id recorded there. The batch's
snapshot (an overwrite or an append, and a schema change if columns are added) is one catalog
commit that requires the table's current snapshot to be the one the sink read
(``AssertRefSnapshotId``); if another writer committed meanwhile the catalog refuses
(``CommitFailedException``), and the sink reloads, checks the summary again and re-plans.

Row-level changes are copy-on-write of the data files that may hold the batch's keys
(``_held_files``, rewrite.py; ``pyiceberg`` writes no delete files): the files whose bounds
of the first key column hold one of the batch's keys are read once and replaced, in one
overwrite snapshot, by files of their rows without the touched keys' rows, with

- SCD 1: the final images (with a soft-delete column, keys deleted here without an image in
  the batch keep their current row, flagged);
- SCD 2: the touched keys' open versions (``__END_AT IS NULL``) closed (``__END_AT`` = the
  key's first change time here) and the new versions.

A batch whose keys are all new to the table is only appended (pruning.py), as key-clustered
files (layout.py). A batch of ``executor_write_rows`` upserts has its data files written by
Spark's executors, the driver adding them to the one snapshot (``_write_on_executors``). What
pyiceberg reads again and again is read once: the staged metadata (``_transaction``), each
manifest's entries (manifests.py).

The default catalog is pyiceberg's SQL catalog on a SQLite file (``open_apply_sink``:
``iceberg:///abs/warehouse?table=ns.name``); any catalog ``pyiceberg.catalog.load_catalog``
accepts can be passed as properties.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connector.crash_hook import crash_point
from tablestore_cdc.lakehouse.drift import iceberg_promotions
from tablestore_cdc.lakehouse.errors import TargetDependencyError, TargetUriError
from tablestore_cdc.lakehouse.layout import file_groups, from_ipc, split, to_ipc
from tablestore_cdc.lakehouse.manifests import reuse_entries
from tablestore_cdc.lakehouse.ownership import claim
from tablestore_cdc.lakehouse.plan import ApplyOptions, ApplyPlan, plan_batch
from tablestore_cdc.lakehouse.pruning import candidates, comparable
from tablestore_cdc.lakehouse.rewrite import conformed, rewrite_groups, rewritten
from tablestore_cdc.lakehouse.sink import SCHEMA_CHANGES_PROPERTY, ApplyResult, ApplySink, log

QUERY_ID_PROPERTY = "tablestore-cdc.query-id"
BATCH_ID_PROPERTY = "tablestore-cdc.batch-id"
#: pyiceberg retries a refused commit itself by rebasing the transaction's snapshots onto the
#: new head, which would commit a batch a zombie attempt already committed (appends rebase
#: cleanly): the sink's own retry re-checks the summary first, so the table property turns
#: pyiceberg's off (set with the job's marker, ownership.py)
NO_LIBRARY_RETRY = "commit.retry.num-retries"


#: the table properties a new table gets so that its commits keep its manifests few: Iceberg's
#: own merge settings (pyiceberg leaves merging off by default, Java merges at 100 manifests).
#: Every manifest is read about three times a batch (the batch's scan plan, the overwrite's
#: search for the files it replaces, twice), so their number bounds a batch's cost
#: (``_keep_manifests_few``); a merge rewrites at most this many small manifests as one
MANIFEST_MERGING = {"commit.manifest-merge.enabled": "true",
                    "commit.manifest.min-count-to-merge": "8"}

#: the table properties that keep a stream's metadata files few, set by the sink on the tables
#: it writes where they are absent (in a batch's own commit): every commit writes the table's
#: whole metadata as a new JSON file (about 0.8 KB a snapshot kept), and Iceberg keeps every
#: earlier file unless told otherwise, so a stream's metadata grew with the square of its
#: batches (92 MB after 450 batches; tens of GB a day at a batch every 10 s). Iceberg's own
#: settings make each commit delete the files beyond the newest ``previous-versions-max``
METADATA_CLEANUP = {"write.metadata.delete-after-commit.enabled": "true",
                    "write.metadata.previous-versions-max": "10"}


def _pyiceberg() -> Any:
    """``pyiceberg``, which the ``lakehouse`` extra brings (the base install does not)."""
    try:
        import pyiceberg.catalog
    except ImportError as exc:
        raise TargetDependencyError(target="Iceberg", package="pyiceberg",
                                    install="pip install 'tablestore-cdc[lakehouse]'") from exc
    return pyiceberg


def sqlite_catalog_properties(warehouse: str, catalog_db: str | None = None) -> dict[str, str]:
    """pyiceberg SQL-catalog properties: the catalog in a SQLite file (default
    ``<warehouse>/catalog.db``), data and metadata files under ``warehouse`` (absolute path)."""
    db = catalog_db or f"{warehouse.rstrip('/')}/catalog.db"
    return {"type": "sql", "uri": f"sqlite:///{db}", "warehouse": f"file://{warehouse}"}


class IcebergApplySink(ApplySink):
    """``changes.writeStream.foreachBatch(IcebergApplySink(props, "cdc.orders", scd=2))``

    ``catalog_properties``: what ``pyiceberg.catalog.load_catalog`` takes (see
    ``sqlite_catalog_properties``); ``identifier``: ``namespace.table`` (the namespace is created
    if missing). Options as ``ApplySink``."""

    def __init__(self, catalog_properties: Mapping[str, str], identifier: str,
                 *, catalog_name: str = "tablestore_cdc", **options: Any) -> None:
        super().__init__(**options)
        _pyiceberg()  # a missing extra fails here, where the sink is made, not in a batch
        self.catalog_properties = dict(catalog_properties)
        self.catalog_name = catalog_name
        self.identifier = identifier
        self._catalog: Any = None

    @property
    def conflict_errors(self) -> tuple[type[BaseException], ...]:
        from pyiceberg.exceptions import (
            CommitFailedException,
            TableAlreadyExistsError,
            ValidationException,
        )

        return (*super().conflict_errors, CommitFailedException, TableAlreadyExistsError,
                ValidationException)

    def catalog(self) -> Any:
        """The catalog, opened once per process (not pickled with the sink)."""
        if self._catalog is None:
            uri = self.catalog_properties.get("uri", "")
            if uri.startswith("sqlite:///"):  # a new SQLite catalog: its directory must exist
                Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            try:
                self._catalog = _pyiceberg().catalog.load_catalog(self.catalog_name,
                                                                  **self.catalog_properties)
            except ValueError:  # pyiceberg's word for a catalog it cannot make
                raise TargetUriError(uri=f"iceberg://{self.catalog_name}/{self.identifier}",
                                     problem="pyiceberg could not open the catalog: its "
                                     "type or a required property is missing (pyiceberg's "
                                     "message is not shown: it lists the properties, "
                                     "secrets included)",
                                     allowed="a catalog pyiceberg's configuration names") \
                    from None
        return self._catalog

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_catalog": None}

    def table(self) -> Any | None:
        """The table as it is now (``pyiceberg.table.Table``), or None if it does not exist."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog().load_table(self.identifier)
        except NoSuchTableError:
            return None

    def committed_batch(self, app_id: str) -> int | None:
        table = self.table()
        return None if table is None else committed_batch(table, app_id)

    def target_properties(self) -> dict[str, str] | None:
        table = self.table()
        return None if table is None else dict(table.properties)

    def __str__(self) -> str:
        return self.identifier

    def _apply_once(self, batch: pa.Table, app_id: str, batch_id: int,
                    options: ApplyOptions) -> ApplyResult:
        table = self.table()
        marker = self._marker(app_id, options)
        marking = False
        if table is not None:
            recorded = committed_batch(table, app_id)
            marking = claim(self.identifier, table.properties, table.schema().as_arrow(),
                            self._batch_keys(batch, options), marker, self.adopt_target,
                            recorded is not None)
            if recorded is not None and recorded >= batch_id:
                return ApplyResult(batch_id=batch_id, committed=False, changes=batch.num_rows)
        target = None if table is None else table.schema().as_arrow()
        plan = plan_batch(batch, target, options, self.identifier, iceberg_promotions)
        if table is None:  # created with the marker; the batch follows in its own commit
            catalog = self.catalog()
            catalog.create_namespace_if_not_exists(self.identifier.rpartition(".")[0])
            table = catalog.create_table(self.identifier, schema=plan.layout.schema,
                                         properties={NO_LIBRARY_RETRY: "0",
                                                     **MANIFEST_MERGING, **METADATA_CLEANUP,
                                                     **marker.properties()})
        summary = {QUERY_ID_PROPERTY: app_id, BATCH_ID_PROPERTY: str(batch_id)}
        transaction = _transaction(table)
        if marking:  # an adopted table (or one of this job from before markers)
            log.info("table %s: marked as written by %s", self.identifier, marker.describe())
            transaction.set_properties({NO_LIBRARY_RETRY: "0", **marker.properties()})
        # a table from before the setting (one that has its own value keeps it)
        if cleanup := {k: v for k, v in METADATA_CLEANUP.items() if k not in table.properties}:
            log.info("table %s: old metadata files deleted after each commit (%s)",
                     self.identifier, ", ".join(f"{k}={v}" for k, v in cleanup.items()))
            transaction.set_properties(cleanup)
        if plan.layout.added or plan.layout.promoted:  # in the batch's own catalog commit
            self._log_schema_changes(self.identifier, batch_id, plan)
            summary[SCHEMA_CHANGES_PROPERTY] = "; ".join(plan.layout.schema_changes())
            _change_schema(transaction, plan)
            crash_point("after_schema_change")  # staged: the table is unchanged until commit
        schema = transaction.table_metadata.schema().as_arrow()
        reuse_entries(table)  # manifests read once, not by the scan plan and again to commit
        replaced, current = _held_files(table, plan, options.key_columns[0])
        appending = current is None
        if appending:  # every key is new to the table: append, nothing to delete or close
            groups = file_groups(plan.upsert_table, plan.upsert_channels,
                                 options.key_columns[0])
        else:
            groups = rewrite_groups(rewritten(current, plan, options),
                                    options.key_columns[0])
        if (not replaced and not groups and not summary.get(SCHEMA_CHANGES_PROPERTY)
                and not marking):
            return ApplyResult(batch_id=batch_id, committed=False, changes=plan.changes)
        writers: set[int] = set()
        if replaced or groups:
            writers = _write_files(transaction, replaced, groups, schema, table.io, summary,
                                   self._executors_for(plan))
        self._before_commit()  # data files written, the catalog not yet pointed at them
        table = transaction.commit_transaction()
        crash_point("after_target_commit")
        snapshot = table.current_snapshot()
        return self._result(batch_id, plan, None if snapshot is None else snapshot.snapshot_id,
                            appended=appending, written_by=writers)


def _transaction(table: Any) -> Any:
    """``table.transaction()`` whose ``table_metadata`` (the table's metadata with the staged
    changes applied) is computed once per staged change and then shared.

    pyiceberg's ``Transaction.table_metadata`` applies the staged changes and deep-copies the
    result at every read, and its snapshot producer reads it about twenty times a commit: a
    copy of every snapshot's summary each time, a cost that grows with the table's history
    (0.12 s of a ~0.6 s stream batch at 30 snapshots). The metadata models are frozen
    (pydantic) and neither pyiceberg nor the sink changes one in place, so the copy protects
    nothing here. With nothing staged it is the table's metadata itself; else the cache is keyed
    on the objects the property reads (the table's metadata and the staged updates, a tuple
    replaced at every stage). Without those attributes (another pyiceberg), the plain
    transaction."""
    transaction = _metadata_once_transaction()(table)
    if not (hasattr(transaction, "_table") and hasattr(transaction, "_updates")):
        return table.transaction()
    return transaction


@functools.cache
def _metadata_once_transaction() -> Any:
    """The subclass of pyiceberg's ``Transaction`` that ``_transaction`` makes."""
    from pyiceberg.table import Transaction

    class MetadataOnceTransaction(Transaction):
        @property
        def table_metadata(self) -> Any:
            if not self._updates:  # nothing staged: the table's own metadata
                return self._table.metadata
            state = (self._table.metadata, self._updates)
            cached = self.__dict__.get("_staged_metadata")
            if cached is None or cached[0][0] is not state[0] or cached[0][1] is not state[1]:
                cached = (state, Transaction.table_metadata.fget(self))  # type: ignore[attr-defined]
                self.__dict__["_staged_metadata"] = cached
            return cached[1]

    return MetadataOnceTransaction


def _change_schema(transaction: Any, plan: ApplyPlan) -> None:
    """Add the plan's new columns and promote its widened ones (Iceberg's type promotion:
    ``drift.iceberg_promotions`` widens only to long and double)."""
    from pyiceberg.types import DoubleType, LongType

    wider_types = {pa.int64(): LongType(), pa.float64(): DoubleType()}
    with transaction.update_schema() as update:
        if plan.layout.added:
            update.union_by_name(pa.schema(plan.layout.added))
        for name, (_, wider) in plan.layout.promoted.items():
            update.update_column(name, field_type=wider_types[wider])


def committed_batch(table: Any, app_id: str) -> int | None:
    """The batch id in the newest snapshot of ``app_id`` on the table's main branch."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        if summary is not None and summary.get(QUERY_ID_PROPERTY) == app_id:
            return int(str(summary.get(BATCH_ID_PROPERTY)))
    return None


def _write_files(transaction: Any, replaced: list[Any], groups: list[pa.Table],
                 schema: pa.Schema, io: Any, summary: dict[str, str],
                 spark_context: Any = None) -> set[int]:
    """One snapshot: the ``replaced`` files' scan tasks removed (an overwrite; none: a fast
    append) and a data file per group added (each sorted by key, layout.py), written by
    pyiceberg's own writer (the one ``Transaction.append`` uses) so that the files carry
    Iceberg's field ids and bounds — by Spark's executors when ``spark_context`` is given
    (``_write_on_executors``). Returns the ids of the executor processes that wrote files."""
    metadata = transaction.table_metadata
    groups = [conformed(group, schema) for group in groups]
    writers: set[int] = set()
    if spark_context is not None and groups:
        data_files, writers = _write_on_executors(spark_context, metadata, io, groups)
    else:
        data_files = [data_file for group in groups
                      for data_file in _data_files(metadata, group, io)]
    update = transaction.update_snapshot(snapshot_properties=summary)
    with (update.overwrite() if replaced else update.merge_append()) as snapshot:
        if replaced:
            _keep_manifests_few(snapshot, metadata.properties)
        for task in replaced:
            snapshot.delete_data_file(task.file)
        for data_file in data_files:
            snapshot.append_data_file(data_file)
    return writers


def _data_files(metadata: Any, rows: pa.Table, io: Any) -> list[Any]:
    """``rows`` written as data files of the table ``metadata`` describes (pyiceberg's writer,
    files of the table's target size) and their ``DataFile`` entries."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    return list(_dataframe_to_data_files(metadata, rows, io))


def _write_on_executors(spark_context: Any, metadata: Any, io: Any, groups: list[pa.Table]
                        ) -> tuple[list[Any], set[int]]:
    """``_data_files`` of each of ``groups`` (cut into at least ``defaultParallelism`` pieces)
    in a Spark task of its own (the rows shipped as Arrow IPC, the table's metadata as its
    JSON, the file IO as its properties); the ``DataFile`` entries come back to the driver,
    which makes the one snapshot. A batch killed before its commit leaves only files no
    snapshot references."""
    pieces = split(groups, spark_context.defaultParallelism)
    tasks = [(metadata.model_dump_json(), dict(io.properties), to_ipc(piece))
             for piece in pieces]
    written = spark_context.parallelize(tasks, len(tasks)).map(_executor_write).collect()
    return [f for files, _ in written for f in files], {pid for _, pid in written}


def _executor_write(task: tuple[str, dict[str, str], bytes]) -> tuple[list[Any], int]:
    """One Spark task (executor): a piece's data files; returns their entries and this
    process's id."""
    import os

    from pyiceberg.io import load_file_io
    from pyiceberg.table.metadata import TableMetadataUtil

    metadata_json, io_properties, rows = task
    metadata = TableMetadataUtil.parse_raw(metadata_json)
    io = load_file_io(properties=io_properties, location=metadata.location)
    return _data_files(metadata, from_ipc(rows), io), os.getpid()


def _keep_manifests_few(overwrite: Any, properties: dict[str, str]) -> None:
    """Make pyiceberg's overwrite ``overwrite`` (a snapshot producer) drop the manifests that
    hold no live file and merge the others as its appends do (``merge_append``).

    pyiceberg's overwrite carries every manifest of the parent snapshot over, the ones that
    only record files deleted by an earlier snapshot included (its appends drop those), and
    never merges: each overwrite adds two manifests for good, and every later batch reads them
    all, a cost that grew with every batch of a stream. Dropped and merged as Iceberg's Java
    writer does (``MergingSnapshotProducer``), with pyiceberg's own merge (the table's
    ``commit.manifest-merge.enabled``, ``commit.manifest.min-count-to-merge`` and
    ``commit.manifest.target-size-bytes``), which keeps the files this snapshot deletes. The
    producer's ``_process_manifests`` is the step pyiceberg provides for this (its merging
    append overrides it); with another pyiceberg that lacks it, the overwrite is left as is."""
    try:
        from pyiceberg.manifest import ManifestContent
        from pyiceberg.table import TableProperties
        from pyiceberg.table.update.snapshot import _ManifestMergeManager
        from pyiceberg.utils.properties import property_as_bool, property_as_int
    except ImportError:
        return
    if not hasattr(overwrite, "_process_manifests"):
        return
    target_size = property_as_int(properties, TableProperties.MANIFEST_TARGET_SIZE_BYTES,
                                  TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT)
    min_count = property_as_int(properties, TableProperties.MANIFEST_MIN_MERGE_COUNT,
                                TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT)
    merge = _ManifestMergeManager(
        target_size_bytes=target_size or TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT,
        min_count_to_merge=min_count or TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT,
        merge_enabled=property_as_bool(properties, TableProperties.MANIFEST_MERGE_ENABLED,
                                       TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT),
        snapshot_producer=overwrite)

    def process(manifests: list[Any]) -> list[Any]:
        live = [m for m in manifests if m.has_added_files() or m.has_existing_files()
                or m.added_snapshot_id == overwrite.snapshot_id]
        return (merge.merge_manifests([m for m in live if m.content == ManifestContent.DATA])
                + [m for m in live if m.content != ManifestContent.DATA])

    overwrite._process_manifests = process


def _held_files(table: Any, plan: ApplyPlan, key: str) -> tuple[list[Any], pa.Table | None]:
    """The scan tasks of the data files that may hold a key the batch touches, and their rows
    (read whole, once, with pyiceberg's reader: field ids, schema evolution, position
    deletes); ``([], None)`` when the table holds none of the keys (pruning.py): the batch is
    appended.

    One scan plan a batch: the files whose bounds of the first key column meet the span
    between the batch's lowest and highest key (a range binds at once where thousands of keys
    would not), then, of those, the files whose bounds hold one of the keys; the first key
    column of their rows says whether a key is there (a key type without an order Arrow
    shares with the bounds is taken as there)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    if table.current_snapshot() is None:
        return [], None
    e = expressions()
    keys = plan.touched_keys(key)
    if not len(keys):
        return [], None
    bounds = pc.min_max(keys)
    span = e.And(e.GreaterThanOrEqual(key, bounds["min"].as_py()),
                 e.LessThanOrEqual(key, bounds["max"].as_py()))
    field = table.schema().find_field(key)
    tasks = list(table.scan(row_filter=span).plan_files())
    lows, highs = [], []
    for task in tasks:
        low = (task.file.lower_bounds or {}).get(field.field_id)
        high = (task.file.upper_bounds or {}).get(field.field_id)
        lows.append(None if low is None else from_bytes(field.field_type, low))
        highs.append(None if high is None else from_bytes(field.field_type, high))
    held = [task for task, may in zip(tasks, candidates(keys, lows, highs), strict=True) if may]
    if not held:
        return [], None
    current = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(held)
    if comparable(keys.type) and not pc.any(pc.is_in(
            current.column(key), value_set=keys.cast(current.schema.field(key).type))).as_py():
        return [], None
    return held, current


def expressions() -> Any:
    """``pyiceberg.expressions`` (its classes take positional terms at run time; typed as Any
    because their pydantic signatures say otherwise)."""
    import pyiceberg.expressions

    return pyiceberg.expressions
