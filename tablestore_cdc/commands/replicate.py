"""``tablestore-cdc replicate`` and ``tablestore-cdc demo``: the commands that run the pipeline.

Mounted by ``commands/app.py``. Thin over the pipeline library (``tablestore_cdc.pipeline``)
and the demo (``tablestore_cdc.demo``): flags in, one line per change of the figures out, Ctrl-C
(or SIGTERM) stops cleanly; errors end in one ``error: ...`` line and exit code 2.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from cdc_common.uris import redact_uri
from tablestore_cdc.commands.errors import fail, reported_errors
from tablestore_cdc.commands.source_flags import flags_named, reader_options, source_endpoint
from tablestore_cdc.demo.run import run_demo
from tablestore_cdc.pipeline import ApplySettings, start_pipeline
from tablestore_cdc.pipeline.table_config import catalog_option, column_types

console = Console(stderr=True)


def demo(
    workdir: Annotated[Path, typer.Option(help="Where the store, meta store and outputs go.")]
    = Path("tablestore-cdc-demo"),
    changes: Annotated[int, typer.Option(min=100, help="Changes the writer makes.")] = 4000,
    duration: Annotated[float, typer.Option(min=1, help="Seconds the writer spreads them over.")]
    = 30.0,
    channels: Annotated[int, typer.Option(min=2, max=64, help="Initial channels.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the writer's random changes.")] = 7,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
    backend: Annotated[str, typer.Option(
        help="local: read the store file; emulator: serve it with the Tablestore emulator "
        "and run everything over the wire (SDK writes, Tunnel reads, meta table).")]
    = "local",
) -> None:
    """Run the whole pipeline on an embedded store with a live writer, then verify it."""
    if backend not in ("local", "emulator"):
        raise typer.BadParameter("local or emulator", param_hint="--backend")
    with reported_errors():
        ok = run_demo(workdir.resolve(), changes, duration, channels, seed, master, backend)
    raise typer.Exit(0 if ok else 1)


def replicate(
    ctx: typer.Context,
    output: Annotated[Path, typer.Option(help="Change log and checkpoints (and the default "
                                         "target).")],
    table: Annotated[str | None, typer.Option(help="The table to replicate.")] = None,
    tables: Annotated[str | None, typer.Option(
        help="Several tables in one application: comma-separated names or globs "
        "(orders_*,users); tables created later that match are picked up. The target is a "
        "template with {table} (default delta://OUTPUT/lake/{table}).")] = None,
    exclude: Annotated[list[str] | None, typer.Option(
        help="With --tables: leave out tables matching this glob (repeatable).")] = None,
    config: Annotated[Path | None, typer.Option(
        help="With --tables: per-table settings from a TOML file ([defaults], [tables.NAME]: "
        "scd, schema_drift, soft_delete_column, target, keys, snapshot_op, columns, "
        "maintenance, read limits); flags given here override it.")]
    = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="Serve per-table metrics for Prometheus on "
        "http://127.0.0.1:PORT/metrics (docs/operations.md, \"Metrics and alerts\").")]
    = None,
    store: Annotated[Path | None, typer.Option(
        help="The local store file (short for --endpoint local:///abs/STORE).")] = None,
    endpoint: Annotated[str | None, typer.Option(
        help="The source endpoint, as the reader's endpoint option: local:///abs/store.db, "
        "the emulator's or a Tablestore instance's http(s):// URL, dynamodb-streams://...")]
    = None,
    target: Annotated[str | None, typer.Option(
        help="Where changes are applied: delta:///abs/path, delta+s3://bucket/prefix, "
        "iceberg:///abs/warehouse?table=namespace.table or iceberg://catalog/namespace.table "
        "(default: delta://OUTPUT/TABLE; docs/lakehouse.md).")]
    = None,
    scd: Annotated[int, typer.Option(
        min=1, max=2, help="1: the current state; 2: one row per version with __START_AT and "
        "__END_AT.")] = 1,
    schema_drift: Annotated[str, typer.Option(
        help="Attributes the target has no column for, and values of another type: lenient "
        "(new nullable columns, lossless widening, other values typed in _extra), try_evolve "
        "(the same), evolve (new columns and widening, else fail), exception (fail on any "
        "change) or ignore (columns never change, the rest in _extra); aliases fail, add, "
        "keep.")] = "lenient",
    soft_delete_column: Annotated[str | None, typer.Option(
        help="SCD 1: a DELETE sets this boolean column instead of removing the row.")] = None,
    adopt_target: Annotated[bool, typer.Option(
        help="Take over a target table this job did not create (its keys and their types are "
        "checked); without it such a table is refused, unchanged.")] = False,
    target_option: Annotated[list[str] | None, typer.Option(
        help="A delta-rs storage option or an Iceberg catalog property of the target, "
        "KEY=VALUE (repeatable), e.g. aws_region=eu-central-1; credentials come from the "
        "environment, a profile or a file it names, and a secret's value is never shown.")]
    = None,
    tunnel: Annotated[str, typer.Option(help="Tunnel name (created if missing).")]
    = "replicate",
    initial: Annotated[str, typer.Option(
        help="What a new tunnel delivers first: snapshot (every row of the table as it is, "
        "then the changes after it: tunnel.type=BaseAndStream) or none (only the changes the "
        "tunnel still retains: older rows are missing from the target). An existing tunnel "
        "keeps its type; --option tunnel.type=... wins.")] = "snapshot",
    allow_empty: Annotated[bool, typer.Option(
        help="With --tables: start even when no table matches now (a warning), and pick the "
        "tables up when they are created; without it that is refused.")] = False,
    option: Annotated[list[str] | None, typer.Option(
        help="Extra reader option KEY=VALUE (repeatable), e.g. maxOffsetsPerChannel=5000.")]
    = None,
    column: Annotated[list[str] | None, typer.Option(
        help="Fix an attribute column's type instead of letting the first value decide: "
        "TABLE.COLUMN=TYPE (with --table also COLUMN=TYPE; repeatable), TYPE one of string, "
        "long, double, boolean, binary; values of another type go to _extra.")] = None,
    trigger_ms: Annotated[int, typer.Option(help="Trigger interval in ms (0 = ASAP).")] = 0,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
    once: Annotated[bool, typer.Option(
        help="Catch up with the source (Trigger.AvailableNow), apply it and exit 0: for "
        "schedulers. Without it the job runs until stopped.")] = False,
    max_restarts: Annotated[int | None, typer.Option(
        help="Restarts in a row after retryable failures (outages, throttling) before the "
        "job gives up with exit code 3; default: restart forever.")] = None,
    restart_backoff: Annotated[str, typer.Option(
        help="FIRST[:MAX] seconds: the first restart's delay, doubled per restart in a row "
        "up to MAX (jittered by 20 %).")] = "1:60",
    maintenance: Annotated[str, typer.Option(
        help="on: the job compacts, expires and vacuums each target itself between batches "
        "(docs/operations.md, \"Maintenance\"); off: only by hand (lake optimize).")] = "on",
    maintenance_setting: Annotated[list[str] | None, typer.Option(
        help="A maintenance threshold KEY=VALUE (repeatable): every_minutes (10), "
        "every_batches (100), compact_files (64), small_file_mb (32), keep_snapshots (100), "
        "expire_hours (1), vacuum_hours (168, at least 1), vacuum_every_minutes (60).")]
    = None,
    engine: Annotated[str, typer.Option(
        help="Who applies each batch: embedded (the driver: delta-rs or pyiceberg) or spark "
        "(Spark's own MERGE by delta-spark on the executors, into a local Delta target; its "
        "jars come from Maven Central; docs/lakehouse.md).")] = "embedded",
) -> None:
    """Replicate a table into a Delta or Iceberg table until stopped (Ctrl-C, SIGTERM), or
    with --once until caught up; a restart resumes exactly. Retryable failures restart the
    pipeline with backoff. With --tables, many tables in one application
    (docs/multi-table.md). Exit codes: 0 stopped or done, 1 failed (see the log), 2 a
    configuration error, 3 gave up after --max-restarts, 4 already running."""
    from tablestore_cdc.pipeline.job import ReplicationJob
    from tablestore_cdc.pipeline.preflight import INITIAL_CHOICES, JobPlan, check_before_start
    from tablestore_cdc.pipeline.restarts import restart_policy

    endpoint = source_endpoint(store, endpoint)
    extra = reader_options(option)
    output = output.resolve()
    if engine not in ("embedded", "spark"):
        fail(f"option '--engine': got {engine!r}; allowed: embedded or spark")
    if engine == "spark" and tables is not None:
        fail("--engine spark goes with --table (one table)")
    with reported_errors():
        from tablestore_cdc.lakehouse.target import parse_target_options

        target_options = tuple(parse_target_options(target_option).items())
        from tablestore_cdc.lakehouse.upkeep import policy_of

        upkeep = policy_of(maintenance, maintenance_setting)
    if initial not in INITIAL_CHOICES:
        fail(f"option '--initial': got {initial!r}; allowed: {' or '.join(INITIAL_CHOICES)}")
    initial_given = _on_command_line(ctx, "initial")
    if tables is not None:
        if table is not None:
            fail("--table and --tables: give one of them")
        with reported_errors():
            columns = column_types(column)
        from tablestore_cdc.commands.replicate_tables import replicate_tables

        apply = ApplySettings(target or f"delta://{output}/lake/{{table}}", scd, schema_drift,
                              soft_delete_column, adopt_target, target_options, upkeep)
        given = frozenset(name for name in ("target", "scd", "schema_drift",
                                            "soft_delete_column", "adopt_target")
                          if _on_command_line(ctx, name)) | (
                              {"target_options"} if target_options else set()) | (
                              {"maintenance"} if _on_command_line(ctx, "maintenance")
                              or maintenance_setting else set())
        with reported_errors():
            policy = restart_policy(restart_backoff, max_restarts)
        code = replicate_tables(endpoint, tables, exclude, output, apply, tunnel, extra,
                                trigger_ms, master, metrics_port, config, given, policy, once,
                                initial=initial, initial_given=initial_given,
                                allow_empty=allow_empty, columns=columns)
        raise typer.Exit(int(code))
    if table is None:
        fail("--table (one table) or --tables (a selection) is required")
    if allow_empty:
        fail("--allow-empty goes with --tables")
    # one policy for the source and the target (Flink CDC's schema.change.behavior), unless an
    # --option names the reader's own (--tables: per table, TableConfig.source_options)
    if "schema.change.behavior" not in {key.lower() for key in extra}:
        extra["schema.change.behavior"] = schema_drift
    with reported_errors():
        typed = column_types(column, table).get(table)
    if typed:
        if "catalog" in {key.lower() for key in extra}:
            fail("--column and --option catalog=...: give one of them")
        extra["catalog"] = catalog_option(typed)
    apply = ApplySettings(target or f"delta://{output / table}", scd, schema_drift,
                          soft_delete_column, adopt_target, target_options, upkeep)
    with reported_errors(), flags_named():
        policy = restart_policy(restart_backoff, max_restarts)
        # a bad target, option or endpoint, a missing table, a target or table of another
        # job: refused here, read-only, before the lock and Spark (the same checks as --tables)
        checked = check_before_start(JobPlan(endpoint, output, tunnel, extra, lambda _: apply,
                                             table=table, initial=initial,
                                             initial_given=initial_given))
    extra = checked.options
    for line in checked.lines:
        console.print(line, soft_wrap=True)
    from tablestore_cdc.commands.replicate_tables import run_job, say_job_end, start_job

    engine_conf = None
    if engine == "spark":  # the jars for this PySpark and a target it writes, before Spark
        from tablestore_cdc.lakehouse.spark_merge import replicate_conf

        with reported_errors():
            engine_conf = replicate_conf(apply.target)
        apply = dataclasses.replace(apply, engine=engine)
    # a second start ends here (exit 4); --once: a short run's JVM options
    lock, spark = start_job(output, master, engine_conf, short_run=once)
    try:
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        console.print(f"replicating {table} from {redact_uri(endpoint)} into {apply.target} "
                      f"(SCD {scd}, schema drift {schema_drift}"
                      f"{', once' if once else ''}) — Ctrl-C to stop")
        writer = _status_writer(endpoint, table, tunnel, extra)
        metrics = _serve_metrics(endpoint, metrics_port, writer)
        job = ReplicationJob(
            lambda: start_pipeline(spark, endpoint, table, tunnel, output, apply, extra,
                                   trigger_ms, once=once),
            policy, say=lambda line: console.print(line, soft_wrap=True), once=once,
            record_status=_status_recorder(endpoint, table, tunnel, extra, writer),
            on_progress=_progress_printer(writer, table, str(output)))
        try:
            code = run_job(job, spark, writer)
        finally:
            metrics.close()
    finally:
        lock.release()
    say_job_end(code, once)
    raise typer.Exit(int(code))


def _serve_metrics(endpoint: str, port: int | None, writer: Any) -> Any:
    """The table's Prometheus metrics (``pipeline.metrics.TableMetrics``), set from every
    status ``writer`` publishes (the job's restarts included), served on 127.0.0.1:``port``
    when given (a port in use: one line, exit 2). The caller closes them."""
    from tablestore_cdc.feed.retention import default_retention_s
    from tablestore_cdc.pipeline.metrics import TableMetrics

    metrics = TableMetrics(default_retention_s(endpoint), source=redact_uri(endpoint),
                           probe=endpoint)
    metrics.attach(writer)  # the metrics follow its statuses, which take the probe
    if port is not None:
        try:
            served = metrics.serve(port)
        except OSError as exc:
            fail(f"option '--metrics-port': cannot listen on 127.0.0.1:{port}: {exc}")
        console.print(f"metrics on http://127.0.0.1:{served}/metrics")
    return metrics


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    """Was the flag of parameter ``name`` given on the command line (not its default)? By the
    source's name: typer runs on its own copy of click, whose ``ParameterSource`` is not
    ``click.core.ParameterSource``."""
    source = ctx.get_parameter_source(name)
    return getattr(source, "name", None) == "COMMANDLINE"


def _progress_printer(writer: Any, table: str, job: str) -> Callable[[Any], None]:
    """The figures in one line at the first look, then at most once per ``SUMMARY_EVERY_S``
    when they changed (and at the end of a ``--once`` run), never a line per batch nor one
    rewritten in place: the planning process logs to the same terminal, and a line it writes
    must not land in ours. Each look also publishes the table's ``TableStatus`` (``writer``:
    the feed, the dashboard, ``meta tables`` and the metrics read it), says a change of the
    table's state at once (``StatusSummary``) and a new schema change of the target in a line
    of its own."""
    import time

    from tablestore_cdc.table_status import SUMMARY_EVERY_S, StatusSummary

    shown: list[tuple[int, int, int | None]] = []
    shown_at = [float("-inf")]
    summary = StatusSummary(every_s=float("inf"))  # the figures line is the summary here
    schema_change: list[str | None] = [None]

    def show(pipeline: Any) -> None:
        delivered, batches = pipeline.poll()
        applied = pipeline.applied_batch()
        now = time.monotonic()
        ended = not any(q.isActive for q in pipeline.queries)
        if (not shown or shown[-1] != (delivered, batches, applied)) and (
                ended or now - shown_at[0] >= SUMMARY_EVERY_S):
            console.print(f"delivered {delivered} change(s) in {batches} batch(es); target "
                          f"at apply batch {'-' if applied is None else applied}",
                          soft_wrap=True)
            shown[:] = [(delivered, batches, applied)]
            shown_at[0] = now
        status = writer.publish({table: pipeline.table_status(table, job)})[table]
        for line in summary.lines({table: status}):
            if ": schema change of the target: " not in line and not line.startswith(
                    "tables: "):  # said below, and the figures line above
                console.print(line, soft_wrap=True)
        change = pipeline.applied.last_schema_change
        if change is not None and change != schema_change[0]:
            console.print(f"schema change of the target: {change} (target version "
                          f"{status.last_schema_change_version})", soft_wrap=True)
            schema_change[0] = change

    return show


def _source_options(endpoint: str, table: str, tunnel: str, extra: dict[str, str]) -> Any:
    from connector.options import SourceOptions

    return SourceOptions.from_spark({"endpoint": endpoint, "table.name": table,
                                     "tunnel.name": tunnel, **extra})


def _status_writer(endpoint: str, table: str, tunnel: str, extra: dict[str, str]) -> Any:
    """The ``TableStatusWriter`` of the table's status, in its own namespace's companion
    (``tablestore_cdc.table_status``), as a multi-table pipeline writes each table's."""
    from tablestore_cdc.table_status import TableStatusWriter

    options = _source_options(endpoint, table, tunnel, extra)
    return TableStatusWriter(lambda _table: (options.meta_store, options.meta_store_credentials,
                                             options.source_identity))


def _status_recorder(endpoint: str, table: str, tunnel: str, extra: dict[str, str],
                     writer: Any) -> Callable[[str, str | None], None]:
    """Record the job's state (restarting, failed, running) where the feed reads a query's
    status (``query_record``) and over the table's status (``writer``); a meta store that does
    not answer (the outage itself) is skipped: the job's log line says it all the same."""
    from meta_store import open_meta_store
    from tablestore_cdc.query_record import record_query_status

    options = _source_options(endpoint, table, tunnel, extra)

    def record(status: str, reason: str | None) -> None:
        writer.mark_all(status, reason)
        try:
            with open_meta_store(options.meta_store, options.meta_store_credentials) as meta:
                record_query_status(meta, options.source_identity, status, reason=reason)
        except Exception:  # noqa: BLE001 - best effort during an outage
            pass

    return record
