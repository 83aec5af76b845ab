"""The two queries of one table's pipeline (driver): start them, watch them, stop them.

``start_pipeline`` starts the change-log query and the apply query on any endpoint the source
reads and attaches a ``ProgressListener`` so the dashboard and ``tablestore-cdc meta`` know
Spark's batch ids and see the queries stop; ``Pipeline`` is what it returns. The apply query
records what each batch did to the target (``RecordedApply``) for the table's ``TableStatus``
(``Pipeline.table_status``), which ``replicate`` writes where the feed, the dashboard and
``meta tables`` read it, as a multi-table pipeline does for each of its tables.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_common.errors import CdcError
from cdc_common.uris import redact_uri
from connector.table_state import State
from tablestore_cdc.lakehouse.upkeep import MaintenancePolicy, Upkeep
from tablestore_cdc.reconcile.source import SourceSpec
from tablestore_cdc.resnapshot.hook import RepairRunner, RepairTarget
from tablestore_cdc.table_status import AppliedTable, TableStatus


@dataclass
class TwoQueries:
    """The change-log query and the apply query of a pipeline, watched and stopped together
    (driver); the base of ``Pipeline`` and ``multi_table.MultiTablePipeline``."""

    changelog: Any
    state_query: Any

    def check(self) -> None:
        for query in (self.changelog, self.state_query):
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")

    def drain(self) -> None:
        self.check()
        self.changelog.processAllAvailable()
        self.state_query.processAllAvailable()

    @property
    def queries(self) -> tuple[Any, Any]:
        return (self.changelog, self.state_query)

    def source_report(self) -> dict[str, Any]:
        """The source's report in the change-log query's last progress (its
        ``reportLatestOffset``: lag, and a multi-table source's table states), or {}."""
        progress = self.changelog.lastProgress
        if progress and progress.get("sources"):
            latest = progress["sources"][0].get("latestOffset")
            if isinstance(latest, str):
                try:  # PySpark before 4.2 shows the end offset here, not always as JSON
                    latest = json.loads(latest)
                except ValueError:
                    return {}
            if isinstance(latest, dict):
                return latest
        return {}

    def stop(self) -> None:
        for query in (self.changelog, self.state_query):
            query.stop()
        listener = getattr(self, "listener", None)
        if listener is not None:  # the dashboard shows "stopped" only once it is recorded
            listener.wait_terminated(timeout=10)
            spark = getattr(self, "spark", None)
            if spark is not None:  # a restarted pipeline attaches a listener of its own
                spark.streams.removeListener(listener)
                self.listener = None  # type: ignore[attr-defined]


@dataclass
class Pipeline(TwoQueries):
    """The two running queries of the pipeline and where they write (driver)."""

    #: the apply sink of the second query (``tablestore_cdc.lakehouse.ApplySink``)
    sink: Any
    target: str
    key_columns: tuple[str, ...]
    changelog_dir: Path
    delivered_by_batch: dict[int, int] = field(default_factory=dict)
    listener: Any = None  # the ProgressListener attached by start_pipeline
    spark: Any = None  # the session, to detach the listener at stop
    #: what the apply query did to the target (``RecordedApply`` fills it)
    applied: AppliedTable = field(default_factory=AppliedTable)
    #: the table's re-snapshots (``resnapshot.hook``), None with ``--engine spark``
    repairs: RepairRunner | None = None

    def run_due_repairs(self) -> int:
        """By the replication job's watch loop (driver): the table's due re-snapshots when no
        batch is being applied (``RepairRunner.when_idle``), so a quiet table is repaired
        without a write; how many ran."""
        if self.repairs is None:
            return 0
        return self.repairs.when_idle(self.sink.app_id or str(self.state_query.id))

    def poll(self) -> tuple[int, int]:
        """(changes delivered to the change log, batches) from the query's progress."""
        for progress in self.changelog.recentProgress:
            self.delivered_by_batch[progress["batchId"]] = progress["numInputRows"]
        return sum(self.delivered_by_batch.values()), len(self.delivered_by_batch)

    def applied_batch(self) -> int | None:
        """The newest batch of the apply query recorded in the target table."""
        return self.sink.committed_batch(str(self.state_query.id))

    def table_status(self, table: str, job: str) -> TableStatus:
        """The table's ``TableStatus`` (``tablestore_cdc.table_status``): the source's lag
        from Spark's progress and the apply's figures (changes applied, rows/s, last commit,
        target version, last schema change). ``replicate --table`` writes it to the meta
        store for the feed and ``meta tables``; ``job``: the output directory."""
        report = self.source_report()
        return TableStatus(table=table, job=job, selection=table, state=State.STREAMING,
                           records_behind=report.get("recordsBehindLatest"),
                           seconds_behind=report.get("secondsBehindLatest"),
                           target=redact_uri(self.target),
                           **self.applied.status_fields(time.time()))


@dataclass
class RecordedApply:
    """The apply query's ``foreachBatch`` of one table (driver): the table's due re-snapshots
    (``repairs``, under its lock, held for the whole batch: ``resnapshot.hook``), then ``sink``
    applies the batch and what it did is recorded in ``applied`` (``Pipeline.table_status``).
    ``repairs`` None: none (``--engine spark``)."""

    sink: Any
    applied: AppliedTable
    repairs: RepairRunner | None = None

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.repairs is None:
            self.sink(df, batch_id)
        else:
            from tablestore_cdc.lakehouse.sink import query_id_of

            with self.repairs.lock:
                self.repairs.before_batch(self.sink.app_id or query_id_of(df, batch_id))
                self.sink(df, batch_id)
        result = self.sink.last_result
        if result is not None and result.batch_id == batch_id:
            self.applied.record(result)


@dataclass(frozen=True)
class ApplySettings:
    """Where and how the second query applies the changes (``--target``, ``--scd``, ...)."""

    target: str
    scd: int = 1
    schema_drift: str = "lenient"
    soft_delete_column: str | None = None
    adopt_target: bool = False
    #: ``--target-option KEY=VALUE`` pairs: delta-rs storage options or Iceberg catalog
    #: properties (``tablestore_cdc.lakehouse.target``)
    target_options: tuple[tuple[str, str], ...] = ()
    #: the job's own maintenance of its targets between batches (``lakehouse.upkeep``;
    #: ``replicate --maintenance off``: ``MaintenancePolicy.off()``)
    maintenance: MaintenancePolicy = field(default_factory=MaintenancePolicy)
    #: ``replicate --engine``: embedded (the sinks of ``lakehouse.delta``/``iceberg``, on the
    #: driver) or spark (``lakehouse.spark_merge``: Spark's own MERGE, on the executors)
    engine: str = "embedded"

    def upkeep(self) -> Upkeep | None:
        """A target's maintenance schedule (one per table), None when it is off."""
        return Upkeep(self.maintenance) if self.maintenance.enabled else None


def start_pipeline(spark: Any, endpoint: str, table: str, tunnel: str, out: Path,
                   apply: ApplySettings, options: dict[str, str] | None = None,
                   trigger_ms: int = 0, *, once: bool = False) -> Pipeline:
    """Start the change-log and apply queries (driver) on any ``endpoint`` the source reads
    (``local://``, the emulator's or a service's ``http(s)://``, ``dynamodb-streams://``).

    ``once``: Trigger.AvailableNow: the change-log query reads what the source has now and
    ends (waited for here, so its error is raised here), then the apply query applies the
    whole change log and ends; ``Pipeline.queries`` are then inactive when it is done."""
    from tablestore_cdc.lakehouse import open_apply_sink
    from tablestore_cdc.lakehouse.plan import key_columns_of

    reader = (spark.readStream.format("tablestore")
              .option("endpoint", endpoint)
              .option("table.name", table).option("tunnel.name", tunnel))
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    changes = reader.load()
    # the source marks key columns non-nullable; the change log read back from files does not
    key_columns = key_columns_of(changes.schema)
    if apply.engine == "spark":
        from tablestore_cdc.lakehouse.spark_merge import open_spark_merge_sink

        sink: Any = open_spark_merge_sink(apply.target, key_columns=key_columns, scd=apply.scd,
                                          soft_delete_column=apply.soft_delete_column,
                                          source=f"{redact_uri(endpoint)}#{table}",
                                          adopt_target=apply.adopt_target)
    else:
        sink = open_apply_sink(apply.target, key_columns=key_columns, scd=apply.scd,
                               schema_drift=apply.schema_drift,
                               soft_delete_column=apply.soft_delete_column,
                               source=f"{redact_uri(endpoint)}#{table}",
                               adopt_target=apply.adopt_target,
                               target_options=dict(apply.target_options))
        sink.upkeep = apply.upkeep()
    listener = attach_listener(spark, {"endpoint": endpoint,
                                        "table.name": table, "tunnel.name": tunnel,
                                        **(options or {})})
    changelog_dir = out / "changelog"
    trigger: dict[str, Any] = ({"availableNow": True} if once
                               else {"processingTime": f"{trigger_ms} milliseconds"})
    changelog = (changes.writeStream.format("parquet").queryName("changelog")
                 .option("path", str(changelog_dir))
                 .option("checkpointLocation", str(out / "_checkpoints" / "changelog"))
                 .trigger(**trigger).start())
    if once:  # the apply query must see the whole change log of this run
        try:
            changelog.awaitTermination()
        except BaseException:
            spark.streams.removeListener(listener)
            raise
    applied = AppliedTable()
    repairs = (None if apply.engine == "spark" else  # (Spark's MERGE: no re-snapshots)
               repair_runner(sink, SourceSpec(endpoint, table, tunnel, dict(options or {})),
                             apply))
    recorded = RecordedApply(sink, applied, repairs)
    state_query = (spark.readStream.schema(changes.schema).parquet(str(changelog_dir))
                   .writeStream.queryName("apply").foreachBatch(recorded)
                   .option("checkpointLocation", str(out / "_checkpoints" / "apply"))
                   .trigger(**trigger).start())
    return Pipeline(changelog, state_query, sink, apply.target, key_columns, changelog_dir,
                    listener=listener, spark=spark, applied=applied, repairs=repairs)


def repair_target(sink: Any, spec: SourceSpec, apply: ApplySettings,
                  key_columns: tuple[str, ...] | None = None) -> RepairTarget:
    """Where a table's re-snapshot reads (``spec``) and writes: its apply ``sink``, opened with
    ``apply`` (target, soft delete column, ``--target-option``s; one table's or a multi-table
    pipeline's table's own, its target's ``key_columns`` when overridden)."""
    return RepairTarget(spec, sink, apply.target.replace("{table}", spec.table),
                        apply.soft_delete_column, dict(apply.target_options), key_columns)


def repair_runner(sink: Any, spec: SourceSpec, apply: ApplySettings) -> RepairRunner:
    """The re-snapshots of one table's job (``tablestore_cdc.resnapshot.hook``)."""
    return RepairRunner.of_table(repair_target(sink, spec, apply))


def checkpoint_query_id(checkpoint: Path) -> str | None:
    """The streaming query id Spark keeps in a checkpoint (its ``metadata`` file), or None."""
    try:
        return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def attach_listener(spark: Any, source: Any) -> Any:
    """A ``ProgressListener`` on ``spark`` (driver), so the dashboard, ``meta show`` and
    ``progress`` know Spark's batch ids and rates and see the query stop: for one table's
    source (its options, a dict) by ``start_pipeline``, or for a multi-table source (its
    ``MultiTableOptions``) by ``multi_table.start_multi_table_pipeline``, recording each
    selected table's namespace as ``for_table`` names it (a table created later included)."""
    from connector.options import SourceOptions
    from tablestore_cdc.listener import ProgressListener

    if isinstance(source, dict):
        options = SourceOptions.from_spark(source)
        # (a checkpoint of an earlier version keeps the namespace it was written in)
        namespaces: Any = {options.source_identity, options.legacy_namespace}
    else:
        options = source.common_options()  # the tables share one meta store
        namespaces = _selected_namespaces(source)
    listener = ProgressListener(options.meta_store, namespaces=namespaces,
                                credentials=options.meta_store_credentials)
    spark.streams.addListener(listener)
    return listener


def _selected_namespaces(source: Any) -> Callable[[str, str | None], bool]:
    """Whether a (namespace, table) of a multi-table query's progress is one of ``source``'s
    (a ``MultiTableOptions``): a table it selects, in the namespace its own options name
    (or their legacy form). Runs on the listener's thread; each table's answer is kept."""
    known: dict[str, frozenset[str]] = {}

    def accepts(namespace: str, table: str | None) -> bool:
        if table is None:
            return False
        if table not in known:
            try:
                own = source.for_table(table) if source.selection.matches(table) else None
            except CdcError:  # (its options do not parse: no query of it reports)
                own = None
            known[table] = (frozenset() if own is None
                            else frozenset({own.source_identity, own.legacy_namespace}))
        return namespace in known[table]

    return accepts
