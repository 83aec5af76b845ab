"""``tablestore-cdc replicate`` and ``tablestore-cdc demo``: the commands that run the pipeline.

Mounted by ``tablestore_cdc/cli.py``. Thin over the pipeline library (``tablestore_cdc.pipeline``)
and the demo (``tablestore_cdc.demo``): flags in, one line per change of the figures out, Ctrl-C
(or SIGTERM) stops cleanly; errors end in one ``error: ...`` line and exit code 2.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cdc_common.uris import redact_uri
from tablestore_cdc.cli_errors import reported_errors
from tablestore_cdc.demo.run import run_demo
from tablestore_cdc.pipeline import ApplySettings, start_pipeline
from tablestore_cdc.pipeline.queries import checkpoint_query_id
from tablestore_cdc.source_flags import reader_options, source_endpoint

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
    table: Annotated[str, typer.Option(help="The table to replicate.")],
    output: Annotated[Path, typer.Option(help="Change log and checkpoints (and the default "
                                         "target).")],
    store: Annotated[Path | None, typer.Option(
        help="The local store file (short for --endpoint local:///abs/STORE).")] = None,
    endpoint: Annotated[str | None, typer.Option(
        help="The source endpoint, as the reader's endpoint option: local:///abs/store.db, "
        "the emulator's or a Tablestore instance's http(s):// URL, dynamodb-streams://...")]
    = None,
    target: Annotated[str | None, typer.Option(
        help="Where changes are applied: delta:///abs/path or "
        "iceberg:///abs/warehouse?table=namespace.table (default: delta://OUTPUT/TABLE).")]
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
    tunnel: Annotated[str, typer.Option(help="Tunnel name (created if missing).")]
    = "replicate",
    option: Annotated[list[str] | None, typer.Option(
        help="Extra reader option KEY=VALUE (repeatable), e.g. maxOffsetsPerChannel=5000.")]
    = None,
    trigger_ms: Annotated[int, typer.Option(help="Trigger interval in ms (0 = ASAP).")] = 0,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
) -> None:
    """Replicate a table into a Delta or Iceberg table until stopped (Ctrl-C); a restart
    resumes exactly."""
    from connector.spark import local_session

    endpoint = source_endpoint(store, endpoint)
    extra = reader_options(option)
    output = output.resolve()
    apply = ApplySettings(target or f"delta://{output / table}", scd, schema_drift,
                          soft_delete_column, adopt_target)
    with reported_errors():
        from tablestore_cdc.lakehouse import open_apply_sink

        # a bad target or option, or a target of another job, fails here, before Spark starts
        open_apply_sink(apply.target, scd=scd, schema_drift=schema_drift,
                        soft_delete_column=soft_delete_column, adopt_target=adopt_target,
                        source=f"{redact_uri(endpoint)}#{table}").check_target(
            checkpoint_query_id(output / "_checkpoints" / "apply"))
        spark = local_session("tablestore-cdc-replicate", master=master)
        pipeline = start_pipeline(spark, endpoint, table, tunnel, output, apply, extra,
                                  trigger_ms)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    console.print(f"replicating {table} from {redact_uri(endpoint)} into {apply.target} "
                  f"(SCD {scd}, schema drift {schema_drift}) — Ctrl-C to stop")
    shown = None
    try:
        while True:
            pipeline.check()
            delivered, batches = pipeline.poll()
            applied = pipeline.applied_batch()
            figures = (delivered, batches, applied)
            if figures != shown:
                # a whole line when the figures change, never a line rewritten in place: the
                # planning process logs to the same terminal, and a line it writes must not
                # land in the middle of ours
                console.print(f"delivered {delivered} change(s) in {batches} batch(es); target "
                              f"at apply batch {'-' if applied is None else applied}",
                              soft_wrap=True)
                shown = figures
            time.sleep(2)
    except KeyboardInterrupt:
        console.print("stopping…")
    finally:
        pipeline.stop()
        spark.stop()
    console.print("stopped cleanly; run the same command again to resume")
