"""The main job: a CDC pipeline from a table into a Parquet change log and a queryable table.

Two streaming queries in one Spark driver:

1. ``readStream.format("tablestore")`` -> Spark's Parquet **file sink** (``<out>/changelog``):
   every insert, update and delete, exactly once (the file sink's own log makes writes atomic);
2. ``readStream.parquet(<out>/changelog)`` -> ``foreachBatch`` -> an apply sink
   (``tablestore_cdc.lakehouse``): the table's current state (SCD type 1) or its history (SCD
   type 2) in a Delta Lake or Iceberg table, one idempotent commit per batch (docs/lakehouse.md).

``tablestore-cdc demo`` builds an embedded store, runs a writer with channel splits and a merge
while the pipeline runs, shows live progress, then verifies nothing was lost or doubled and that
the Delta table equals the source table row by row. ``tablestore-cdc replicate`` runs the same
pipeline on any endpoint until stopped; a restart resumes exactly (checkpoints live under
``<out>``).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from cdc_common.credentials import ALIBABA_ACCESS_KEY_ID, ALIBABA_ACCESS_KEY_SECRET
from cdc_common.uris import redact_uri
from connector.planning.logs import LOG_LEVEL_ENV
from connector.tunnel.local import LocalTablestore
from tablestore_cdc.cli_errors import reported_errors
from tablestore_cdc.source_flags import reader_options, source_endpoint
from tablestore_cdc.verify import key_of, rows_by_key, verify

console = Console(stderr=True)
result_console = Console()  # the verification line goes to stdout, for scripts
DEMO_MARKER = ".tablestore-cdc-demo"
DEMO_TABLE = "orders"


@dataclass
class Pipeline:
    """The two running queries of the job and where they write (driver)."""

    changelog: Any
    state_query: Any
    #: the apply sink of the second query (``tablestore_cdc.lakehouse.ApplySink``)
    sink: Any
    target: str
    key_columns: tuple[str, ...]
    changelog_dir: Path
    delivered_by_batch: dict[int, int] = field(default_factory=dict)
    listener: Any = None  # the ProgressListener attached by start_pipeline

    def poll(self) -> tuple[int, int]:
        """(changes delivered to the change log, batches) from the query's progress."""
        for progress in self.changelog.recentProgress:
            self.delivered_by_batch[progress["batchId"]] = progress["numInputRows"]
        return sum(self.delivered_by_batch.values()), len(self.delivered_by_batch)

    def applied_batch(self) -> int | None:
        """The newest batch of the apply query recorded in the target table."""
        return self.sink.committed_batch(str(self.state_query.id))

    def check(self) -> None:
        for query in (self.changelog, self.state_query):
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")

    def drain(self) -> None:
        self.check()
        self.changelog.processAllAvailable()
        self.state_query.processAllAvailable()

    def stop(self) -> None:
        for query in (self.changelog, self.state_query):
            query.stop()
        if self.listener is not None:  # the dashboard shows "stopped" only once it is recorded
            self.listener.wait_terminated(timeout=10)


@dataclass(frozen=True)
class ApplySettings:
    """Where and how the second query applies the changes (``--target``, ``--scd``, ...)."""

    target: str
    scd: int = 1
    schema_drift: str = "lenient"
    soft_delete_column: str | None = None
    adopt_target: bool = False


def start_pipeline(spark: Any, endpoint: str, table: str, tunnel: str, out: Path,
                   apply: ApplySettings, options: dict[str, str] | None = None,
                   trigger_ms: int = 0) -> Pipeline:
    """Start the change-log and apply queries (driver) on any ``endpoint`` the source reads
    (``local://``, the emulator's or a service's ``http(s)://``, ``dynamodb-streams://``)."""
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
    sink = open_apply_sink(apply.target, key_columns=key_columns, scd=apply.scd,
                           schema_drift=apply.schema_drift,
                           soft_delete_column=apply.soft_delete_column,
                           source=f"{redact_uri(endpoint)}#{table}",
                           adopt_target=apply.adopt_target)
    listener = _attach_listener(spark, {"endpoint": endpoint,
                                        "table.name": table, "tunnel.name": tunnel,
                                        **(options or {})})
    changelog_dir = out / "changelog"
    trigger = {"processingTime": f"{trigger_ms} milliseconds"}
    changelog = (changes.writeStream.format("parquet").queryName("changelog")
                 .option("path", str(changelog_dir))
                 .option("checkpointLocation", str(out / "_checkpoints" / "changelog"))
                 .trigger(**trigger).start())
    state_query = (spark.readStream.schema(changes.schema).parquet(str(changelog_dir))
                   .writeStream.queryName("apply").foreachBatch(sink)
                   .option("checkpointLocation", str(out / "_checkpoints" / "apply"))
                   .trigger(**trigger).start())
    return Pipeline(changelog, state_query, sink, apply.target, key_columns, changelog_dir,
                    listener=listener)


