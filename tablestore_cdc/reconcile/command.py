"""``tablestore-cdc reconcile``: is the lake copy equal to the source right now?

Takes the source as ``replicate`` does (``--store`` / ``--endpoint``, ``--option``,
``--table``, ``--tunnel``); the target of each table is the one its ``replicate`` job recorded
in the meta table (``job_target``: whatever the job's ``--target``, ``--config`` or
``--output`` said), unless ``--target`` names one. Reconciles each table
(``run.reconcile_table``), prints a summary (or ``--json``) and exits:

- 0: every table equals its target, but for differences still in flight;
- 1: a difference that is not in flight (MISSING, EXTRA or DIFFERENT);
- 2: the command could not run (a bad flag, option, endpoint or target; one ``error:`` line).

Read-only on both sides; runs while the stream runs. A progress bar on stderr when it is a
terminal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from tablestore_cdc.commands.errors import fail, reported_errors
from tablestore_cdc.commands.source_flags import reader_options, source_endpoint
from tablestore_cdc.lakehouse.target import parse_target_options
from tablestore_cdc.reconcile import compare
from tablestore_cdc.reconcile.errors import JobOutputError, JobRecordMissingError
from tablestore_cdc.reconcile.job_target import job_target, output_target
from tablestore_cdc.reconcile.run import TableReport, as_json, json_value, reconcile_table
from tablestore_cdc.reconcile.source import SourceSpec

TABLE_PLACEHOLDER = "{table}"


class BarProgress(compare.Progress):
    """``compare.Progress`` as a rich progress bar (one line per step, on stderr)."""

    def __init__(self, progress: Progress, table: str) -> None:
        self.progress, self.table = progress, table
        self.task: TaskID | None = None

    def begin(self, what: str, total: int | None) -> None:
        self.task = self.progress.add_task(f"{self.table}: {what}", total=total)

    def advance(self, rows: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, rows)

    def end(self) -> None:
        if self.task is not None:
            task = self.progress.tasks[-1]
            self.progress.update(self.task, total=task.completed)
        self.task = None


def reconcile(
    table: Annotated[list[str], typer.Option(
        help="The table to reconcile (repeatable), with the target its replicate job "
        "recorded in the meta table (or --target).")],
    target: Annotated[str | None, typer.Option(
        help="Another copy than the job's, as replicate's --target: delta:///abs/path, "
        "delta+s3://bucket/prefix, iceberg:///abs/warehouse?table=namespace.table or "
        "iceberg://catalog/namespace.table; {table} stands for the table's name (default: "
        "the target the table's job recorded in the meta table).")]
    = None,
    target_option: Annotated[list[str] | None, typer.Option(
        help="replicate's --target-option KEY=VALUE (repeatable): a delta-rs storage option "
        "or an Iceberg catalog property.")] = None,
    output: Annotated[str | None, typer.Option(
        help="replicate's --output (a directory or s3://BUCKET/PREFIX): checked against the "
        "job's record; for a job that recorded no target, its Delta table at OUTPUT/TABLE or "
        "OUTPUT/lake/TABLE.")] = None,
    store: Annotated[Path | None, typer.Option(
        help="The local store file (short for --endpoint local:///abs/STORE).")] = None,
    endpoint: Annotated[str | None, typer.Option(
        help="The source endpoint, as replicate's: local:///abs/store.db, the emulator's or a "
        "Tablestore instance's http(s):// URL, dynamodb-streams://...")] = None,
    tunnel: Annotated[str, typer.Option(
        help="The stream's tunnel (replicate's --tunnel): where the meta table's positions "
        "are.")] = "replicate",
    option: Annotated[list[str] | None, typer.Option(
        help="Reader option KEY=VALUE as given to replicate (repeatable): credentials, "
        "catalog, meta.store, ...")] = None,
    soft_delete_column: Annotated[str | None, typer.Option(
        help="replicate's --soft-delete-column: target rows with it true count as deleted.")]
    = None,
    ignore_column: Annotated[list[str] | None, typer.Option(
        help="An attribute left out of the comparison on both sides (repeatable).")] = None,
    in_flight: Annotated[bool, typer.Option(
        "--in-flight/--no-in-flight",
        help="Label differences whose source row changed after the target's applied position "
        "IN-FLIGHT (they do not fail the command); --no-in-flight counts every difference.")]
    = True,
    as_json_flag: Annotated[bool, typer.Option(
        "--json", help="Print the reports as one JSON document on stdout.")] = False,
    limit: Annotated[int, typer.Option(
        min=0, help="Differences listed per table (all are counted).")] = 20,
) -> None:
    """Compare source tables with their Delta or Iceberg copies: MISSING, EXTRA and DIFFERENT
    rows, IN-FLIGHT when the stream has yet to apply them. Exit 0: equal (in-flight
    differences only); 1: differences; 2: could not run. Read-only; runs while the stream
    runs."""
    source = source_endpoint(store, endpoint)
    extra = reader_options(option)
    if target is not None and len(table) > 1 and TABLE_PLACEHOLDER not in target:
        fail(f"--target: with several --table, the target must contain {TABLE_PLACEHOLDER}")
    err = Console(stderr=True)
    reports: list[TableReport] = []
    with reported_errors():
        target_options = parse_target_options(target_option)
        specs = [SourceSpec(source, name, tunnel, extra) for name in table]
        targets = [target_uri(spec, target, output) for spec in specs]
    with reported_errors(), Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TimeElapsedColumn(), console=err, transient=True,
            disable=not err.is_terminal) as bar:
        for spec, uri in zip(specs, targets, strict=True):
            reports.append(reconcile_table(
                spec, uri, soft_delete_column=soft_delete_column, ignore=ignore_column or (),
                in_flight=in_flight, progress=BarProgress(bar, spec.table),
                target_options=target_options))
    if as_json_flag:
        typer.echo(json.dumps({"ok": all(r.ok for r in reports),
                               "tables": [as_json(r, limit) for r in reports]}, indent=2))
    else:
        out = Console(soft_wrap=True, highlight=False)
        for report in reports:
            print_report(out, report, limit)
    raise typer.Exit(0 if all(r.ok for r in reports) else 1)


def target_uri(spec: SourceSpec, target: str | None, output: str | None) -> str:
    """The target ``spec``'s table is compared with: ``--target`` (its ``{table}`` replaced),
    else the one the table's job recorded (``job_target``; ``--output``, when given, must name
    that job), else, for a job that recorded none, its Delta table under ``--output``
    (``output_target``). ``JobRecordMissingError`` without any."""
    if target is not None:
        return target.replace(TABLE_PLACEHOLDER, spec.table)
    try:
        recorded = job_target(spec)
    except JobRecordMissingError:
        if output is None or "://" in output:  # a job of an S3 output records its targets
            raise
        return output_target(Path(output).resolve(), spec.table)
    if output is not None and not _same_output(recorded.job, output):
        raise JobOutputError(output=output, table=spec.table, job=recorded.job,
                             target=recorded.target)
    return recorded.target


def _same_output(recorded: str, given: str) -> bool:
    """Does ``--output`` ``given`` name the job's output as its status record has it (an
    absolute path, or ``s3://BUCKET/PREFIX``)?"""
    if "://" in recorded or "://" in given:
        return recorded.rstrip("/") == given.replace("s3a://", "s3://", 1).rstrip("/")
    return Path(recorded).resolve() == Path(given).resolve()


