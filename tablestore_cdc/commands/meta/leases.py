"""``tablestore-cdc meta break-lease``: end the lease of a query whose process is known dead,
so a new query on the same source starts at once instead of after the lease's expiry.

A query's planning process holds a lease on its source (``connector.planning.lease``) and
releases it when it stops; only a holder that was killed (SIGKILL, a lost host) leaves it
until it expires. The holder's owner id is ``host/pid/random``: on this host the command checks
that the pid is gone and refuses while it runs; a holder on another host cannot be checked from
here, and is broken only with ``--force`` (the operator vouches that it is dead: a live holder
whose lease is broken fails its next batch with ``SourceInUseError`` when the new query takes
the lease, and no batch is lost or doubled, but both queries stop).
"""

from __future__ import annotations

import time

import typer

from meta_store import Lease
from tablestore_cdc.commands.meta import common
from tablestore_cdc.feed.reading import InspectionError, resolve_namespace
from tablestore_cdc.lease_holder import holder_alive


def break_lease(
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None,
    force: bool = typer.Option(False, "--force", help="Break a lease whose holder runs on "
                               "another host (it cannot be checked from here)."),
    as_json: common.JsonOpt = False,
) -> None:
    """End the lease of a source's query whose process is dead, so a new query starts now."""
    with common.inspected_store(meta) as store:
        ns = resolve_namespace(store, namespace)
        lease: Lease | None = store.store.get_lease(ns)
        now = time.time()
        if lease is None or not lease.live(now):
            outcome = "no live lease: a query can start now"
        else:
            alive = holder_alive(lease.owner)
            if alive:
                raise InspectionError(detail=(
                    f"the lease's holder {lease.owner} is running on this host: stop it (its "
                    "lease is released when it stops) instead of breaking its lease"))
            if alive is None and not force:
                raise InspectionError(detail=(
                    f"the lease's holder {lease.owner} is on another host, where this command "
                    "cannot check that it is dead; make sure it is, then add --force"))
            store.store.release_lease(ns, lease.owner, now=now)
            outcome = f"lease of {lease.owner} broken: a query can start now"
        if as_json:
            common.print_json({"namespace": ns, "holder": lease.owner if lease else None,
                               "outcome": outcome})
        else:
            common.stdout_console().print(f"{ns}: {outcome}")