def _checkpoint_query_id(checkpoint: Path) -> str | None:
    """The streaming query id Spark keeps in a checkpoint (its ``metadata`` file), or None."""
    import json

    try:
        return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _attach_listener(spark: Any, source_options: dict[str, str]) -> Any:
    """A ``ProgressListener`` for this source on ``spark`` (driver), so the dashboard, ``meta
    show`` and ``progress`` know Spark's batch ids and rates and see the query stop."""
    from connector.options import SourceOptions
    from tablestore_cdc.listener import ProgressListener

    options = SourceOptions.from_spark(source_options)
    # (a checkpoint of an earlier version keeps the namespace it was written in)
    listener = ProgressListener(options.meta_store,
                                namespaces={options.source_identity, options.legacy_namespace},
                                credentials=options.meta_store_credentials)
    spark.streams.addListener(listener)
    return listener


# --- demo -------------------------------------------------------------------------------------


@dataclass(eq=False)  # a thread must stay hashable
class DemoWriter(threading.Thread):
    """Writes inserts, updates and deletes at a steady rate, splitting two channels and merging
    two adjacent ones along the way. Opens its own store connection (its own thread)."""

    store_path: Path
    changes: int
    duration_s: float
    seed: int
    #: write through the official SDK to this emulator instead of the store file
    emulator: Any = None
    written: int = 0
    splits: int = 0
    merges: int = 0
    error: BaseException | None = None

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name="demo-writer", daemon=True)

    def run(self) -> None:
        try:
            self._write()
        except BaseException as exc:  # surfaced by the job
            self.error = exc

    def _write(self) -> None:
        rng = random.Random(self.seed)
        live: list[int] = []
        next_id = 0
        interval = self.duration_s / max(self.changes, 1)
        started = time.monotonic()
        with LocalTablestore(self.store_path) as store:
            rows: Any = store if self.emulator is None else _SdkRows(self.emulator)
            for i in range(self.changes):
                self._reshape(store, i)
                roll = rng.random()
                if not live or roll < 0.45:
                    next_id += 1
                    live.append(next_id)
                    rows.put_row(DEMO_TABLE, {"order_id": next_id}, {
                        "customer": f"c{rng.randrange(50)}",
                        "amount": round(rng.uniform(1, 500), 2), "status": "new"})
                elif roll < 0.8:
                    rows.update_row(DEMO_TABLE, {"order_id": rng.choice(live)}, {
                        "status": rng.choice(["paid", "shipped", "returned"]),
                        "amount": round(rng.uniform(1, 500), 2)})
                else:
                    rows.delete_row(DEMO_TABLE, {"order_id": live.pop(rng.randrange(len(live)))})
                self.written = i + 1
                # steady pace: sleep off any lead over the schedule
                lead = started + (i + 1) * interval - time.monotonic()
                if lead > 0:
                    time.sleep(lead)

    def _reshape(self, store: LocalTablestore, i: int) -> None:
        """Split at 25% and 50% of the run, merge the first split's children at 75%."""
        if i == self.changes // 4 or i == self.changes // 2:
            open_channels = [c for c in store.list_channels(DEMO_TABLE) if not c.closed]
            store.split_channel(DEMO_TABLE, open_channels[0].channel_id)
            self.splits += 1
        elif i == 3 * self.changes // 4:
            first_split = [c for c in store.list_channels(DEMO_TABLE)
                           if len(c.parent_ids) == 1 and not c.closed]
            ordered = sorted(first_split, key=lambda c: c.range_lo)
            for a, b in zip(ordered, ordered[1:], strict=False):
                if a.range_hi == b.range_lo:
                    store.merge_channels(DEMO_TABLE, a.channel_id, b.channel_id)
                    self.merges += 1
                    return


