"""The replication pipeline of a selection of tables (one table is a selection of one):
one source query over the selection, one apply per table (driver).

``start_pipeline`` starts a query over a multi-table source (``connector.multiplex``) whose
``foreachBatch`` (``MultiTableApply``) writes each batch it reads to the change log
(``<out>/changelog/batch-<id>.parquet``, generic rows: ``connector.generic_rows``; the same
file again on a replay) while it splits it by ``_table`` and applies each table's rows into
its own target, named by a template (``delta:///lake/{table}``): one commit per table per batch,
each carrying the query's (query id, batch id) pair, so a replayed batch changes nothing in a
table that holds it. That is ``cycle="one"``, the default for a new output; docs/protocol.md,
"One cycle from change to table", argues why it is exactly once.

``cycle="two"`` (``replicate --cycle two``, and every output written before the choice
existed) starts two queries instead: the change-log query writes the batches into the change
log through Spark's file sink, and the apply query reads its files back and applies them the
same way, under its own (query id, batch id).

A table whose target refuses a batch is *failed* (``<out>/_tables/<table>.failed``, the reason)
and its rows of that batch and of every later one are held in ``<out>/_held/<table>/`` (one
Parquet file per batch, written before the batch commits) while the other tables go on; a
restart first applies them (``resume_held``), so the table resumes exactly where it stopped. A
*retryable* error of a table's apply (``CdcError.retryable``) fails no table: it fails the
batch, and the job's restart applies the replay exactly (each target's batch marker skips what
it holds). Docs: docs/multi-table.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_common.backoff import RestartPolicy
from cdc_common.errors import CdcError
from cdc_common.uris import redact_uri
from connector import generic_rows
from connector.crash_hook import crash_point
from connector.table_state import State, TableState
from tablestore_cdc.pipeline.failures import QueryFailure, table_failure
from tablestore_cdc.pipeline.output import JobOutput
from tablestore_cdc.pipeline.queries import (
    APPLY_CHECKPOINT,
    ApplySettings,
    attach_listener,
    checkpoint_query_id,
    choose_cycle,
    open_table_sink,
    repair_target,
)
from tablestore_cdc.reconcile.source import SourceSpec
from tablestore_cdc.resnapshot.hook import RepairRunner, RepairTarget
from tablestore_cdc.table_status import AppliedTable, TableStatus

log = logging.getLogger("tablestore_cdc.pipeline")
#: under the output: a failed table's reason (``<table>.failed``), its held batches
_FAILED, _HELD = "_tables", "_held"


@dataclass
class MultiTableApply:
    """The ``foreachBatch`` of a multi-table pipeline (module docstring); runs on the driver.

    ``settings.target`` is a template holding ``{table}``; ``source``: the endpoint as shown,
    each table's target marker names ``<source>#<table>``; ``out``: where failed tables and
    their held batches are kept (a ``JobOutput`` or a local path).

    ``settings.engine`` ``spark`` (``replicate --engine spark``): the batch is not collected;
    each table's rows are typed by Spark (``lakehouse.spark_rows``) and merged by Spark's own
    MERGE (``lakehouse.spark_merge``) on the executors, the driver collecting only the batch's
    distinct (``_table``, ``_schema``) pairs. A table whose own settings (``per_table``) say
    ``embedded`` is collected and applied by the embedded sink. A failed table's rows are
    collected to be held, and its held batches are merged again by Spark when it resumes."""

    settings: ApplySettings
    source: str
    out: JobOutput | Path
    #: builds a table's apply sink (a test may pass its own); default: open_apply_sink
    open_sink: Callable[..., Any] | None = None
    #: a table's own settings and key override (``table_config.TableConfig.for_table``);
    #: None: ``settings`` for every table
    per_table: Callable[[str], tuple[ApplySettings, tuple[str, ...] | None]] | None = None
    tables: dict[str, AppliedTable] = field(default_factory=dict)
    _sinks: dict[str, Any] = field(default_factory=dict)
    #: ``out`` as a ``JobOutput``
    output: JobOutput = field(init=False, repr=False)
    #: a table's source as the job reads it (``table_sources``), for its re-snapshots; None:
    #: no re-snapshots (a test's apply)
    spec_of: Callable[[str], SourceSpec] | None = None
    #: tables whose signals are looked at even before a batch of them: those the selection
    #: names without a glob (``named_tables``) and those the source reports
    #: (``Pipeline.run_due_repairs``)
    known: set[str] = field(default_factory=set)
    #: the tables' re-snapshots (``resnapshot.hook``), made from ``spec_of``
    repairs: RepairRunner | None = None
    #: the newest batch this run applied (Spark calls ``foreachBatch`` for batches with data)
    applied_batch_id: int | None = None
    #: the one-cycle pipeline (module docstring): each batch is logged as it is applied
    writes_changelog: bool = False

    def __post_init__(self) -> None:
        self.output = JobOutput.of(self.out)
        for name in self.output.names(_FAILED, suffix=".failed"):
            reason = (self.output.read_bytes(_FAILED, name) or b"").decode(errors="replace")
            self.tables[name.removesuffix(".failed")] = AppliedTable(State.FAILED, reason)
        if self.spec_of is not None and self.repairs is None:
            self.repairs = RepairRunner(self.repair_tables, self.spec_of, self.repair_target,
                                        in_stream=self.writes_changelog)

    def repair_tables(self) -> list[str]:
        """The tables whose re-snapshot signals a look reads: every table applied or failed
        in this run and the ``known`` ones."""
        return sorted(set(self.tables) | self.known)

    def repair_target(self, table: str) -> RepairTarget | None:
        """Where ``table``'s re-snapshot reads and writes: its source, its own sink, target
        and settings; None for a failed table (its held batches come first: its signals wait
        until it resumes) or without ``spec_of``."""
        status = self.tables.get(table)
        if self.spec_of is None or (status is not None and status.state is State.FAILED):
            return None
        settings, keys = self.settings_of(table)
        if settings.engine == "spark":  # re-snapshots write through the embedded sink
            return None
        return repair_target(self.sink(table), self.spec_of(table), settings, keys)

    def settings_of(self, table: str) -> tuple[ApplySettings, tuple[str, ...] | None]:
        """``table``'s apply settings and its target's key columns when overridden."""
        return self.per_table(table) if self.per_table is not None else (self.settings, None)

    def target_of(self, table: str) -> str:
        return self.settings_of(table)[0].target.replace("{table}", table)

    def sink(self, table: str, key_columns: tuple[str, ...] | None = None) -> Any:
        """``table``'s apply sink, opened at its first use (driver). The Spark engine's
        (``spark_merge.open_spark_merge_sink``) takes its key columns when opened: the
        table's override, else ``key_columns`` (its declared key, ``spark_rows.decode``)."""
        if table not in self._sinks:
            s, keys = self.settings_of(table)
            if s.engine == "spark":
                from tablestore_cdc.lakehouse.spark_merge import open_spark_merge_sink

                self._sinks[table] = open_spark_merge_sink(
                    self.target_of(table), key_columns=keys or key_columns, scd=s.scd,
                    soft_delete_column=s.soft_delete_column, source=f"{self.source}#{table}",
                    adopt_target=s.adopt_target)
                return self._sinks[table]  # (this engine runs no maintenance)
            self._sinks[table] = open_table_sink(s, table, self.source, keys, self.open_sink)
            self._sinks[table].upkeep = s.upkeep()
        return self._sinks[table]

    def __call__(self, df: Any, batch_id: int) -> None:
        """Spark's ``foreachBatch`` call: the due re-snapshots of the tables, then the batch,
        under the re-snapshots' lock (``resnapshot.hook``: one writer's commits in turn)."""
        from tablestore_cdc.lakehouse.sink import query_id_of

        app_id = query_id_of(df, batch_id)
        if self.repairs is None:
            self._apply_frame(df, app_id, batch_id)
        else:
            with self.repairs.lock:
                self.repairs.before_batch(app_id)
                self._apply_frame(df, app_id, batch_id)
        self.applied_batch_id = batch_id

    def _apply_frame(self, df: Any, app_id: str, batch_id: int) -> None:
        """One batch as Spark gives it: collected and applied by the embedded sinks, or with
        the Spark engine (class docstring) each table's rows filtered, typed and merged by
        Spark; the batch is cached on the executors while its tables are applied."""
        if self.settings.engine != "spark":
            batch = df.toArrow()
            logs = self.writes_changelog and batch.num_rows  # (a table's join batch: no rows)
            # logged while the tables are applied, on the core the executors leave idle; the
            # batch ends when both have (docs/protocol.md: a replay redoes either)
            with ThreadPoolExecutor(1, thread_name_prefix="changelog") as writer:
                logged = writer.submit(self._log_changes, batch, batch_id) if logs else None
                self.apply_batch(batch, app_id, batch_id)
            return None if logged is None else logged.result()
        from pyspark.sql import functions as F

        from tablestore_cdc.lakehouse.spark_rows import declared_schemas

        df = df.persist()
        try:
            if self.writes_changelog:
                self._log_changes(df, batch_id)
            declared = declared_schemas(df)
            self._apply_tables(sorted(declared),
                               lambda t: _SparkRows(df.where(F.col("_table") == t), declared[t]),
                               app_id, batch_id)
        finally:
            df.unpersist()

    def _log_changes(self, batch: pa.Table | Any, batch_id: int) -> None:
        """The one-cycle change log: ``batch`` (Arrow, or the Spark engine's DataFrame) as
        ``changelog/batch-<id>``, written whole (a replay: the same file again)."""
        name = f"batch-{batch_id:012d}"
        if isinstance(batch, pa.Table):
            self.output.write_parquet(batch, "changelog", f"{name}.parquet")
        else:  # written by the executors, a folder of part files
            batch.write.mode("overwrite").parquet(self.output.spark_path("changelog", name))

    def apply_batch(self, batch: pa.Table, app_id: str, batch_id: int) -> None:
        """Apply one batch of the multi-table change log, table by table, in name order."""
        tables = sorted(pc.unique(batch.column("_table")).to_pylist())
        self._apply_tables(tables, lambda t: batch if len(tables) == 1 else batch.filter(
            pc.equal(batch.column("_table"), t)), app_id, batch_id)

    def _apply_tables(self, tables: list[str], rows_of: Callable[[str], Any], app_id: str,
                      batch_id: int) -> None:
        """``tables`` in order, each one's rows (``rows_of``: Arrow, or ``_SparkRows``)
        applied, or held when the table is failed or fails now."""
        for n, table in enumerate(tables):
            if n:
                crash_point("between_table_applies")  # the tables before are committed
            rows = rows_of(table)
            status = self.tables.setdefault(table, AppliedTable())
            if status.state is State.FAILED:
                self._hold(table, batch_id, rows)
                continue
            try:
                self._apply(table, rows, app_id, batch_id)
            except CdcError as exc:
                if exc.retryable:
                    raise  # an outage: the batch fails and its replay applies it
                self._fail(table, batch_id, exc)
                self._hold(table, batch_id, rows)
        if tables:
            crash_point("after_table_applies")  # the apply query's commit log not written

    def _apply(self, table: str, rows: pa.Table | _SparkRows, app_id: str,
               batch_id: int) -> None:
        """One table's generic rows of one batch into its target: by the embedded sink
        (decoded on the driver) or by the Spark engine (decoded by Spark; a held batch, read
        back as Arrow, is given to Spark first)."""
        if self.settings_of(table)[0].engine == "spark":
            from tablestore_cdc.lakehouse.spark_rows import decode

            if isinstance(rows, pa.Table):  # a held batch (resume_held): small, one table
                from pyspark.sql import SparkSession

                frame = SparkSession.active().createDataFrame(rows)
                rows = _SparkRows(frame, rows.column("_schema")[rows.num_rows - 1].as_py())
            changes, keys = decode(rows.frame, rows.declared)
            result = self.sink(table, keys).apply(changes, app_id, batch_id)
        else:
            if isinstance(rows, _SparkRows):
                rows = rows.frame.toArrow()
            changes, keys = generic_rows.decode(rows)
            result = self.sink(table).apply(changes, app_id, batch_id,
                                            self.settings_of(table)[1] or keys)
        self.tables.setdefault(table, AppliedTable()).record(result)

    def _fail(self, table: str, batch_id: int, exc: Exception) -> None:
        reason = f"batch {batch_id}: {type(exc).__name__}: {exc}"
        log.error("table %s failed (%s); its rows are held, the other tables go on; fix its "
                  "setting and restart to resume it", table, reason)
        self.output.write_bytes(reason.encode(), _FAILED, f"{table}.failed")
        self.tables[table] = AppliedTable(State.FAILED, reason)

    def _hold(self, table: str, batch_id: int, rows: pa.Table | _SparkRows) -> None:
        """Keep a failed table's rows of ``batch_id`` (before the batch commits; a replay
        writes the same file again). The Spark engine's rows are collected to the driver
        for this: one failed table's rows of one batch."""
        if isinstance(rows, _SparkRows):
            rows = rows.frame.toArrow()
        self.output.write_parquet(rows, _HELD, table, f"{batch_id:012d}.parquet")

    def resume_held(self, app_id: str | None) -> None:
        """Before the queries start (a restart): apply each failed table's held batches in
        order, under their own batch ids (a batch its target already holds is skipped), with
        the settings given now. A table whose batch is refused again stays failed. A
        retryable error (an outage) is raised with the table still failed and its batches
        still held, so the job's next start resumes it again from the same batch."""
        if app_id is None:
            return
        for table in [t for t, s in self.tables.items() if s.state is State.FAILED]:
            held = self.output.names(_HELD, table, suffix=".parquet")
            failed = self.tables[table]
            self.tables[table] = AppliedTable()
            for name in held:
                batch_id = int(name.removesuffix(".parquet"))
                rows = pq.read_table(pa.BufferReader(
                    self.output.read_bytes(_HELD, table, name) or b""))
                try:
                    self._apply(table, rows, app_id, batch_id)
                except CdcError as exc:
                    if exc.retryable:
                        self.tables[table] = failed
                        raise
                    self._fail(table, batch_id, exc)
                    break
                self.output.delete(_HELD, table, name)
            else:
                self.output.delete(_FAILED, f"{table}.failed")
                log.info("table %s resumed: %d held batch(es) applied", table, len(held))


