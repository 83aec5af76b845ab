"""``tablestore-cdc lake ...``: maintenance of the tables the apply sink writes
(tablestore_cdc/lakehouse/maintenance.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from tablestore_cdc.commands.errors import reported_errors

app = typer.Typer(help="Maintenance of the Delta and Iceberg tables replicate writes.",
                  no_args_is_help=True, rich_markup_mode=None)


@app.command("optimize")
def optimize_command(
    target: Annotated[str, typer.Option(help="The table, as replicate's --target: "
                                        "delta:///abs/path, delta+s3://bucket/prefix, "
                                        "iceberg:///abs/warehouse?table=ns.name or "
                                        "iceberg://catalog/ns.name.")],
    vacuum_hours: Annotated[int | None, typer.Option(
        min=0, help="Also remove files no version of the last N hours references (the files "
        "of batches killed before their commit among them); 0 only with the stream stopped. "
        "Iceberg: its data, manifest and metadata files no snapshot refers to.")] = None,
    expire_hours: Annotated[float | None, typer.Option(
        min=0, help="Iceberg: first expire the snapshots older than N hours (never the current "
        "one, nor those back to the newest batch of the table's job: its restart looks for "
        "it). Each kept snapshot slows every commit; keep hours at one batch every few "
        "seconds.")] = None,
    target_option: Annotated[list[str] | None, typer.Option(
        help="replicate's --target-option KEY=VALUE (repeatable): a delta-rs storage option "
        "or an Iceberg catalog property.")] = None,
) -> None:
    """Compact a Delta target's small files, sorted by its key, beside the running stream
    (a batch committing meanwhile wins; run it again); expire an Iceberg target's old
    snapshots; remove unreferenced files of a Delta or an Iceberg target."""
    from tablestore_cdc.lakehouse.maintenance import describe, optimize
    from tablestore_cdc.lakehouse.target import parse_target_options

    with reported_errors():
        typer.echo(describe(optimize(target, vacuum_hours, expire_hours,
                                     parse_target_options(target_option))))