class _SdkRows:
    """The writer's row calls through the official ``tablestore`` SDK to the emulator."""

    def __init__(self, emulator: Any) -> None:
        from tablestore import Condition, OTSClient, RowExistenceExpectation
        from tablestore.retry import WriteRetryPolicy

        self.client = OTSClient(emulator.url, emulator.access_key_id, emulator.access_key_secret,
                                emulator.instance, retry_policy=WriteRetryPolicy(),
                                logger_name="tablestore-cdc-demo")
        self.ignore = Condition(RowExistenceExpectation.IGNORE)

    def put_row(self, table: str, pk: dict[str, Any], columns: dict[str, Any]) -> None:
        from tablestore import Row

        self.client.put_row(table, Row(list(pk.items()), list(columns.items())), self.ignore)

    def update_row(self, table: str, pk: dict[str, Any], columns: dict[str, Any]) -> None:
        from tablestore import Row

        self.client.update_row(table, Row(list(pk.items()), {"PUT": list(columns.items())}),
                               self.ignore)

    def delete_row(self, table: str, pk: dict[str, Any]) -> None:
        from tablestore import Row

        self.client.delete_row(table, Row(list(pk.items())), self.ignore)


#: the demo emulator's instance and its (throwaway, per-run) key id
DEMO_INSTANCE = "demo"


def _start_demo_emulator(store_path: Path) -> tuple[Any, dict[str, str]]:
    """An in-process emulator over the demo's store file and the reader options to reach it
    (driver). The meta table lives in the same emulated instance; its store reads credentials
    from the environment, which the Spark processes started after this inherit."""
    import secrets

    from tablestore_emulator.server import EmulatorServer

    key_id, secret = "demo-" + secrets.token_hex(4), secrets.token_urlsafe(18)
    server = EmulatorServer(str(store_path), DEMO_INSTANCE, key_id, secret).start()
    os.environ[ALIBABA_ACCESS_KEY_ID] = key_id
    os.environ[ALIBABA_ACCESS_KEY_SECRET] = secret
    options = {"instance.name": DEMO_INSTANCE, "access.key.id": key_id,
               "access.key.secret": secret,
               "catalog": '{"columns": {"customer": {"type": "string"}, "amount": '
                          '{"type": "double"}, "status": {"type": "string"}}}'}
    return server, options


def wire_sequences(change_log: list[Any]) -> list[Any]:
    """The store's change log with ``sequence`` as the emulator's Tunnel API carries it."""
    import dataclasses

    return [dataclasses.replace(r, sequence=f"{0:08x}:{r.commit_ts_us:016x}:"
                                f"{int(r.sequence):08x}") for r in change_log]


def prepare_workdir(workdir: Path) -> None:
    """A fresh demo directory; refuses to wipe a directory the demo did not create."""
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / DEMO_MARKER).exists():
            raise typer.BadParameter(
                f"{workdir} is not empty and was not created by the demo; choose another "
                "--workdir", param_hint="--workdir")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / DEMO_MARKER).touch()


def run_demo(workdir: Path, changes: int, duration_s: float, channels: int, seed: int,
             master: str, backend: str = "local") -> bool:
    """The whole demo; returns whether verification passed (driver). ``backend="emulator"``
    serves the store through the emulator and runs everything over the wire: the writer uses
    the official SDK, the source the Tunnel API, the meta table is in the emulated instance."""
    from connector.spark import local_session

    prepare_workdir(workdir)
    # the live progress bar replaces the per-batch log lines of the planning process
    os.environ.setdefault(LOG_LEVEL_ENV, "WARNING")
    store_path = workdir / "store.db"
    with LocalTablestore(store_path) as store:
        store.create_table(DEMO_TABLE, primary_key=[("order_id", "INTEGER")],
                           columns=[("customer", "STRING"), ("amount", "DOUBLE"),
                                    ("status", "STRING")], channels=channels)
    emulator, options = None, None
    if backend == "emulator":
        emulator, options = _start_demo_emulator(store_path)
    console.print(f"[bold]demo[/] store {store_path} · table {DEMO_TABLE} · {channels} channels"
                  f" · {changes} changes over ~{duration_s:.0f}s · "
                  + (f"over the wire at {emulator.url} · " if emulator else "")
                  + f"starting Spark ({master})")
    try:
        spark = local_session("tablestore-cdc-demo", master=master)
        endpoint = emulator.url if emulator else f"local://{store_path}"
        target = ApplySettings(f"delta://{workdir / 'out' / DEMO_TABLE}")
        pipeline = start_pipeline(spark, endpoint, DEMO_TABLE, "demo", workdir / "out", target,
                                  options=options)
        writer = DemoWriter(store_path, changes, duration_s, seed, emulator=emulator)
        writer.start()
        try:
            _show_progress(pipeline, writer, changes)
            if writer.error is not None:
                raise writer.error
            pipeline.drain()
        finally:
            pipeline.stop()
        ok = _verify_demo(pipeline, store_path, writer, wire=emulator is not None)
        spark.stop()
    finally:
        if emulator is not None:
            emulator.stop()
    return ok


