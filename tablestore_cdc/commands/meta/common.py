"""What every ``tablestore-cdc meta`` command shares: the flags (``--meta``, ``--namespace``,
``--json``, ``--endpoint``), the store opened for inspection, and how tables and JSON are
printed. ``tablestore-cdc progress`` (``tablestore_cdc/commands/progress.py``) uses them too."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from tablestore_cdc.commands.errors import reported_errors
from tablestore_cdc.feed.reading import InspectedStore, open_existing_meta_store

MetaOpt = Annotated[str, typer.Option(
    "--meta", envvar="TABLESTORE_CDC_META", show_envvar=True,
    help="Meta-store URI: sqlite:///abs/path.db, dynamodb://TABLE?region=... or "
    "tablestore://INSTANCE/TABLE?endpoint=http(s)://HOST[:PORT] (a query on a Tablestore "
    "endpoint uses tablestore://INSTANCE/tablestore_cdc_meta?endpoint=<its endpoint> unless "
    "meta.store or checkpoint.table says otherwise; `tablestore-cdc meta uri --endpoint ...` "
    "prints it). Credentials of a Tablestore meta store: ALIBABA_CLOUD_ACCESS_KEY_ID / _SECRET.")]
NamespaceOpt = Annotated[str | None, typer.Option(
    "--namespace", "-n", help="Source namespace (kind:service#table#tunnel, e.g. "
    "tablestore:INSTANCE#orders#t1; see `meta namespaces`); default: the only one.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
EndpointOpt = Annotated[str | None, typer.Option(
    "--endpoint", help="Tunnel endpoint URI to use instead of the one the namespace records "
    "(which has its secrets removed).")]


# --- plumbing -------------------------------------------------------------------------------


@contextmanager
def inspected_store(meta: str) -> Iterator[Any]:
    """The store, read so that a corrupt row is skipped and named (``InspectedStore``): each
    one gets a ``warning: ...`` line on stderr when the command ends, whatever its outcome."""
    with reported_errors():
        store = InspectedStore(open_existing_meta_store(meta))
        try:
            yield store
        finally:
            _warn_corrupt(store)
            store.store.close()


def _warn_corrupt(store: InspectedStore) -> None:
    for record in store.corrupt_records():
        reason = record["reason"]
        if reason.startswith("the info record"):
            typer.echo(f"warning: {reason}", err=True)
        else:
            typer.echo(f"warning: meta store {store.uri}: record {record['key']!r} is corrupt "
                       f"or foreign ({reason}); shown as corrupt, skipped", err=True)


def stdout_console() -> Console:
    """stdout console. Sentences are never broken over lines (a terminal wraps them itself),
    so a UUID or a path in one copies whole; not a terminal, tables are 200 columns wide so
    UUIDs are never cut in pipes and logs."""
    terminal = sys.stdout.isatty() or os.environ.get("COLUMNS")
    return Console(width=None if terminal else 200, soft_wrap=True)


def compact_table(title: str | None = None, caption: str | None = None) -> Table:
    """A compact table (no outer frame, single padding) so wide rows fit a terminal."""
    return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False,
                 pad_edge=False, padding=(0, 1), collapse_padding=True)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=False, default=str))
