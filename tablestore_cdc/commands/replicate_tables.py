"""``tablestore-cdc replicate --tables PATTERN[,PATTERN...]``: many tables in one application.

Called by ``replicate`` (``tablestore_cdc/commands/replicate.py``) when ``--tables`` is given; thin
over ``tablestore_cdc.pipeline.multi_table``, run by the replication job
(``tablestore_cdc.pipeline.job``: restarts with backoff, one job per output directory, Spark's
log in a file): one line per change of a table's state or of its target's schema, and a
summary of the tables every 30 s (``table_status.StatusSummary``; each table's
``TableStatus``, also written to the meta store for the dashboard and ``meta tables`` and set
in the Prometheus metrics), Ctrl-C (or SIGTERM) stops
cleanly, errors end in one ``error: ...`` line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from cdc_common.uris import redact_uri
from tablestore_cdc.commands.errors import reported_errors
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.job import JobExit, ReplicationJob, open_job
from tablestore_cdc.pipeline.multi_table import start_multi_table_pipeline, status_location
from tablestore_cdc.pipeline.restarts import RestartPolicy
from tablestore_cdc.pipeline.table_config import TableConfig, load_table_config
from tablestore_cdc.table_status import StatusSummary, TableStatusWriter

console = Console(stderr=True)


def start_job(output: Path, master: str, conf: dict[str, str] | None = None, *,
              short_run: bool = False) -> tuple[Any, Any]:
    """``job.open_job`` for ``replicate`` (one table or ``--tables``; CLI process): a second
    start ends in one line (exit 4), having written nothing; Ctrl-C while Spark starts ends in
    one line (exit 0) instead of the traceback of the Py4J call it interrupted. ``conf``: the
    session's added settings (``--engine spark``); ``short_run``: ``--once``'s JVM options."""
    try:
        with reported_errors():
            return open_job(output, master, console.print, conf, short_run=short_run)
    except KeyboardInterrupt:
        _end_children()
        console.print("stopped while Spark was starting; nothing was read or written")
        raise typer.Exit(int(JobExit.DONE)) from None


def run_job(job: ReplicationJob, spark: Any, writer: TableStatusWriter) -> JobExit:
    """The tail of ``replicate`` (one table or ``--tables``; CLI process, driver): run ``job``
    until it ends, stop Spark, mark every table "stopped" on a clean end and close the status
    ``writer``. The caller releases the output lock and closes the metrics."""
    code = job.run()
    spark.stop()
    if code is JobExit.DONE:
        writer.mark_all("stopped", None)
    writer.close()
    return code


def say_job_end(code: JobExit, once: bool) -> None:
    """The last line of ``replicate`` (one table or ``--tables``) after a clean end."""
    if code is JobExit.DONE:
        console.print("caught up; run the same command again to go on" if once
                      else "stopped cleanly; run the same command again to resume")


def _end_children() -> None:
    """SIGTERM to this process's children (Linux ``/proc``; elsewhere nothing): after Ctrl-C
    inside Spark's start they are its JVM alone, which PySpark had not handed over yet and
    which would outlive this process (it ignores SIGINT)."""
    me = os.getpid()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGTERM)


def replicate_tables(endpoint: str, tables: str, exclude: list[str] | None, output: Path,
                     apply: ApplySettings, tunnel: str, options: dict[str, str],
                     trigger_ms: int, master: str, metrics_port: int | None = None,
                     config: Path | None = None, given: frozenset[str] = frozenset(),
                     policy: RestartPolicy | None = None, once: bool = False, *,
                     initial: str = "snapshot", initial_given: bool = False,
                     allow_empty: bool = False,
                     columns: dict[str, dict[str, str]] | None = None) -> JobExit:
    """Run the multi-table pipeline until stopped (driver), under the replication job's
    restart policy, output lock and log file (``tablestore_cdc.pipeline.job``, as one table's
    ``replicate``); ``metrics_port``: serve the per-table metrics for Prometheus on 127.0.0.1
    (``tablestore_cdc.pipeline.metrics``); ``config``: per-table settings
    (``tablestore_cdc.pipeline.table_config``), under the settings named in ``given`` (flags
    given on the command line); ``once``: catch every table up and end (Trigger.AvailableNow);
    ``initial``, ``initial_given``, ``allow_empty``: ``--initial`` (and whether it was given)
    and ``--allow-empty``, for the checks before the start
    (``tablestore_cdc.pipeline.preflight``, as one table's ``replicate``); ``columns``:
    ``--column`` types per table (``table_config.column_types``), each table's ``catalog``.
    Returns the job's exit code."""
    from tablestore_cdc.commands.source_flags import flags_named
    from tablestore_cdc.feed.retention import default_retention_s
    from tablestore_cdc.pipeline.metrics import TableMetrics
    from tablestore_cdc.pipeline.preflight import JobPlan, check_before_start

    metrics = TableMetrics(default_retention_s(endpoint), source=redact_uri(endpoint),
                           probe=endpoint)

    excluded = ",".join(exclude) if exclude else None
    per_table = None
    with reported_errors(), flags_named():
        if config is not None:
            table_config = load_table_config(config)
            per_table = functools.partial(table_config.for_table, base=apply, given=given)
        else:
            table_config = TableConfig()
        # each table's schema_drift is its source's policy too, and snapshot_op its
        # snapshot.op, unless --option names them
        options = table_config.source_options(options, apply, given, columns)
        settings_of = per_table
        # every check one table's replicate makes, for each table matching now, read-only,
        # before the lock and Spark
        checked = check_before_start(JobPlan(
            endpoint, output, tunnel, options,
            lambda table: settings_of(table)[0] if settings_of is not None else apply,
            tables=tables, exclude=excluded, initial=initial, initial_given=initial_given,
            allow_empty=allow_empty))
    options = checked.options
    for line in checked.lines:
        console.print(line, soft_wrap=True)
    console.print(f"capturing {len(checked.tables)} table(s) now: "
                  f"{', '.join(checked.tables) or '(none yet)'}", soft_wrap=True)
    lock, spark = start_job(output, master, short_run=once)
    try:
        with reported_errors():
            if metrics_port is not None:
                port = metrics.serve(metrics_port)
                console.print(f"metrics on http://127.0.0.1:{port}/metrics")
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        console.print(f"replicating tables {tables}"
                      f"{f' except {excluded}' if excluded else ''} from "
                      f"{redact_uri(endpoint)} into {apply.target}"
                      f"{' (once)' if once else ''} — Ctrl-C to stop")
        summary = StatusSummary()  # a line per change of state, a summary per interval
        writer = TableStatusWriter(functools.partial(status_location, endpoint, tables,
                                                     tunnel, options))
        metrics.attach(writer)  # the job's restarts too (record_status); the probe

        def show(pipeline: Any) -> None:
            statuses = writer.publish(pipeline.table_statuses(str(output), tables))
            for line in summary.lines(statuses):
                console.print(line, soft_wrap=True)

        job = ReplicationJob(
            lambda: start_multi_table_pipeline(spark, endpoint, tables, tunnel, output, apply,
                                               excluded, options, trigger_ms, per_table,
                                               once=once, retry=policy),
            policy or RestartPolicy(), say=lambda line: console.print(line, soft_wrap=True),
            record_status=writer.mark_all, on_progress=show, once=once)
        code = run_job(job, spark, writer)
    finally:
        metrics.close()
        lock.release()
    say_job_end(code, once)
    return code