@dataclass(frozen=True)
class _SparkRows:
    """One table's generic rows of a batch as a Spark DataFrame (not collected) and the
    table's declared columns (``_schema``), for the Spark engine (``MultiTableApply``)."""

    frame: Any
    declared: str


@dataclass
class Pipeline:
    """The running queries of a replication of a selection of tables (driver), returned by
    ``start_pipeline``: the change-log query and the apply query, watched, drained and
    stopped together (the one-cycle pipeline's one query is both); the replication job
    (``pipeline.job``) watches it."""

    changelog: Any
    state_query: Any
    apply: MultiTableApply
    #: the ProgressListener attached by start_pipeline (every selected table's namespace),
    #: removed by ``stop``
    listener: Any = None
    spark: Any = None  # the session, to detach the listener at stop
    #: the change-log query's input rows by batch id (``poll``)
    delivered_by_batch: dict[int, int] = field(default_factory=dict)
    #: the tables of a selection that names them all without a glob (``--table T``, ``--tables
    #: a,b``), which cannot grow; empty for a selection with a glob
    named: frozenset[str] = frozenset()
    #: a table's lag measured now from its committed positions (``lag_from_commits``), asked
    #: once the change-log query has ended; None: the report's figures stay
    measure_lag: Callable[[str], dict[str, Any] | None] | None = None
    #: each table's lag as measured when the change-log query had ended (``_lag``)
    ended_lag: dict[str, dict[str, Any]] | None = None

    @property
    def queries(self) -> tuple[Any, ...]:
        """The running queries: two, or one (the one-cycle pipeline's query is both)."""
        if self.state_query is self.changelog:
            return (self.changelog,)
        return (self.changelog, self.state_query)

    def check(self) -> None:
        for query in self.queries:
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")

    def drain(self) -> None:
        self.check()
        for query in self.queries:
            query.processAllAvailable()

    def stop(self) -> None:
        for query in self.queries:
            query.stop()
        if self.listener is not None:  # the dashboard shows "stopped" only once it is recorded
            self.listener.wait_terminated(timeout=10,
                                          query_ids=[str(q.id) for q in self.queries])
            if self.spark is not None:  # a restarted pipeline attaches a listener of its own
                self.spark.streams.removeListener(self.listener)
                self.listener = None

    def source_report(self) -> dict[str, Any]:
        """The source's report in the change-log query's last progress (its
        ``reportLatestOffset``: each table's state and lag), or {}."""
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

    def selection_failure(self) -> QueryFailure | None:
        """By the replication job's watch loop (driver): when every table of a ``named``
        selection has failed (its source or its target refused it: ``table_states``),
        nothing is left to replicate and the job ends with the first table's failure, as
        the query's own failure would end it; None otherwise (a selection with a glob goes on:
        tables may be created)."""
        if not self.named:
            return None
        states = self.table_states()
        if not all(t in states and states[t].state is State.FAILED for t in self.named):
            return None
        return table_failure(states[min(self.named)].reason or "")

    def poll(self) -> tuple[int, int]:
        """(changes delivered to the change log by this run, its batches) from the change-log
        query's progress (the demo's figures)."""
        for progress in self.changelog.recentProgress:
            self.delivered_by_batch[progress["batchId"]] = progress["numInputRows"]
        return sum(self.delivered_by_batch.values()), len(self.delivered_by_batch)

    def run_due_repairs(self) -> int:
        """By the replication job's watch loop (driver): the tables' due re-snapshots when no
        batch is being applied (``RepairRunner.when_idle``), a quiet table's included; the
        tables the source reports are added to those looked at. How many ran."""
        if self.apply.repairs is None:
            return 0
        # a new set, not an update: a batch's look may be reading the old one now
        self.apply.known = self.apply.known | set(self.source_report().get("tables", {}))
        return self.apply.repairs.when_idle(str(self.state_query.id))

    def applied_batch(self) -> int | None:
        """The newest batch the apply query applied in this run, None before its first (the
        replication job resets its restart count when it moves; tests wait for it)."""
        return self.apply.applied_batch_id

    def table_states(self, report: dict[str, Any] | None = None) -> dict[str, TableState]:
        """Each table's state (``connector.table_state``): the source's (new, streaming,
        waiting, restarting after a retryable error, back to streaming once its service
        answers, dropped, failed, read from the progress report), then the apply's failures
        over it. ``report``: the source's report already read (``source_report``)."""
        report = self.source_report() if report is None else report
        states = {table: TableState.from_text(text)
                  for table, text in report.get("tables", {}).items()}
        for table, status in self.apply.tables.items():
            if status.state is State.FAILED:
                states[table] = TableState(State.FAILED, status.reason)
            else:
                states.setdefault(table, TableState(status.state))
        return dict(sorted(states.items()))

    def table_statuses(self, job: str, selection: str) -> dict[str, TableStatus]:
        """Each table's ``TableStatus`` (``tablestore_cdc.table_status``): the one place the
        source's report (state, lag, snapshot progress) and the apply's figures (a refused
        batch, changes applied, rows/s, last commit, target version) are joined. The command
        writes them to the meta store for the feed and ``meta tables`` and sets the metrics
        from them. ``job``: the output directory; ``selection``: the ``--tables`` patterns."""
        report = self.source_report()
        lag, snapshot = self._lag(report), report.get("snapshot", {})
        now = time.time()
        statuses = {}
        for table, state in self.table_states(report).items():
            applied = self.apply.tables.get(table, AppliedTable())
            figures = lag.get(table, {})
            statuses[table] = TableStatus.of(
                state, table=table, job=job, selection=selection, now=now,
                snapshot_percent=snapshot.get(table), records_behind=figures.get("recordsBehind"),
                seconds_behind=figures.get("secondsBehind"),
                target=redact_uri(self.apply.target_of(table)), **applied.status_fields(now))
        return statuses

    def _lag(self, report: dict[str, Any]) -> dict[str, Any]:
        """Each table's lag (``recordsBehind``, ``secondsBehind``): the source's report, as
        measured where Spark's last batch *started*. Once the change-log query has ended
        without an error (``--once`` caught up: no trigger reports after its last batch), it is
        measured once more from the committed positions (``measure_lag``), else a caught-up
        run would show its last batch's records as behind until its next run."""
        lag: dict[str, Any] = report.get("lag", {})
        if self.measure_lag is None or self.changelog.isActive \
                or self.changelog.exception() is not None:
            return lag
        if self.ended_lag is None:
            measured = {table: self.measure_lag(table) for table in report.get("tables", {})}
            self.ended_lag = {**lag, **{t: m for t, m in measured.items() if m is not None}}
        return self.ended_lag


