"""``tablestore-cdc lake ...``: maintenance of the tables the apply sink writes
(tablestore_cdc/lakehouse/maintenance.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from tablestore_cdc.cli_errors import reported_errors

app = typer.Typer(help="Maintenance of the Delta and Iceberg tables replicate writes.",
                  no_args_is_help=True, rich_markup_mode=None)


@app.command("optimize")
def optimize_command(
    target: Annotated[str, typer.Option(help="The table, as replicate's --target: "
                                        "delta:///abs/path or iceberg:///abs/warehouse"
                                        "?table=ns.name.")],
    vacuum_hours: Annotated[int | None, typer.Option(
        min=0, help="Also remove files no version of the last N hours references (the files "
        "of batches killed before their commit among them); 0 only with the stream stopped. "
        "Iceberg: required (pyiceberg has no compaction, this is all it does).")] = None,
) -> None:
    """Compact a Delta target's small files, sorted by its key, beside the running stream
    (a batch committing meanwhile wins; run it again); remove unreferenced files of a Delta or
    an Iceberg target."""
    from tablestore_cdc.lakehouse.maintenance import describe, optimize

    with reported_errors():
        typer.echo(describe(optimize(target, vacuum_hours)))
