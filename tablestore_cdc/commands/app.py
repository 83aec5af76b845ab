"""The ``tablestore-cdc`` command: one typer app, one sub-command group per concern.

Each command's module is beside this one (``tablestore_cdc/commands/``) unless named:

- ``tablestore-cdc local ...``    the embedded store (``local.py``)
- ``tablestore-cdc meta ...``     meta-table inspection (``meta/``)
- ``tablestore-cdc progress``     the progress feed as JSON lines (``progress.py``)
- ``tablestore-cdc dashboard``    the progress dashboard web page (tablestore_cdc/dashboard)
- ``tablestore-cdc demo`` / ``replicate``  the pipeline (``replicate.py``)
- ``tablestore-cdc emulator``     the local Tablestore emulator (``emulator.py``)
- ``tablestore-cdc reconcile``    source table against its lakehouse copy (tablestore_cdc/reconcile)
- ``tablestore-cdc resnapshot``   the job repairs its copy (tablestore_cdc/resnapshot)
- ``tablestore-cdc lake ...``     the apply sink's tables' upkeep (tablestore_cdc/commands/lake.py)
"""

from __future__ import annotations

from typing import Annotated

import typer

from tablestore_cdc.commands.emulator import emulator_command
from tablestore_cdc.commands.errors import OneLineErrors, set_verbose
from tablestore_cdc.commands.lake import app as lake_app
from tablestore_cdc.commands.local import app as local_app
from tablestore_cdc.commands.meta import app as meta_app
from tablestore_cdc.commands.progress import feed_command
from tablestore_cdc.commands.replicate import demo, replicate
from tablestore_cdc.dashboard import dashboard_command
from tablestore_cdc.reconcile.command import reconcile
from tablestore_cdc.resnapshot.command import resnapshot

app = typer.Typer(
    help="Exactly-once CDC from Tablestore-style tunnels into Spark Structured Streaming.",
    cls=OneLineErrors,  # every error is one line (tablestore_cdc/commands/errors.py)
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    # plain help: typer's rich help shows every flag as "--json <bool>" with this click
    rich_markup_mode=None,
)


@app.callback()
def _options(verbose: Annotated[bool, typer.Option(
        "--verbose", envvar="TABLESTORE_CDC_VERBOSE",
        help="On an error, print its Python traceback before the one-line message (for a "
        "bug report). Goes before the command: tablestore-cdc --verbose meta batches")] = False,
             ) -> None:
    set_verbose(verbose)


app.add_typer(local_app, name="local")
app.add_typer(meta_app, name="meta")
app.add_typer(lake_app, name="lake")
app.command("demo")(demo)
app.command("replicate")(replicate)
app.command("reconcile")(reconcile)
app.command("resnapshot")(resnapshot)
app.command("progress")(feed_command)
app.command("dashboard")(dashboard_command)
app.command("emulator")(emulator_command)


if __name__ == "__main__":
    app()