def lag_from_commits(endpoint: str, tables: str, tunnel: str, options: dict[str, str] | None
                     ) -> Callable[[str], dict[str, Any] | None]:
    """``Pipeline.measure_lag`` (driver): a table's lag in the source report's terms,
    measured now from the positions after its latest committed batch, as the dashboard's
    channel view measures it (``feed.tunnel_view``); None when the meta store or the tunnel
    does not tell (the report's figure stays)."""

    def measure(table: str) -> dict[str, Any] | None:
        from meta_store import open_meta_store
        from tablestore_cdc.feed.tunnel_view import channel_view

        uri, credentials, namespace = status_location(endpoint, tables, tunnel, options, table)
        try:
            with open_meta_store(uri, credentials, create=False) as store:
                lag = channel_view(store, namespace, endpoint).lag
        except (CdcError, OSError, KeyError) as exc:  # monitoring never fails the job
            log.info("cannot measure the lag of table %s after the run: %s", table, exc)
            return None
        if lag is None:
            return None
        return {"recordsBehind": sum(v["records_behind"] for v in lag.values()),
                "secondsBehind": round(max((v["seconds_behind"] for v in lag.values()),
                                           default=0.0), 3),
                "exact": all(v["exact"] for v in lag.values())}

    return measure


def status_location(endpoint: str, tables: str, tunnel: str, options: dict[str, str] | None,
                    table: str) -> tuple[str, Any, str]:
    """Where ``table``'s ``TableStatus`` is kept (``TableStatusWriter``'s ``namespace_of``):
    its meta store (URI, credentials) and namespace, from that table's options as the
    multi-table source builds them."""
    source = selection_options(endpoint, tables, None, tunnel, options).for_table(table)
    return source.meta_store, source.meta_store_credentials, source.source_identity


