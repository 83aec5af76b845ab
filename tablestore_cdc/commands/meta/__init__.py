"""``tablestore-cdc meta ...``: inspect a meta table (any backend, by URI).

Mounted by ``commands/app.py`` as ``tablestore-cdc meta``. Runs in an operator's shell.
Every command reads only, except ``gc --yes``, ``reset --yes`` and ``break-lease``. Each
prints rich tables for people, or JSON for scripts with ``--json``. The commands, by what they
are about: ``namespaces.py`` (``uri``, ``namespaces``, ``export``, ``reset``), ``batches.py``
(``batches``, ``show``, ``diff``, ``gc``), ``channels.py`` (``channels``, ``lag``),
``leases.py`` (``break-lease``), ``tables.py`` (``tables``: every table the
replication jobs recorded); ``common.py`` holds the flags, the store opened for
inspection and the printing they share.

- ``--meta URI`` (or ``$TABLESTORE_CDC_META``) picks the store: ``sqlite:///abs/meta.db`` or
  ``dynamodb://TABLE?region=..``. A SQLite path that does not exist is refused, never created.
- ``--namespace NS`` picks the source (``endpoint#table#tunnel``); by default the store's only
  namespace (several: an error listing them; ``namespaces`` lists them).
- Bad input (unknown UUID, missing or foreign store, unknown namespace) ends with a one-line
  ``error: ...`` on stderr and exit code 2, never a traceback. URIs are shown as the store's
  ``.uri``, which has secrets removed.

Examples::

    tablestore-cdc meta batches --meta sqlite:///data/orders.meta.db
    tablestore-cdc meta show 3f2a --meta sqlite:///data/orders.meta.db --json
    tablestore-cdc meta channels --meta sqlite:///data/orders.meta.db
    tablestore-cdc meta gc --keep 10 --meta sqlite:///data/orders.meta.db --yes
"""

from __future__ import annotations

import typer

from tablestore_cdc.commands.meta.batches import batches, diff, gc, show
from tablestore_cdc.commands.meta.channels import channels, lag
from tablestore_cdc.commands.meta.leases import break_lease
from tablestore_cdc.commands.meta.namespaces import export, meta_uri, namespaces, reset
from tablestore_cdc.commands.meta.tables import tables

app = typer.Typer(
    help="Inspect the meta table: batches, checkpoints, channels, lag, retention, export.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

app.command("uri")(meta_uri)
app.command()(namespaces)
app.command()(batches)
app.command()(show)
app.command()(diff)
app.command()(channels)
app.command()(lag)
app.command()(gc)
app.command()(reset)
app.command()(export)
app.command("break-lease")(break_lease)
app.command()(tables)