def print_report(out: Console, report: TableReport, limit: int) -> None:
    """The summary of one table, then its first ``limit`` differences."""
    c, counts = report.comparison, report.counts()
    out.print(f"[bold]{escape(report.table)}[/]: source {escape(report.source)} "
              f"({c.source_rows} rows) · target {escape(report.target)} version "
              f"{report.target_version or '-'} (SCD {report.scd}, {c.target_rows} current rows)"
              f" · {report.seconds:.1f}s")
    verdict = "[green]EQUAL[/]" if not c.differences else \
        "[green]EQUAL but for changes in flight[/]" if report.ok else "[red]DIFFERS[/]"
    out.print(f"  {verdict}: {counts['MISSING']} missing, {counts['EXTRA']} extra, "
              f"{counts['DIFFERENT']} different; {counts['IN-FLIGHT']} in flight "
              f"({c.unequal_buckets} unequal bucket(s): {c.drill_rows} row(s) compared by key)")
    if report.in_flight is not None and not report.in_flight.determined:
        out.print(f"  in flight: not determined: {escape(report.in_flight.note)}")
    listed = sorted(c.differences, key=lambda d: (d.in_flight, d.kind, repr(d.key)))
    for d in listed[:limit]:
        key = ", ".join(f"{k}={_shown(v)}" for k, v in zip(report.key_columns, d.key,
                                                             strict=True))
        detail = (f"columns {', '.join(d.columns)}: source {_shown(_pick(d.source, d.columns))}"
                  f" target {_shown(_pick(d.target, d.columns))}" if d.kind == "DIFFERENT"
                  else f"source {_shown(d.source)}" if d.kind == "MISSING"
                  else d.note or f"target {_shown(d.target)}")
        if d.in_flight:
            detail = f"{d.kind.lower()}: {detail}"
        out.print(f"  {d.label:<10} {escape(key)}  {escape(detail)}")
    if len(listed) > limit:
        out.print(f"  … {len(listed) - limit} more (--limit, --json)")


def _pick(values: dict[str, Any] | None, columns: list[str]) -> dict[str, Any] | None:
    return None if values is None else {c: values.get(c) for c in columns}


def _shown(value: Any) -> str:
    return json.dumps(json_value(value), ensure_ascii=False, default=str)