def selection_options(endpoint: str, tables: str, exclude: str | None, tunnel: str,
                      options: dict[str, str] | None) -> Any:
    """The multi-table source's options (``MultiTableOptions``) as its query parses them."""
    from connector.table_selection import MultiTableOptions

    return MultiTableOptions.from_spark({"endpoint": endpoint, "tables": tables,
                                         **({"exclude": exclude} if exclude else {}),
                                         "tunnel.name": tunnel, **(options or {})})


def table_sources(source: Any) -> Callable[[str], SourceSpec]:
    """Each table's source as the multi-table ``source`` (``selection_options``) reads it (its
    own options over the shared ones, as ``MultiTableOptions.for_table``): what its
    re-snapshot reconciles and reads, and whose namespace holds its signals."""
    shared = dict(source.shared)
    endpoint, tunnel = shared.get("endpoint", ""), shared.get("tunnel.name", "")

    def spec(table: str) -> SourceSpec:
        own = source.own_options(table)
        return SourceSpec(endpoint, table, tunnel,
                          {**{k: v for k, v in shared.items() if k.lower() not in own}, **own})

    return spec


def named_tables(source: Any) -> set[str]:
    """The table names the selection of ``source`` gives without a glob (and keeps)."""
    selection = source.selection
    return {p for p in selection.include if not set(p) & set("*?[") and selection.matches(p)}


