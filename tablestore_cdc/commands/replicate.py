"""``tablestore-cdc replicate`` and ``tablestore-cdc demo``: the commands that run the pipeline.

Mounted by ``commands/app.py``. Thin over the pipeline library (``tablestore_cdc.pipeline``)
and the demo (``tablestore_cdc.demo``). ``replicate`` has one path: ``--table T`` is a
selection of one (``--tables T`` whose default target is ``delta://OUTPUT/T``), run by the
replication job (``tablestore_cdc.pipeline.job``: restarts with backoff, one job per output
directory, Spark's log in a file): one line per change of a table's state or of its target's
schema, a summary of the tables every 30 s (``table_status.StatusSummary``; each table's
``TableStatus``, also written to the meta store for the dashboard and ``meta tables`` and set in
the Prometheus metrics), Ctrl-C (or SIGTERM) stops cleanly; errors end in one ``error: ...``
line and exit code 2.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from cdc_common.uris import redact_uri
from tablestore_cdc.commands.errors import fail, reported_errors
from tablestore_cdc.commands.source_flags import flags_named, reader_options, source_endpoint
from tablestore_cdc.demo.run import run_demo
from tablestore_cdc.pipeline import ApplySettings, start_pipeline
from tablestore_cdc.pipeline.job import JobExit, ReplicationJob, open_job
from tablestore_cdc.pipeline.multi_table import (
    is_one_table,
    selection_options,
    status_location,
    table_sources,
)
from tablestore_cdc.pipeline.output import JobOutput
from tablestore_cdc.pipeline.queries import CYCLES, choose_cycle
from tablestore_cdc.pipeline.restarts import RestartPolicy
from tablestore_cdc.pipeline.table_config import TableConfig, column_types, load_table_config
from tablestore_cdc.pipeline.upgrade import upgrade_output
from tablestore_cdc.table_status import StatusSummary, TableStatusWriter

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
    output: Annotated[str, typer.Option(help="Where the job keeps its state, the change log "
                                        "and Spark's checkpoints (and the default target): a "
                                        "local (or mounted) directory, or s3://BUCKET/PREFIX "
                                        "(docs/lakehouse.md).")],
    table: Annotated[str | None, typer.Option(
        help="One table: short for --tables TABLE, its target by default delta://OUTPUT/TABLE."
        )] = None,
    tables: Annotated[str | None, typer.Option(
        help="Several tables in one application: comma-separated names or globs "
        "(orders_*,users); tables created later that match are picked up. The target is a "
        "template with {table} (default delta://OUTPUT/lake/{table}).")] = None,
    exclude: Annotated[list[str] | None, typer.Option(
        help="With --tables: leave out tables matching this glob (repeatable).")] = None,
    config: Annotated[Path | None, typer.Option(
        help="Per-table settings from a TOML file ([defaults], [tables.NAME]: "
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
        "(default: delta://OUTPUT/TABLE with --table, delta://OUTPUT/lake/{table} with "
        "--tables; docs/lakehouse.md).")]
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
        help="Extra reader option KEY=VALUE (repeatable), e.g. maxOffsetsPerChannel=5000; "
        "endpoint, tables, table.name, exclude and tunnel.name are given by their flags.")]
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
        "(Spark's own MERGE on the executors, by delta-spark or Iceberg's runtime into local "
        "Delta targets or iceberg:///WAREHOUSE?table= targets; its jars come from Maven "
        "Central; docs/lakehouse.md).")] = "embedded",
    cycle: Annotated[str | None, typer.Option(
        help="one: one query writes each batch it reads to the change log and applies it; "
        "two: a change-log query, then an apply query reading its files back (a change "
        "waits for two cycles; docs/multi-table.md). Default: what the output already runs, "
        "else one.")]
    = None,
) -> None:
    """Replicate a table (--table) or a selection of tables (--tables) into Delta or Iceberg
    tables until stopped (Ctrl-C, SIGTERM), or with --once until caught up; a restart resumes
    exactly. Retryable failures restart the pipeline with backoff (docs/multi-table.md). Exit
    codes: 0 stopped or done, 1 failed (see the log), 2 a configuration error, 3 gave up after
    --max-restarts, 4 already running."""
    from tablestore_cdc.pipeline.preflight import INITIAL_CHOICES
    from tablestore_cdc.pipeline.restarts import restart_policy

    endpoint = source_endpoint(store, endpoint)
    extra = reader_options(option)
    with reported_errors():
        out = JobOutput.parse(output)
    if engine not in ("embedded", "spark"):
        fail(f"option '--engine': got {engine!r}; allowed: embedded or spark")
    if cycle is not None and cycle not in CYCLES:
        fail(f"option '--cycle': got {cycle!r}; allowed: {' or '.join(CYCLES)}")
    if initial not in INITIAL_CHOICES:
        fail(f"option '--initial': got {initial!r}; allowed: {' or '.join(INITIAL_CHOICES)}")
    if (table is None) == (tables is None):
        fail("--table (one table) or --tables (a selection): give one of them")
    if table is not None:
        if not table or not is_one_table(table):
            fail(f"option '--table': got {table!r}: one table's name; a list or a pattern "
                 "goes in --tables")
        for flag, given_flag in (("--allow-empty", allow_empty), ("--exclude", exclude)):
            if given_flag:
                fail(f"{flag} goes with --tables")
    with reported_errors():
        from tablestore_cdc.lakehouse.target import parse_target_options
        from tablestore_cdc.lakehouse.upkeep import policy_of

        target_options = tuple(parse_target_options(target_option).items())
        upkeep = policy_of(maintenance, maintenance_setting)
        columns = column_types(column, table)
        policy = restart_policy(restart_backoff, max_restarts)
    apply = ApplySettings(target or out.default_target(one_table=table is not None), scd,
                          schema_drift, soft_delete_column, adopt_target, target_options,
                          upkeep, engine)
    given = frozenset(name for name in ("target", "scd", "schema_drift",
                                        "soft_delete_column", "adopt_target")
                      if _on_command_line(ctx, name)) | (
                          {"target_options"} if target_options else set()) | (
                          {"maintenance"} if _on_command_line(ctx, "maintenance")
                          or maintenance_setting else set())
    code = replicate_selection(
        endpoint, table or tables or "", exclude, out, apply, tunnel, extra, trigger_ms, master,
        metrics_port, config, given, policy, once, initial=initial,
        initial_given=_on_command_line(ctx, "initial"), allow_empty=allow_empty,
        columns=columns, one_table=table is not None, cycle=cycle)
    raise typer.Exit(int(code))


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


def replicate_selection(endpoint: str, tables: str, exclude: list[str] | None,
                        output: JobOutput | Path,
                        apply: ApplySettings, tunnel: str, options: dict[str, str],
                        trigger_ms: int, master: str, metrics_port: int | None = None,
                        config: Path | None = None, given: frozenset[str] = frozenset(),
                        policy: RestartPolicy | None = None, once: bool = False, *,
                        initial: str = "snapshot", initial_given: bool = False,
                        allow_empty: bool = False,
                        columns: dict[str, dict[str, str]] | None = None,
                        one_table: bool = False, cycle: str | None = None) -> JobExit:
    """Run the pipeline of the selection ``tables`` until stopped (CLI process, driver), under
    the replication job's restart policy, output lock and log file
    (``tablestore_cdc.pipeline.job``), after the checks before the start
    (``pipeline.preflight``). The arguments are ``replicate``'s flags as parsed; ``one_table``:
    ``--table``; ``given``: the settings whose flags were on the command line, over ``config``
    (``pipeline.table_config``); ``cycle``: ``--cycle`` (``queries.choose_cycle``). Returns
    the job's exit code."""
    from tablestore_cdc.feed.retention import default_retention_s
    from tablestore_cdc.pipeline.metrics import TableMetrics
    from tablestore_cdc.pipeline.preflight import JobPlan, check_before_start

    excluded = ",".join(exclude) if exclude else None
    output = JobOutput.of(output)
    per_table = None
    engine_conf = None
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
        cycle = choose_cycle(output, cycle)  # an output's recorded cycle, or refused here
        # a bad target, option or endpoint, a missing table, a target or table of another
        # job: refused here, read-only, before the lock and Spark
        checked = check_before_start(JobPlan(
            endpoint, output, tunnel, options,
            lambda table: settings_of(table)[0] if settings_of is not None else apply,
            tables=tables, exclude=excluded, initial=initial, initial_given=initial_given,
            allow_empty=allow_empty, one_table=one_table))
        if apply.engine == "spark":  # the jars for this PySpark, before Spark starts
            from tablestore_cdc.lakehouse.spark_merge import replicate_conf

            # every target a table may get: the template (under [defaults]), each named one's
            engine_conf = replicate_conf([apply.target] if per_table is None else [
                per_table(t)[0].target for t in ("", *table_config.tables)])
    options = checked.options
    for line in checked.lines:
        console.print(line, soft_wrap=True)
    if not one_table:
        console.print(f"capturing {len(checked.tables)} table(s) now: "
                      f"{', '.join(checked.tables) or '(none yet)'}", soft_wrap=True)
    metrics = TableMetrics(default_retention_s(endpoint), source=redact_uri(endpoint),
                           probe=endpoint)
    try:  # a second start ends here (exit 4); --once: a short run's JVM options
        with reported_errors():
            lock, spark = open_job(output, master, console.print, engine_conf, short_run=once)
    except KeyboardInterrupt:  # in Spark's start: one line, not the Py4J call's traceback
        _end_children()
        console.print("stopped while Spark was starting; nothing was read or written")
        return JobExit.DONE
    try:
        with reported_errors():
            if one_table and output.local is not None:  # an earlier version's single-table
                # output: upgraded in place
                upgraded = upgrade_output(output.local, table_sources(selection_options(
                    endpoint, tables, excluded, tunnel, options))(tables))
                if upgraded is not None:
                    console.print(upgraded, soft_wrap=True)
            if metrics_port is not None:
                port = metrics.serve(metrics_port)
                console.print(f"metrics on http://127.0.0.1:{port}/metrics")
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        what = tables if one_table else f"tables {tables}"
        # the target the tables get: --config's [defaults] (and a table's own) over the flag's
        into = (per_table(tables if one_table else "")[0].target if per_table is not None
                else apply.target).replace("{table}", tables if one_table else "{table}")
        if per_table is not None and not one_table and any(
                per_table(t)[0].target != per_table("")[0].target for t in table_config.tables):
            into += " (and the targets --config names)"
        console.print(f"replicating {what}{f' except {excluded}' if excluded else ''} from "
                      f"{redact_uri(endpoint)} into {into} (SCD {apply.scd}, schema drift "
                      f"{apply.schema_drift}{', once' if once else ''}) — Ctrl-C to stop",
                      soft_wrap=True)
        summary = StatusSummary()  # a line per change of state, a summary per interval
        writer = TableStatusWriter(functools.partial(status_location, endpoint, tables,
                                                     tunnel, options))
        metrics.attach(writer)  # the job's restarts too (record_status); the probe

        def show(pipeline: Any) -> None:
            statuses = writer.publish(pipeline.table_statuses(str(output), tables))
            # the last look (--once done, or the job stopping): its summary line whatever
            # the interval
            ended = job.stopping.is_set() or not any(q.isActive for q in pipeline.queries)
            for line in summary.lines(statuses, final=ended):
                console.print(line, soft_wrap=True)

        job = ReplicationJob(
            lambda: start_pipeline(spark, endpoint, tables, tunnel, output, apply, options,
                                   trigger_ms, exclude=excluded, per_table=per_table,
                                   once=once, retry=policy, cycle=cycle),
            policy or RestartPolicy(), say=lambda line: console.print(line, soft_wrap=True),
            record_status=writer.mark_all, on_progress=show, once=once)
        code = job.run()
        spark.stop()
        if code is JobExit.DONE:
            writer.mark_all("stopped", None)
        writer.close()
    finally:
        metrics.close()
        lock.release()
    if code is JobExit.DONE:
        console.print("caught up; run the same command again to go on" if once
                      else "stopped cleanly; run the same command again to resume")
    return code


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    """Was the flag of parameter ``name`` given on the command line (not its default)? By the
    source's name: typer runs on its own copy of click, whose ``ParameterSource`` is not
    ``click.core.ParameterSource``."""
    source = ctx.get_parameter_source(name)
    return getattr(source, "name", None) == "COMMANDLINE"
