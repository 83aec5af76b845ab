"""The demo's run: a fresh store, the pipeline, the writer, live counts, the verification."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from connector.errors import CdcError
from connector.planning.logs import LOG_LEVEL_ENV
from connector.tunnel.local import LocalTablestore
from tablestore_cdc.demo.writer import DEMO_TABLE, DemoWriter
from tablestore_cdc.pipeline import ApplySettings, Pipeline, start_pipeline
from tablestore_cdc.verify import rows_by_key, verify

console = Console(stderr=True)
result_console = Console()  # the verification line goes to stdout, for scripts
DEMO_MARKER = ".tablestore-cdc-demo"


#: the demo emulator's instance
DEMO_INSTANCE = "demo"
#: the demo table's attribute columns, as the reader's ``catalog`` option declares them
#: (Tablestore declares only the key)
DEMO_CATALOG = ('{"columns": {"customer": {"type": "string"}, "amount": {"type": "double"}, '
                '"status": {"type": "string"}}}')


def _start_demo_emulator(store_path: Path) -> tuple[Any, dict[str, str]]:
    """An in-process emulator over the demo's store file, with a key pair made up for this run,
    and the reader options to reach it (driver). The meta table lives in the same emulated
    instance; its store reads credentials from the environment, which the Spark processes
    started after this inherit."""
    from tablestore_emulator.server import EmulatorServer

    server = EmulatorServer.with_throwaway_key(str(store_path), DEMO_INSTANCE).start()
    os.environ.update(server.credential_env())
    return server, {**server.source_options(), "catalog": DEMO_CATALOG}


class ForeignWorkdirError(CdcError):
    """The demo was pointed at a directory it did not create: it never wipes one."""

    template = ("{workdir} is not empty and was not created by the demo; choose another "
                "--workdir")


def prepare_workdir(workdir: Path) -> None:
    """A fresh demo directory; refuses to wipe a directory the demo did not create."""
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / DEMO_MARKER).exists():
            raise ForeignWorkdirError(workdir=workdir)
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
            _show_live_counts(pipeline, writer, changes)
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


def _show_live_counts(pipeline: Pipeline, writer: DemoWriter, changes: int,
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

    from connector import generic_rows
    from tablestore_cdc.sinks import deliveries_from_rows
    from tablestore_cdc.verify import read_delta, table_state

    with LocalTablestore(store_path) as store:
        change_log = store.change_log(DEMO_TABLE)
        if wire:
            from tablestore_emulator.tunnel_api import wire_change_log

            change_log = wire_change_log(change_log)
        source = rows_by_key(store.scan(DEMO_TABLE))
        channels = store.list_channels(DEMO_TABLE)
    changelog = pipeline.apply.output.spark_path("changelog")
    changes, keys = generic_rows.decode(pq.read_table(changelog))
    result = verify(change_log, deliveries_from_rows(changes.to_pylist(), list(keys)),
                    check_order=False)
    table_path = pipeline.apply.target_of(DEMO_TABLE).removeprefix("delta://")
    state = table_state(read_delta(table_path), keys)
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
        f'import duckdb, deltalake; orders = deltalake.DeltaTable({path}).to_pyarrow_table(); '
        'duckdb.sql("SELECT status, count(*), round(sum(amount), 2) FROM orders '
        'GROUP BY status").show()',
    ]
    lines = [f"demo: the current state is the Delta table {table_path}; query it with deltalake, "
             f"Polars (both installed with the package) or DuckDB (first: {python} -m pip install "
             "duckdb):"]
    lines += [f"  {python} -c {shlex.quote(query)}" for query in queries]
    result_console.print("\n".join(lines), soft_wrap=True, highlight=False, markup=False)