def check_target_template(target: str, tables: str | None = None) -> None:
    """Refuse a target that does not name each table (``ApplyOptionError``): a template with
    ``{table}``, or one literal target when ``tables`` names one table without a glob."""
    from tablestore_cdc.lakehouse.errors import ApplyOptionError

    if "{table}" in target or (tables is not None and is_one_table(tables)):
        return
    raise ApplyOptionError(option="target", value=target,
                           problem="names no {table} for the tables it holds",
                           allowed="a template such as delta:///lake/{table}")


def is_one_table(tables: str) -> bool:
    """Does the selection ``tables`` name exactly one table, without a glob?"""
    return "," not in tables and not set(tables) & set("*?[")


def retry_options(retry: RestartPolicy) -> dict[str, str]:
    """The source options that make a multi-table query retry a table on ``retry`` (the
    job's restart policy): ``tables.retryBackoff`` and, when bounded, ``tables.maxRetries``."""
    from connector.table_selection import MAX_RETRIES, RETRY_BACKOFF

    options = {RETRY_BACKOFF: f"{retry.first_s}:{retry.max_s}"}
    if retry.max_restarts is not None:
        options[MAX_RETRIES] = str(retry.max_restarts)
    return options


def _max_partitions(spark: Any) -> str:
    """``tables.maxPartitions`` for the cluster the session runs on: two per core Spark
    schedules tasks on (its default parallelism: every executor's cores); when the session
    cannot tell (Spark Connect), the source's own default (two per driver core)."""
    from connector.table_selection import default_max_partitions

    try:
        cores = int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext to ask
        return str(default_max_partitions())
    return str(2 * max(1, cores))


