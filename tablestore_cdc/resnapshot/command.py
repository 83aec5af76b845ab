"""``tablestore-cdc resnapshot``: ask the running apply job to repair its target from the
source (docs/resnapshot.md).

Takes the source as ``replicate`` and ``reconcile`` do (``--store`` / ``--endpoint``,
``--option``, ``--tunnel``) and ``--table``; adds a pending signal to the meta table
(``meta_store.signals``) for the source identity those flags name, optionally limited to
``--from`` / ``--to`` on the first key column (``keyrange``), and prints its id, then on
stderr which target the table's job repairs (its own record in the meta table,
``reconcile.job_target``; the command itself never opens the target: the job repairs it
through its own apply sink), or that no job has recorded the table yet. ``--wait`` follows it
with a progress bar until the job marks it done (exit 0) or failed (exit 1); ``--list`` prints
the signals kept and their state. Bad flags: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from connector.clients import Clients
from meta_store.signals import Signal, SignalBoard, SignalState
from tablestore_cdc.commands.errors import fail, reported_errors
from tablestore_cdc.commands.source_flags import reader_options, source_endpoint
from tablestore_cdc.reconcile.errors import JobRecordMissingError
from tablestore_cdc.reconcile.job_target import job_target
from tablestore_cdc.reconcile.keyrange import KeyRange
from tablestore_cdc.reconcile.source import SourceSpec, declared_schema
from tablestore_cdc.resnapshot.repair import open_board

#: seconds between two reads of the signal while ``--wait`` follows it
POLL_S = 1.0


def key_range(spec: SourceSpec, key_from: str | None, key_to: str | None) -> KeyRange | None:
    """``--from`` / ``--to`` checked against the table's first key column (None: no range)."""
    if key_from is None and key_to is None:
        return None
    options = spec.source_options()
    with Clients().tunnel(options.endpoint) as tunnel:
        return KeyRange.parse(declared_schema(options, tunnel), key_from, key_to)


def resnapshot(
    table: Annotated[str, typer.Option(help="The table whose copy the job repairs.")],
    store: Annotated[Path | None, typer.Option(
        help="The local store file (short for --endpoint local:///abs/STORE).")] = None,
    endpoint: Annotated[str | None, typer.Option(
        help="The source endpoint, as given to replicate.")] = None,
    tunnel: Annotated[str, typer.Option(help="replicate's --tunnel.")] = "replicate",
    option: Annotated[list[str] | None, typer.Option(
        help="Reader option KEY=VALUE as given to replicate (repeatable; meta.store, "
        "credentials).")] = None,
    key_from: Annotated[str | None, typer.Option(
        "--from", help="Read and repair only keys whose first key column is >= this "
        "value.")] = None,
    key_to: Annotated[str | None, typer.Option(
        "--to", help="Read and repair only keys whose first key column is < this value.")] = None,
    wait: Annotated[bool, typer.Option(
        help="Follow the signal until the job marks it done (exit 0) or failed (exit 1).")]
    = False,
    timeout: Annotated[float | None, typer.Option(
        min=0, help="With --wait: give up after this many seconds (exit 1).")] = None,
    list_signals: Annotated[bool, typer.Option(
        "--list", help="Print the table's signals and their state; add none.")] = False,
) -> None:
    """Make the running replicate job re-read the table and repair its copy between two of its
    batches: upserts of rows missing or different in the target, deletes of rows the source
    lacks, leaving rows the stream is still changing to the stream."""
    if list_signals and (key_from is not None or key_to is not None or wait):
        fail("--list takes no --from, --to or --wait")
    spec = SourceSpec(source_endpoint(store, endpoint), table, tunnel, reader_options(option))
    with reported_errors():
        span = None if list_signals else key_range(spec, key_from, key_to)
        with open_board(spec) as board:
            if list_signals:
                for signal in board.signals():
                    typer.echo(signal.describe())
                return
            signal = board.add(Signal(table=table,
                                      key_from=None if span is None else span.key_from,
                                      key_to=None if span is None else span.key_to))
            typer.echo(f"resnapshot {signal.id} of {table}: pending")
            typer.echo(repaired_by(spec), err=True)
            if wait:
                final = follow(board, signal, timeout)
                typer.echo(final.describe())
                raise typer.Exit(0 if final.state is SignalState.DONE else 1)


def repaired_by(spec: SourceSpec) -> str:
    """Which job repairs ``spec``'s table, from the job's record (``job_target``): a line for
    stderr. The record holds no secret."""
    try:
        recorded = job_target(spec)
    except JobRecordMissingError:
        return (f"note: no replicate job has recorded table {spec.table} in this meta table "
                f"(tunnel {spec.tunnel}): the signal waits until one runs")
    return f"repaired by the job with --output {recorded.job}, into {recorded.target}"


def follow(board: SignalBoard, signal: Signal, timeout: float | None) -> Signal:
    """The signal once finished (or as it is at ``timeout``), with a progress bar on stderr."""
    err = Console(stderr=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    with Progress(TextColumn("{task.description}"), BarColumn(bar_width=30),
                  TextColumn("{task.percentage:>3.0f} %"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(f"resnapshot {signal.id}: pending", total=100)
        while True:
            current = next((s for s in board.signals() if s.id == signal.id), None)
            if current is None:
                fail(f"resnapshot {signal.id}: no longer in the meta table")
            bar.update(task, completed=current.percent or 0,
                       description=f"resnapshot {signal.id}: {current.state.value}")
            if current.finished or (deadline is not None and time.monotonic() > deadline):
                return current
            time.sleep(POLL_S)
