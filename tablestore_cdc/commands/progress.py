"""``tablestore-cdc progress``: the progress feed as JSON lines (mounted by
``tablestore_cdc/commands/app.py``; docs/progress-feed.md).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from tablestore_cdc.commands.errors import reported_errors
from tablestore_cdc.commands.meta.common import EndpointOpt, MetaOpt, NamespaceOpt, inspected_store
from tablestore_cdc.feed.polling import follow_feed
from tablestore_cdc.feed.reading import user_namespaces


def feed_command(
    meta: MetaOpt, namespace: NamespaceOpt = None, endpoint: EndpointOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f",
                                         help="Keep polling; print new or changed batches.")
                      ] = False,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between polls.")] = 1.0,
    no_tunnel: Annotated[bool, typer.Option("--no-tunnel",
                                            help="Do not ask the tunnel for lag/waiting.")
                         ] = False,
) -> None:
    """The progress feed as JSON lines: one record per batch (docs/progress-feed.md)."""
    with inspected_store(meta) as store, reported_errors():
        try:
            if follow and namespace is None and not user_namespaces(store):
                typer.echo(f"waiting for a query to write to {store.uri} (Ctrl-C stops)…",
                           err=True)
            for record in follow_feed(store, namespace, interval=interval, follow=follow,
                                      endpoint=endpoint, with_tunnel=not no_tunnel):
                sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
                sys.stdout.flush()
        except KeyboardInterrupt:
            return
        except BrokenPipeError:  # `... | head`: the reader went away
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return