def start_pipeline(spark: Any, endpoint: str, tables: str, tunnel: str, out: JobOutput | Path,
                   apply: ApplySettings, options: dict[str, str] | None = None,
                   trigger_ms: int = 0, *, exclude: str | None = None,
                   per_table: Callable[[str], tuple[ApplySettings, tuple[str, ...] | None]]
                   | None = None, once: bool = False,
                   retry: RestartPolicy | None = None, cycle: str | None = None) -> Pipeline:
    """Start the pipeline's query or queries (driver, module docstring) on any ``endpoint``
    the source reads: every table matching ``tables`` (comma-separated names and globs) and
    none of ``exclude``, into ``apply.target`` with ``{table}`` replaced by each table's name.
    ``per_table``: a table's own settings and key override (``table_config``). ``once``:
    Trigger.AvailableNow (two cycles: the change-log query's end, its error raised here, is
    waited for before the apply query starts). ``retry``: the job's restart policy, on which a
    table failing with a retryable error is retried inside the query (``retry_options``, unless
    ``options`` sets them); None: the source's default. ``cycle``: ``one`` (one query that
    writes and applies each batch it reads: module docstring) or ``two`` (the change-log
    query, then the apply query reading its files); None: what ``out`` holds, else ``one``
    (``queries.choose_cycle``, which refuses the other one on an existing output)."""
    check_target_template(apply.target, tables)
    out = JobOutput.of(out)
    cycle = choose_cycle(out, cycle)
    reader = (spark.readStream.format("tablestore").option("endpoint", endpoint)
              .option("tables", tables).option("tunnel.name", tunnel))
    if exclude:
        reader = reader.option("exclude", exclude)
    from connector.table_selection import MAX_PARTITIONS, MAX_RETRIES, RETRY_BACKOFF

    options = dict(options or {})
    given = {key.lower() for key in options}
    if MAX_PARTITIONS.lower() not in given:
        options[MAX_PARTITIONS] = _max_partitions(spark)
    if retry is not None and not given & {RETRY_BACKOFF.lower(), MAX_RETRIES.lower()}:
        options.update(retry_options(retry))
    for key, value in options.items():
        reader = reader.option(key, value)
    changes = reader.load()
    selection = selection_options(endpoint, tables, exclude, tunnel, options)
    sink = MultiTableApply(apply, redact_uri(endpoint), out, per_table=per_table,
                           spec_of=table_sources(selection), known=named_tables(selection),
                           writes_changelog=cycle == "one")
    sink.resume_held(checkpoint_query_id(out))
    listener = attach_listener(spark, selection)  # each selected table's namespace
    changelog_dir = out.spark_path("changelog")
    trigger: dict[str, Any] = ({"availableNow": True} if once
                               else {"processingTime": f"{trigger_ms} milliseconds"})
    try:
        if cycle == "one":
            changelog = state_query = (
                changes.writeStream.queryName(APPLY_CHECKPOINT["one"]).foreachBatch(sink)
                .option("checkpointLocation",
                        out.spark_path("_checkpoints", APPLY_CHECKPOINT["one"]))
                .trigger(**trigger).start())
        else:
            changelog = (changes.writeStream.format("parquet").queryName("changelog")
                         .option("path", changelog_dir)
                         .option("checkpointLocation",
                                 out.spark_path("_checkpoints", "changelog"))
                         .trigger(**trigger).start())
            if once:  # the apply query must see the whole change log of this run
                changelog.awaitTermination()
            state_query = (spark.readStream.schema(changes.schema).parquet(changelog_dir)
                           .writeStream.queryName("apply").foreachBatch(sink)
                           .option("checkpointLocation",
                                   out.spark_path("_checkpoints", "apply"))
                           .trigger(**trigger).start())
    except BaseException:
        spark.streams.removeListener(listener)
        raise
    named = named_tables(selection)
    return Pipeline(changelog, state_query, sink, listener=listener, spark=spark,
                    named=frozenset(named) if len(named) == len(selection.selection.include)
                    else frozenset(),
                    measure_lag=lag_from_commits(endpoint, tables, tunnel, options))
