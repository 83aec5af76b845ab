"""Whole-namespace commands: ``meta uri``, ``meta namespaces``, ``meta export``, ``meta reset``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tablestore_cdc.commands.errors import fail, reported_errors
from tablestore_cdc.commands.meta import common
from tablestore_cdc.feed.reading import resolve_namespace, user_namespaces
from tablestore_cdc.feed.shapes import FEED_SCHEMA_VERSION
from tablestore_cdc.query_record import load_spark_metrics


def meta_uri(
    endpoint: Annotated[str, typer.Option(
        "--endpoint", help="The query's endpoint option (local:///..., http(s)://...).")],
    instance: Annotated[str | None, typer.Option(
        "--instance", help="The query's instance.name (default: ?instance= of the endpoint, "
        "else the host's first label).")] = None,
    checkpoint_table: Annotated[str | None, typer.Option(
        "--checkpoint-table", help="The query's checkpoint.table, if it set one.")] = None,
) -> None:
    """Print the meta-store URI a query with these options uses when it sets no meta.store,
    for --meta (or TABLESTORE_CDC_META) of the other commands and the dashboard."""
    from urllib.parse import urlsplit

    from cdc_common.uris import tablestore_instance
    from connector.tunnel.endpoint import default_local_meta_store as default_meta_store
    from connector.tunnel.tablestore.endpoint import tablestore_meta_store

    parts = urlsplit(endpoint)
    if parts.scheme in ("http", "https") and parts.hostname:
        name = tablestore_instance(endpoint, instance)
        if not name:
            fail("--instance: the endpoint's host does not name the instance; give the "
                 "query's instance.name")
        typer.echo(tablestore_meta_store(f"{parts.scheme}://{parts.netloc}", name,
                                         checkpoint_table))
        return
    uri = default_meta_store(endpoint)
    if uri is None:
        fail(f"--endpoint {endpoint!r}: a query on it has no default meta store; its "
             "meta.store option is the URI to give --meta")
    typer.echo(uri)


def namespaces(meta: common.MetaOpt, as_json: common.JsonOpt = False) -> None:
    """List the sources (namespaces) the meta store holds."""
    with common.inspected_store(meta) as store:
        rows: list[dict[str, Any]] = []
        for ns in user_namespaces(store):
            info = store.get_namespace_info(ns) or {}
            batches = store.list_batches(ns)
            latest = store.latest_committed(ns)
            rows.append({
                "namespace": ns, "endpoint": info.get("endpoint"), "table": info.get("table"),
                "tunnel": info.get("tunnel"), "tunnel_id": info.get("tunnel_id"),
                "batches": len(batches),
                "latest_committed": latest.uuid if latest else None,
                "query_progress": bool(load_spark_metrics(store, ns)),
            })
        if as_json:
            common.print_json({"meta_uri": store.uri, "namespaces": rows})
            return
        table = common.compact_table(f"namespaces in {store.uri}",
                              "--json has the tunnel id and whole UUIDs" if rows else None)
        for col in ("namespace", "table", "tunnel", "batches", "latest committed"):
            # the namespace never wraps (it is what --namespace takes); the rest may fold
            table.add_column(col, overflow="fold", no_wrap=col == "namespace",
                             justify="right" if col == "batches" else "left")
        for r in rows:
            latest = r["latest_committed"]
            table.add_row(r["namespace"], r["table"] or "-", r["tunnel"] or "-",
                          str(r["batches"]), latest[:8] + "…" if latest else "-")
        common.stdout_console().print(
            table if rows else "no namespaces (no query has run against this store)")


def reset(
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Delete (default: dry run).")] = False,
    as_json: common.JsonOpt = False,
) -> None:
    """Forget a namespace's batches and its tunnel binding (after its tunnel was deleted or
    re-created): the next query, in a new checkpoint location, binds to the tunnel as it is.
    Dry run unless --yes. A checkpoint location that used the namespace cannot resume after."""
    with common.inspected_store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        info = store.get_namespace_info(ns) or {}
        batches = len(store.list_batches(ns))
        deleted = store.reset_namespace(ns) if yes else 0
        if as_json:
            common.print_json({"namespace": ns, "dry_run": not yes,
                               "tunnel_id": info.get("tunnel_id"), "batches": batches,
                               "deleted": deleted})
            return
        console = common.stdout_console()
        if yes:
            console.print(f"{ns}: {deleted} batch(es) deleted, tunnel binding "
                          f"{info.get('tunnel_id')!r} cleared")
        else:
            console.print(f"{ns}: would delete {batches} batch(es) and clear the tunnel binding "
                          f"{info.get('tunnel_id')!r} (dry run; --yes deletes)")


def export(
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None, as_json: common.JsonOpt = False,
    output: Annotated[Path | None, typer.Option("--output", "-o",
                                                help="Write to FILE instead of stdout.")] = None,
) -> None:
    """The whole namespace as JSON: info, batches with manifests and end checkpoints."""
    if output is not None and not output.parent.is_dir():
        fail(f"cannot write {output}: directory {output.parent} does not exist")
    with common.inspected_store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        batches_out = []
        ends_total = 0
        for b in store.list_batches(ns):
            ends = store.get_end_checkpoints(ns, b.uuid)
            ends_total += len(ends)
            batches_out.append({**b.model_dump(mode="json"),
                                "end_checkpoints": [e.model_dump(mode="json")
                                                    for _, e in sorted(ends.items())]})
        document = {
            "format": "tablestore-cdc-meta-export", "version": FEED_SCHEMA_VERSION,
            "exported_at": time.time(), "meta_uri": store.uri, "namespace": ns,
            "namespace_info": store.get_namespace_info(ns),
            "batches": batches_out,
            "query_progress": sorted(load_spark_metrics(store, ns).values(),
                                     key=lambda e: e.get("batch_id") or -1),
            # rows that did not decode (skipped above; their raw bytes stay in the store)
            "corrupt": store.corrupt_records(),
        }
        if document["corrupt"]:
            typer.echo(f"{len(document['corrupt'])} corrupt record(s) skipped in the export: "
                       + ", ".join(c["key"] for c in document["corrupt"]), err=True)
        if output is None:
            common.print_json(document)
            return
        output.write_text(json.dumps(document, indent=2) + "\n")
        summary = {"path": str(output), "namespace": ns, "batches": len(batches_out),
                   "end_checkpoints": ends_total}
        if as_json:
            common.print_json(summary)
        else:
            common.stdout_console().print(f"exported {len(batches_out)} batch(es) and "
                                          f"{ends_total} end checkpoint(s) of {ns} to {output}")