def _show_progress(pipeline: Pipeline, writer: DemoWriter, changes: int,
                   catch_up_timeout_s: float = 180) -> None:
    columns = (BarColumn(bar_width=20), TextColumn(
        "written {task.fields[written]} · delivered {task.completed:.0f} · "
        "batches {task.fields[batches]} · lag {task.fields[lag]} · "
        "splits {task.fields[splits]} merge {task.fields[merges]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("changes", total=changes, written=0, batches=0, lag=0,
                                 splits=0, merges=0)
        deadline = None
        while True:
            pipeline.check()
            delivered, batches = pipeline.poll()
            progress.update(task, completed=delivered, written=writer.written, batches=batches,
                            lag=writer.written - delivered, splits=writer.splits,
                            merges=writer.merges)
            if not writer.is_alive():
                if delivered >= writer.written or writer.error is not None:
                    return
                deadline = deadline or time.monotonic() + catch_up_timeout_s
                if time.monotonic() > deadline:
                    console.print("[red]timed out waiting for the pipeline to catch up")
                    return
            time.sleep(0.5)


def _verify_demo(pipeline: Pipeline, store_path: Path, writer: DemoWriter,
                 wire: bool = False) -> bool:
    """Compare the change log with the store's, and the Delta table (read back with deltalake,
    not through the sink) with the store's table row by row; print where the table is."""
    import pyarrow.parquet as pq

    from tablestore_cdc.sinks import deliveries_from_rows
    from tablestore_cdc.verify import read_delta, table_state

    with LocalTablestore(store_path) as store:
        change_log = store.change_log(DEMO_TABLE)
        if wire:
            change_log = wire_sequences(change_log)
        source = rows_by_key(store.scan(DEMO_TABLE))
        channels = store.list_channels(DEMO_TABLE)
    rows = pq.read_table(pipeline.changelog_dir).to_pylist()
    result = verify(change_log, deliveries_from_rows(rows, ["order_id"]), check_order=False)
    table_path = pipeline.target.removeprefix("delta://")
    state = table_state(read_delta(table_path), pipeline.key_columns)
    state_ok = {k: dict(v) for k, v in source.items()} == state
    _, batches = pipeline.poll()
    _print_where(table_path)
    line = (f"demo: {result.expected} changes written ({writer.splits} splits, {writer.merges} "
            f"merge(s), {len(channels)} channels), {result.delivered} delivered in {batches} "
            f"batches: {result.lost} lost, {result.duplicated} duplicated; current state "
            f"{'matches' if state_ok else 'DIFFERS FROM'} the source table row by row "
            f"({len(source)} rows in the Delta table)")
    ok = result.lost == 0 and result.duplicated == 0 and state_ok
    result_console.print(f"[{'green' if ok else 'red'}]{line}", soft_wrap=True)
    if not ok:
        console.print(f"examples: {result.examples}; state keys differing: "
                      f"{sorted(set(state) ^ set(source))[:5]}")
    return ok


def _print_where(table_path: str) -> None:
    """Where the Delta table is and how to query it: one-liners for this interpreter, which has
    ``deltalake`` (a base dependency); Polars and DuckDB need one ``pip install``. All run
    offline (DuckDB reads the table through Arrow: its ``delta`` extension would be downloaded).
    tests/test_doc_snippets.py runs the lines as printed."""
    python = shlex.quote(sys.executable)
    path = json.dumps(table_path)  # a Python string literal, inside the shell's single quotes
    queries = [  # double quotes only: shlex.quote then wraps each in plain single quotes
        f'from deltalake import DeltaTable; print(DeltaTable({path}).to_pyarrow_table()'
        '.group_by("status").aggregate([("order_id", "count"), ("amount", "sum")]))',
        f'import polars as pl; print(pl.read_delta({path}).group_by("status")'
        '.agg(pl.len(), pl.col("amount").sum().round(2)))',
        f'import duckdb, deltalake; orders = deltalake.DeltaTable({path}).to_pyarrow_dataset(); '
        'duckdb.sql("SELECT status, count(*), round(sum(amount), 2) FROM orders '
        'GROUP BY status").show()',
    ]
    lines = [f"demo: the current state is the Delta table {table_path}; query it with deltalake, "
             f"Polars (both installed with the package) or DuckDB (first: {python} -m pip install "
             "duckdb):"]
    lines += [f"  {python} -c {shlex.quote(query)}" for query in queries]
    result_console.print("\n".join(lines), soft_wrap=True, highlight=False, markup=False)


# --- commands -----------------------------------------------------------------------------------


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
            _checkpoint_query_id(output / "_checkpoints" / "apply"))
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


__all__ = ["ApplySettings", "demo", "replicate", "start_pipeline", "key_of"]
