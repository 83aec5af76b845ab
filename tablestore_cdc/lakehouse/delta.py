"""Apply changes into a Delta Lake table with ``deltalake`` (delta-rs; driver, no JVM).

Exactly once through Delta's **application transactions** (the ``txn`` action, what Spark's
``txnAppId`` / ``txnVersion`` write): every commit of a batch carries ``Transaction(app_id =
the streaming query id, version = the batch id)``. Before committing, the sink reads the
table's latest version for the app id (``DeltaTable.transaction_version``) and skips a batch at
or below it; the data and the ``txn`` action are one commit, so "applied" and "recorded" cannot
come apart. Two writers racing with the same batch: delta-rs' conflict check fails the later
commit (``CommitFailedError``), the sink reloads and finds the batch recorded.

One commit per batch, made on the table's version the sink read: delta-rs may not retry it
onto a later version (``max_commit_retries=0``), because its conflict check lets a commit that
removes files through when another commit removed them meanwhile (``lake optimize``'s
compaction), which would leave their rows twice; refused, the batch is re-planned.

Row changes are **copy-on-write** (``_held_files``, rewrite.py) on a table the sink may write
files of itself (``_rewritable``: local, no deletion vectors, column mapping, partitions or
enforced rules; the tables it creates): the files whose key statistics and first key column
hold one of the batch's keys are read, and one commit removes them and adds files of their
untouched rows and the batch's (SCD 1: final images, soft-deleted rows flagged; SCD 2: open
versions closed, new versions), cut into files of bounded size. Any other table, and a batch
whose files to rewrite hold more than ``rewrite.REWRITE_MAX_ROWS`` rows (copy-on-write holds
them in the driver's memory), goes through delta-rs' **MERGE** (``streamed_exec=False``: the
batch is small and in memory, and only then does delta-rs derive a pruning predicate from its
key range, layout.py):

- SCD 1: the source holds each touched key once, ``__apply`` = ``upsert`` (its final image)
  or ``delete``; matched deletes are removed (or, with a soft-delete column, flagged), matched
  upserts update every column, unmatched upserts are inserted;
- SCD 2: the source holds the batch's new versions (never matching: their merge key is null)
  and one ``close`` row per touched key whose merge key matches the key's open version
  (``__END_AT IS NULL``), which gets ``__END_AT`` = the key's first change time here.

The first batch creates the table with the job's marker (ownership.py) in one commit, then
appends its rows in the next (``_append``, with the ``txn``). New
columns (schema drift, ``drift.py``) are added by a schema-only commit just before the data's
(delta-rs' ``merge_schema`` mixes up rows when some source columns are excluded); its commit info
records the change (``tablestore-cdc.schema-changes``) and the batch; a replay after a crash
between the two finds the columns there and commits the data. delta-rs has no type widening:
a Delta column keeps its type (``drift.no_promotions``).

In an **object store** every request is retried by delta-rs itself (object_store's
``max_retries``, ``retry_timeout``, ``backoff_config.*`` storage options: 503 SlowDown, 5xx,
timeouts, connection errors of requests it may repeat). What gets through (``store_failure``)
fails the attempt, not the table: the sink reopens the table and tries the batch again
(``STORE_ATTEMPTS``), then raises the retryable ``ObjectStoreError`` (the job restarts the
query). A commit is a conditional PUT (``If-None-Match``) that delta-rs does not repeat: when
the store applied it but the answer was lost (a reset), delta-rs reports the request's
failure, and the next attempt finds the batch recorded under its app transaction and skips it
(the **ambiguous commit** is recognised, never made twice).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from cdc_common.backoff import RestartPolicy
from connector.crash_hook import crash_point
from tablestore_cdc.lakehouse import rewrite
from tablestore_cdc.lakehouse.errors import ObjectStoreError, TargetStoreRefusedError
from tablestore_cdc.lakehouse.layout import (
    file_groups,
    local_path,
    split,
    write_delta_files,
    write_delta_files_on_executors,
)
from tablestore_cdc.lakehouse.object_store import s3_filesystem, s3_location
from tablestore_cdc.lakehouse.ownership import claim
from tablestore_cdc.lakehouse.plan import CLOSE_AT, END_AT, ApplyOptions, ApplyPlan, plan_batch
from tablestore_cdc.lakehouse.pruning import candidates, comparable
from tablestore_cdc.lakehouse.rewrite import conformed, rewrite_groups, rewritten
from tablestore_cdc.lakehouse.sink import (
    SCHEMA_CHANGES_PROPERTY,
    ApplyResult,
    ApplySink,
    TableCreatedMeanwhile,
    log,
)

#: the commit-info keys naming the batch a commit applied (as the Iceberg sink's snapshot
#: summary names it); only a batch's data commit carries them
QUERY_ID_KEY = "tablestore-cdc.query-id"
BATCH_ID_KEY = "tablestore-cdc.batch-id"
#: the commit-info key of the commit that (re)marks a table as this job's (ownership.py)
ADOPTED_PROPERTY = "tablestore-cdc.marked-by"
#: the commit-info key naming the batch a schema-only commit was made for (its data follows in
#: the next commit, which alone names the batch with ``BATCH_ID_KEY``)
SCHEMA_CHANGE_BATCH_KEY = "tablestore-cdc.schema-change-of-batch"
#: the MERGE source's own columns (never written to the target)
APPLY = "__apply"
MERGE_KEY = "__merge_"
#: attempts of one batch when the object store fails a request delta-rs retried (module doc);
#: each reopens the table and checks the batch's app transaction first
STORE_ATTEMPTS = 4
#: the wait before the next attempt (seconds, doubling, jittered)
STORE_BACKOFF = RestartPolicy(first_s=0.5, max_s=4.0)
#: an object store's failure that a later attempt may not meet (in the text of delta-rs'
#: ``OSError`` or ``DeltaError``): throttled, a 5xx, a reset, a timeout
_TRANSIENT = re.compile(r"error sending request|connection (?:reset|closed|error|refused)|"
                        r"timed? ?out|\b(?:500|502|503|504|408|429) [A-Z]|SlowDown|"
                        r"Throttl|TooManyRequests|RequestTimeout|broken pipe|"
                        r"incomplete message|error decoding response body", re.IGNORECASE)
#: the store's answer that is a configuration matter however often it is asked: a refused
#: request (4xx: credentials, a missing bucket), options it cannot parse
_REFUSED = re.compile(r"\b4(?!08|29)\d\d [A-Z]|Config error|Failed to parse config|"
                      r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|NoSuchBucket")
#: the terminal colours of delta-rs' error chains
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _deltalake() -> Any:
    """``deltalake`` (a base dependency), imported when a sink first needs it."""
    import deltalake

    return deltalake


class DeltaApplySink(ApplySink):
    """``changes.writeStream.foreachBatch(DeltaApplySink("/data/orders", scd=2))``

    ``table_uri``: a path or any URI delta-rs writes (``storage_options`` for cloud stores).
    Options as ``ApplySink``."""

    def __init__(self, table_uri: str | os.PathLike[str], *,
                 storage_options: dict[str, str] | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.table_uri = str(table_uri)
        self.storage_options = storage_options
        self._table: Any = None

    @property
    def conflict_errors(self) -> tuple[type[BaseException], ...]:
        return (*super().conflict_errors, _deltalake().exceptions.CommitFailedError)

    def table(self) -> Any | None:
        """The table as it is now (``DeltaTable``), or None if it does not exist yet. Opened
        once per process and brought up to date with the commits since (``update_incremental``
        reads only those)."""
        deltalake = _deltalake()
        try:
            if self._table is not None:
                self._table.update_incremental()
                return self._table
            self._table = deltalake.DeltaTable(self.table_uri,
                                               storage_options=self.storage_options)
        except deltalake.exceptions.TableNotFoundError:
            return None
        except Exception as exc:
            if local_path(self.table_uri) is not None:
                raise
            self._table = None
            problem = store_failure(exc)
            if problem is not None:
                raise ObjectStoreError(table=self.table_uri, attempts=1,
                                       problem=problem) from exc
            refused = store_refusal(exc)
            if refused is not None:
                raise TargetStoreRefusedError(table=self.table_uri, problem=refused) from exc
            raise
        return self._table

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_table": None}

    def committed_batch(self, app_id: str) -> int | None:
        table = self.table()
        return None if table is None else table.transaction_version(app_id)

    def target_properties(self) -> dict[str, str] | None:
        table = self.table()
        return None if table is None else dict(table.metadata().configuration)

    def __str__(self) -> str:
        return self.table_uri

    def _apply_once(self, batch: pa.Table, app_id: str, batch_id: int,
                    options: ApplyOptions) -> ApplyResult:
        """One batch, tried again on the table as it is when the object store failed a
        request (module doc): a commit that landed unseen is found by its app transaction.
        A local table's errors are raised as they are (a full or read-only disk stays so)."""
        if local_path(self.table_uri) is not None:
            return self._apply_attempt(batch, app_id, batch_id, options)
        for attempt in range(1, STORE_ATTEMPTS + 1):
            try:
                return self._apply_attempt(batch, app_id, batch_id, options)
            except Exception as exc:
                problem = store_failure(exc)
                if problem is None:
                    refused = store_refusal(exc)
                    if refused is None:
                        raise
                    raise TargetStoreRefusedError(table=self.table_uri,
                                                  problem=refused) from exc
                self._table = None  # reopened: a failed call may have left it half updated
                if attempt == STORE_ATTEMPTS:
                    raise ObjectStoreError(table=self.table_uri, attempts=attempt,
                                           problem=problem) from exc
                delay = STORE_BACKOFF.delay(attempt)
                log.warning("batch %d into %s: the object store failed a request (%s); "
                            "trying the batch again in %.1f s from where the table stands",
                            batch_id, self.table_uri, problem, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _apply_attempt(self, batch: pa.Table, app_id: str, batch_id: int,
                       options: ApplyOptions) -> ApplyResult:
        deltalake = _deltalake()
        from deltalake.transaction import CommitProperties, Transaction

        table = self.table()
        marker = self._marker(app_id, options)
        recorded = None
        if table is not None:
            recorded = table.transaction_version(app_id)
            schema = pa.schema(table.schema().to_arrow())
            if claim(self.table_uri, table.metadata().configuration, schema,
                     self._batch_keys(batch, options), marker, self.adopt_target,
                     recorded is not None):  # its own commit: a replay finds it done
                log.info("table %s: marked as written by %s", self.table_uri, marker.describe())
                table.alter.set_table_properties(
                    marker.properties(), raise_if_not_exists=False,
                    commit_properties=CommitProperties(custom_metadata={
                        ADOPTED_PROPERTY: marker.job}))
        if recorded is not None and recorded >= batch_id:
            return ApplyResult(batch_id=batch_id, committed=False, changes=batch.num_rows)
        target = None if table is None else pa.schema(table.schema().to_arrow())
        plan = plan_batch(batch, target, options, self.table_uri)
        # the commit's info names the batch too (``DeltaTable.history``): how a reader that
        # does not know the query id finds how far the table is applied (``reconcile``)
        # made on the version read, or refused (module doc: no retry inside delta-rs)
        commit = CommitProperties(app_transactions=[Transaction(app_id, batch_id)],
                                  custom_metadata={QUERY_ID_KEY: app_id,
                                                   BATCH_ID_KEY: str(batch_id)},
                                  max_commit_retries=0)
        if table is None:  # created with the marker; the batch follows in its own commit
            try:
                deltalake.DeltaTable.create(
                    self.table_uri, plan.layout.schema, configuration=marker.properties(),
                    storage_options=self.storage_options, raise_if_key_not_exists=False)
            except deltalake.exceptions.DeltaError as exc:
                if self.table() is None:
                    raise
                raise TableCreatedMeanwhile(str(exc)) from exc
            appending = True
            version, writers = self._append(self.table(), plan, options, commit)
        else:
            if plan.layout.added:  # its own commit, before the data's: a replay finds it done
                self._log_schema_changes(self.table_uri, batch_id, plan)
                fields = deltalake.Schema.from_arrow(pa.schema(plan.layout.added)).fields
                table.alter.add_columns(fields, commit_properties=CommitProperties(custom_metadata={
                    SCHEMA_CHANGES_PROPERTY: "; ".join(plan.layout.schema_changes()),
                    SCHEMA_CHANGE_BATCH_KEY: f"{app_id}/{batch_id}"}))
                crash_point("after_schema_change")  # the new columns are in, the data not yet
            key = options.key_columns[0]
            local = _rewritable(table, self.storage_options)
            held = None if local is None else _held_files(table, local, plan, key)
            # every key is new: appended
            appending = not held.num_rows if held is not None else not _may_hold(table, plan, key)
            if appending:
                version, writers = self._append(table, plan, options, commit)
            elif local is not None and held is not None and _rewrite_fits(held):
                current = _read_files(local, held, pa.schema(table.schema().to_arrow()))
                groups = rewrite_groups(rewritten(current, plan, options), key)  # copy-on-write
                version, writers = self._commit_files(table, local, groups, _removes(held),
                                                      plan, options, commit)
            else:  # delta-rs' MERGE: not the sink's to rewrite, or too many rows for it
                self._before_commit()
                merge = _scd2_merge if options.scd == 2 else _scd1_merge
                merge(table, plan, options, commit)
                version, writers = table.version(), set()  # MERGE brings the table up to date
        crash_point("after_target_commit")
        return self._result(batch_id, plan, version, appended=appending, written_by=writers)

    def _append(self, table: Any, plan: ApplyPlan, options: ApplyOptions,
                commit: Any) -> tuple[int, set[int]]:
        """Append the batch's rows in one commit: as key-clustered files (layout.py,
        ``_commit_files``) when the sink may write the table's files itself (``_rewritable``),
        else with ``write_deltalake``. Returns the table's version the commit made and the ids
        of the executor processes that wrote files."""
        import deltalake

        root, filesystem = _rewritable(table, self.storage_options), None
        if root is None:  # in S3, a batch the executors write: its files by them, there
            root = s3_location(table.table_uri) if (
                self._executors_for(plan) is not None and _plain(table)) else None
            filesystem = (s3_filesystem(self.storage_options, bucket=root.split("/")[0])
                          if root is not None else None)
        if root is None:
            self._before_commit()
            deltalake.write_deltalake(table, plan.upsert_table, mode="append",
                                      commit_properties=commit)
            return table.version(), set()
        groups = file_groups(plan.upsert_table, plan.upsert_channels, options.key_columns[0])
        return self._commit_files(table, root, groups, [], plan, options, commit, filesystem)

    def _commit_files(self, table: Any, root: str, groups: list[pa.Table], removed: list[Any],
                      plan: ApplyPlan, options: ApplyOptions, commit: Any,
                      filesystem: Any = None) -> tuple[int, set[int]]:
        """One commit on the version ``table`` holds: a file per group added (written by Spark's
        executors when the batch is large enough, ``_executors_for``), the ``removed`` files
        (``RemoveAction``s) removed. ``root``: the table's directory, or with ``filesystem``
        (pyarrow's S3) its ``BUCKET/PREFIX``. Returns the version the commit made (the next
        one: ``commit`` allows delta-rs no retry onto a later version) and the ids of the
        executor processes that wrote files."""
        schema = pa.schema(table.schema().to_arrow())
        writers: set[int] = set()
        spark_context = self._executors_for(plan)
        if spark_context is not None and groups:
            pieces = split(groups, spark_context.defaultParallelism)
            actions, writers = write_delta_files_on_executors(
                spark_context, root, pieces, schema, options.key_columns, filesystem)
        else:
            actions = write_delta_files(root, groups, schema, options.key_columns, filesystem)
        self._before_commit()  # the files are written (unreferenced until the commit)
        table.create_write_transaction([*removed, *actions], "append", schema,
                                       commit_properties=commit)
        return table.version() + 1, writers


def store_failure(exc: BaseException) -> str | None:
    """What an object store's transient failure of a request says, on one line (colours and
    the error chain's arrows removed), or None for any other error. delta-rs raises a failed
    request as ``OSError`` or inside a ``DeltaError``'s text; only a failure a later attempt
    may not meet counts (``_TRANSIENT``: throttled, a 5xx, a reset, a timeout), never a
    refusal (``store_refusal``), a lost race (``CommitFailedError``), a table that is not
    there, a schema or protocol refusal. Called by the sink on the driver, after delta-rs' own
    retries of the request."""
    if isinstance(exc, ObjectStoreError):
        return str(exc.fields["problem"])
    text = _store_text(exc)
    if text is None or _REFUSED.search(text) or not _TRANSIENT.search(text):
        return None
    return text


def store_refusal(exc: BaseException) -> str | None:
    """What an object store's refusal of a request says, on one line (``_REFUSED``: a 4xx,
    storage options delta-rs cannot parse), or None for any other error."""
    text = _store_text(exc)
    return text if text is not None and _REFUSED.search(text) else None


def _store_text(exc: BaseException) -> str | None:
    """The text of delta-rs' error about a request to the store (``OSError``, ``DeltaError``
    but the table's own answers), colours and the chain's arrows removed; None otherwise."""
    exceptions = _deltalake().exceptions
    if not isinstance(exc, (OSError, exceptions.DeltaError)) or isinstance(exc, (
            FileNotFoundError, exceptions.CommitFailedError, exceptions.TableNotFoundError,
            exceptions.DeltaProtocolError, exceptions.SchemaMismatchError)):
        return None
    return " ".join(_ANSI.sub("", str(exc)).replace("\u21b3", "->").split())[:500]


def _may_hold(table: Any, plan: ApplyPlan, key: str) -> bool:
    """Whether the table may hold a key the batch touches (pruning.py), for a table the sink
    does not rewrite itself: on the local file system, whether ``_held_files`` finds a file
    holding one; on an object store, the first key column read through delta-rs' dataset when
    the files' statistics cannot rule the keys out."""
    local = local_path(table.table_uri)
    if local is not None:
        return bool(_held_files(table, local, plan, key).num_rows)
    keys = plan.touched_keys(key)
    if not _candidate_files(table, keys, key).num_rows:
        return False
    if not comparable(keys.type):
        return True
    # the files' statistics are the dataset's fragment guarantees: a file whose key range
    # holds none of the keys is not read; but Arrow compares no string with a
    # ``string_view`` (as which delta-rs' MERGE writes strings): then every file's keys
    dataset = table.to_pyarrow_dataset()
    try:
        column = dataset.to_table(columns=[key], filter=pc.field(key).isin(keys)).column(key)
    except pa.ArrowNotImplementedError:
        column = dataset.to_table(columns=[key]).column(key)
    return bool(pc.any(pc.is_in(column.cast(keys.type), value_set=keys)).as_py())


#: writer features whose rules (constraints, generated values) only a writer that enforces
#: them may write files under: such a table is changed by delta-rs' MERGE
_ENFORCED_WRITER_FEATURES = {"invariants", "checkConstraints", "generatedColumns",
                             "identityColumns"}


def _rewritable(table: Any, storage_options: dict[str, str] | None) -> str | None:
    """The local directory of a table whose files the sink may write, read and rewrite itself
    (None: the batch goes through delta-rs' writers, ``write_deltalake`` or MERGE). Its files
    must hold its rows plainly: no deletion vectors or column mapping (reader version 1), no
    partition columns, no rules a writer must enforce; tables the sink creates are such
    tables."""
    local = local_path(table.table_uri)
    if local is None or storage_options or not _plain(table):
        return None
    return local


def _plain(table: Any) -> bool:
    """Do ``table``'s files hold its rows plainly, so that the sink may add files it wrote
    itself (``_rewritable``)?"""
    protocol = table.protocol()
    metadata = table.metadata()
    return not (protocol.min_reader_version > 1 or metadata.partition_columns
                or set(protocol.writer_features or ()) & _ENFORCED_WRITER_FEATURES
                or any(k.startswith("delta.constraints.") for k in metadata.configuration))


def _held_files(table: Any, local: str, plan: ApplyPlan, key: str) -> pa.Table:
    """The ``add`` actions (``get_add_actions`` rows: path, size, row count, statistics) of the
    files that hold a key the batch touches; none: the batch's keys are all new (appended).

    The actions' statistics of the first key column rule files out (pruning.py); of the
    others, only the key column is read (a first load from hash-partitioned channels has every
    file's range span the keys, and reads no more than that) and a file is kept when it holds
    one of the keys (a key type without an order shared with the statistics: kept)."""
    import pyarrow.dataset as ds

    keys = plan.touched_keys(key)
    files = _candidate_files(table, keys, key)
    if not files.num_rows or not comparable(keys.type):
        return files
    # read as the batch's type: delta-rs' MERGE stores a string key as ``string_view`` in
    # the files it rewrote, and ``is_in`` has no kernel for a view
    only_key = pa.schema([pa.field(key, keys.type)])
    value_set = pc.unique(keys)
    holds = [bool(pc.any(pc.is_in(
        ds.dataset(_file_path(local, path), schema=only_key, format="parquet")
        .to_table(columns=[key]).column(key), value_set=value_set)).as_py())
        for path in files.column("path").to_pylist()]
    return files.filter(pa.array(holds, pa.bool_()))


def _candidate_files(table: Any, keys: pa.Array, key: str) -> pa.Table:
    """The ``add`` actions of the files whose statistics of column ``key`` may hold one of
    ``keys`` (all of them where a file has none; none when there are no keys)."""
    files = pa.table(table.get_add_actions(flatten=True))
    if not files.num_rows or not len(keys):
        return files.slice(0, 0)
    if f"min.{key}" not in files.column_names:
        return files
    return files.filter(pa.array(candidates(keys, files.column(f"min.{key}"),
                                            files.column(f"max.{key}"))))


def _rewrite_fits(files: pa.Table) -> bool:
    """Whether the rows of ``files`` (``add`` actions, by their statistics) are few enough to
    rewrite in the driver's memory (``rewrite.REWRITE_MAX_ROWS``; a file without a row count
    may be any size)."""
    if not files.num_rows:
        return True
    if "num_records" not in files.column_names or files.column("num_records").null_count:
        return False
    return int(pc.sum(files.column("num_records")).as_py()) <= rewrite.REWRITE_MAX_ROWS


def _read_files(local: str, files: pa.Table, schema: pa.Schema) -> pa.Table:
    """Every row of ``files`` with the table's columns (a column added after a file was
    written is null in its rows)."""
    import pyarrow.dataset as ds

    return ds.dataset([_file_path(local, p) for p in files.column("path").to_pylist()],
                      schema=schema, format="parquet").to_table()


def _removes(files: pa.Table) -> list[Any]:
    """The ``RemoveAction``s of ``files`` (``add`` actions), for the commit that replaces
    them."""
    from deltalake.transaction import RemoveAction

    now = int(time.time() * 1000)
    return [RemoveAction(path, True, now, size) for path, size in zip(
        files.column("path").to_pylist(), files.column("size_bytes").to_pylist(), strict=True)]


def _file_path(local: str, path: str) -> str:
    """A file's path on disk from its ``add`` action's (relative, URL-encoded) path."""
    return os.path.join(local, unquote(path))


def _predicate(key_columns: tuple[str, ...], source: str = "s.`{}`") -> str:
    return " AND ".join(f"t.`{k}` = {source.format(k)}" for k in key_columns)


def _scd1_merge(table: Any, plan: ApplyPlan, options: ApplyOptions, commit: Any) -> None:
    schema = plan.layout.schema.append(pa.field(APPLY, pa.string()))
    source = pa.concat_tables([
        _tagged(plan.upsert_table, "upsert", schema),
        _tagged(plan.delete_keys, "delete", schema)])
    if not source.num_rows:
        return
    merger = table.merge(source, _predicate(options.key_columns), source_alias="s",
                         target_alias="t", commit_properties=commit, streamed_exec=False)
    deleted, upsert = f"s.{APPLY} = 'delete'", f"s.{APPLY} = 'upsert'"
    if options.soft_delete_column:
        merger = merger.when_matched_update({f"`{options.soft_delete_column}`": "true"},
                                            predicate=deleted)
    else:
        merger = merger.when_matched_delete(predicate=deleted)
    (merger.when_matched_update_all(predicate=upsert, except_cols=[APPLY])
     .when_not_matched_insert_all(predicate=upsert, except_cols=[APPLY])
     .execute())


def _scd2_merge(table: Any, plan: ApplyPlan, options: ApplyOptions, commit: Any) -> None:
    keys = options.key_columns
    layout = plan.layout.schema
    helpers = [pa.field(APPLY, pa.string()), pa.field(CLOSE_AT, layout.field(END_AT).type),
               *[pa.field(MERGE_KEY + k, layout.field(k).type) for k in keys]]
    schema = pa.schema([*layout, *helpers])
    closes = plan.close_table.append_column(APPLY, pa.repeat("close", plan.close_table.num_rows))
    for k in keys:
        closes = closes.append_column(MERGE_KEY + k, plan.close_table.column(k))
    source = pa.concat_tables([_tagged(plan.upsert_table, "version", schema),
                               _tagged(closes, None, schema)])
    if not source.num_rows:
        return
    predicate = (_predicate(keys, "s.`" + MERGE_KEY + "{}`")
                 + f" AND t.`{END_AT}` IS NULL")
    (table.merge(source, predicate, source_alias="s", target_alias="t",
                 commit_properties=commit, streamed_exec=False)
     .when_matched_update({f"`{END_AT}`": f"s.{CLOSE_AT}"}, predicate=f"s.{APPLY} = 'close'")
     .when_not_matched_insert_all(predicate=f"s.{APPLY} = 'version'",
                                  except_cols=[f.name for f in helpers])
     .execute())


def _tagged(rows: pa.Table, apply: str | None, schema: pa.Schema) -> pa.Table:
    """``rows`` as a MERGE source of ``schema``: missing columns null, ``__apply`` set."""
    if apply is not None:
        rows = rows.append_column(APPLY, pa.repeat(apply, rows.num_rows))
    return conformed(rows, schema.remove_metadata())
