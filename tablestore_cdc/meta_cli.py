"""``tablestore-cdc meta ...``: inspect a meta table (any backend, by URI).

Mounted by ``tablestore_cdc/cli.py`` as ``tablestore-cdc meta``; ``progress_command`` is mounted
there as ``tablestore-cdc progress``. Runs in an operator's shell. Every command reads only, except
``gc --yes``. Each prints rich tables for people, or JSON for scripts with ``--json``.

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

import datetime as dt
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from meta_store import BatchRecord, BatchState, MetaStore
from tablestore_cdc.cli_errors import fail, reported_errors
from tablestore_cdc.feed.polling import follow_feed
from tablestore_cdc.feed.reading import (
    InspectedStore,
    find_batch,
    open_existing_meta_store,
    resolve_namespace,
    user_namespaces,
)
from tablestore_cdc.feed.shapes import (
    FEED_SCHEMA_VERSION,
    batch_record,
    channel_tree,
    positions_after,
)
from tablestore_cdc.feed.tunnel_view import channel_view, committed_positions, tunnel_endpoint
from tablestore_cdc.query_record import load_query_progress

app = typer.Typer(
    help="Inspect the meta table: batches, checkpoints, channels, lag, retention, export.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

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
def _store(meta: str) -> Iterator[Any]:
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


def _corrupt_batches(store: InspectedStore, namespace: str) -> list[str]:
    """Keys of corrupt batch rows of ``namespace`` noted so far, relative to the namespace
    (``batch/<uuid>`` on SQLite, ``B#<uuid>`` on DynamoDB)."""
    prefix = namespace + "/"
    return [k.removeprefix(prefix) for k in sorted(store.corrupt)
            if k.startswith(prefix) and ("/end/" not in k and "/E#" not in k)
            and not k.endswith("/info")]


def _console() -> Console:
    """stdout console. Sentences are never broken over lines (a terminal wraps them itself),
    so a UUID or a path in one copies whole; not a terminal, tables are 200 columns wide so
    UUIDs are never cut in pipes and logs."""
    terminal = sys.stdout.isatty() or os.environ.get("COLUMNS")
    return Console(width=None if terminal else 200, soft_wrap=True)


def _table(title: str | None = None, caption: str | None = None) -> Table:
    """A compact table (no outer frame, single padding) so wide rows fit a terminal."""
    return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False,
                 pad_edge=False, padding=(0, 1), collapse_padding=True)


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=False, default=str))


def _time(epoch: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch).strftime(fmt)


def _clock(epochs: list[float | None]) -> tuple[str, str]:
    """A compact time format for a table's times: the clock alone when they all fall on one
    day (returned as the caption), else month-day and clock."""
    days = {dt.datetime.fromtimestamp(e).date() for e in epochs if e is not None}
    if len(days) == 1:
        return "%H:%M:%S", f"times are local, on {days.pop().isoformat()}"
    return "%m-%d %H:%M:%S", "times are local"


def _short(token: str | None, width: int = 24) -> str:
    """A token cut to ``width``, keeping its end: tokens of one channel share a long head
    (an encoded table and channel name) and differ at the tail."""
    if token is None:
        return "-"
    return token if len(token) <= width else "…" + token[-(width - 1):]


def _batch_summary(store: MetaStore | InspectedStore, namespace: str, batch: BatchRecord,
                   progress: dict[str, dict], index: int) -> dict[str, Any]:
    ends = store.get_end_checkpoints(namespace, batch.uuid)
    entry = progress.get(batch.uuid) or {}
    return {
        "index": index,
        "uuid": batch.uuid,
        "prev_uuid": batch.prev_uuid,
        "state": batch.state.value,
        "initial": batch.prev_uuid is None,
        "unused": batch.state is BatchState.MINTED and batch.manifest is None,
        "spark_batch_id": batch.spark_batch_id if batch.spark_batch_id is not None
        else entry.get("batch_id"),
        "created_at": batch.created_at,
        "planned_at": batch.manifest.planned_at if batch.manifest else None,
        "committed_at": batch.committed_at,
        "pushed_at": batch.pushed_at,
        "channels": len(batch.manifest.channels) if batch.manifest else 0,
        "ends_recorded": len(ends),
        "records": sum(e.records for e in ends.values()),
        "children_added": list(batch.manifest.children_added) if batch.manifest else [],
    }


# --- commands ----------------------------------------------------------------------------


@app.command("uri")
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
    from connector.options import default_meta_store, tablestore_meta_store

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


@app.command()
def namespaces(meta: MetaOpt, as_json: JsonOpt = False) -> None:
    """List the sources (namespaces) the meta store holds."""
    with _store(meta) as store:
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
                "query_progress": bool(load_query_progress(store, ns)),
            })
        if as_json:
            _print_json({"meta_uri": store.uri, "namespaces": rows})
            return
        table = _table(f"namespaces in {store.uri}",
                       "--json has the tunnel id and whole UUIDs" if rows else None)
        for col in ("namespace", "table", "tunnel", "batches", "latest committed"):
            # the namespace never wraps (it is what --namespace takes); the rest may fold
            table.add_column(col, overflow="fold", no_wrap=col == "namespace",
                             justify="right" if col == "batches" else "left")
        for r in rows:
            latest = r["latest_committed"]
            table.add_row(r["namespace"], r["table"] or "-", r["tunnel"] or "-",
                          str(r["batches"]), latest[:8] + "…" if latest else "-")
        _console().print(table if rows else "no namespaces (no query has run against this store)")


@app.command()
def batches(
    meta: MetaOpt, namespace: NamespaceOpt = None, as_json: JsonOpt = False,
    limit: Annotated[int | None, typer.Option(min=0, help="Only the newest N batches.")] = None,
) -> None:
    """Batches in chain order (oldest first; unused UUIDs last) with state, times, records.
    A corrupt row is listed as corrupt (and named on stderr); the others are shown."""
    with _store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        all_batches = store.list_batches(ns)
        progress = load_query_progress(store, ns)
        every = [_batch_summary(store, ns, b, progress, i) for i, b in enumerate(all_batches)]
        rows = every if limit is None else every[-limit:] if limit > 0 else []
        corrupt = _corrupt_batches(store, ns)
        if as_json:
            _print_json({"namespace": ns, "batches": rows, "total_batches": len(every),
                         "total_records": sum(r["records"] for r in every),
                         "corrupt": store.corrupt_records()})
            return
        fmt, caption = _clock([r[k] for r in rows for k in ("planned_at", "committed_at")])
        table = _table(f"batches of {ns}", caption + "; --json has every field (pushed at, ...)")
        table.add_column("#", justify="right", no_wrap=True)
        table.add_column("uuid", no_wrap=True)
        table.add_column("spark", justify="right", no_wrap=True)
        table.add_column("state", no_wrap=True)
        table.add_column("planned", no_wrap=True)
        table.add_column("committed", no_wrap=True)
        table.add_column("chan", justify="right", no_wrap=True)
        table.add_column("records", justify="right", no_wrap=True)
        table.add_column("children added")
        for r in rows:
            spark = "-" if r["spark_batch_id"] is None else str(r["spark_batch_id"])
            table.add_row(
                str(r["index"]), r["uuid"], "initial" if r["initial"] else spark,
                r["state"] + (" (unused)" if r["unused"] else ""),
                _time(r["planned_at"], fmt), _time(r["committed_at"], fmt),
                str(r["channels"]), str(r["records"]), ", ".join(r["children_added"]) or "-",
            )
        for key in corrupt:
            table.add_row("?", key, "-", "[red]CORRUPT[/red]", "-", "-", "-", "-",
                          "see stderr")
        console = _console()
        console.print(table)
        shown = sum(r["records"] for r in rows)
        if len(rows) == len(every):
            console.print(f"{len(every)} batch(es), {shown} record(s)")
        else:
            console.print(f"{len(rows)} of {len(every)} batch(es) shown, {shown} record(s) in "
                          f"them (all {len(every)}: {sum(r['records'] for r in every)} "
                          "record(s))")
        if corrupt:
            console.print(f"{len(corrupt)} corrupt batch row(s) not counted")


@app.command()
def show(
    uuid: Annotated[str, typer.Argument(help="Batch UUID (or a unique prefix of 4+ chars).")],
    meta: MetaOpt, namespace: NamespaceOpt = None, as_json: JsonOpt = False,
) -> None:
    """One batch: per channel its start (manifest), end checkpoint, records, writing attempt."""
    with _store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        batch = find_batch(store, ns, uuid)
        record = batch_record(ns, batch, store.get_end_checkpoints(ns, batch.uuid),
                              query=load_query_progress(store, ns).get(batch.uuid))
        if as_json:
            _print_json(record)
            return
        console = _console()
        t = record["times"]
        console.print(f"[bold]batch {batch.uuid}[/bold]  state={batch.state.value}"
                      f"{' (initial offset)' if record['initial'] else ''}  "
                      "spark batch id=" + ("? (no ProgressListener reported it)"
                                           if record["spark_batch_id"] is None
                                           else str(record["spark_batch_id"])))
        fmt, when = _clock([t["created"], t["planned"], t["committed"], t["pushed"]])
        console.print(f"prev  {batch.prev_uuid or '- (initial offset)'}")
        console.print(f"times created {_time(t['created'], fmt)} · planned "
                      f"{_time(t['planned'], fmt)} · committed {_time(t['committed'], fmt)} · "
                      f"pushed {_time(t['pushed'], fmt)} ({when.rsplit(' ', 1)[-1]})")
        console.print(f"max rows {batch.max_rows if batch.max_rows is not None else 'all'}  "
                      f"children added {', '.join(record['children_added']) or '-'}  "
                      f"records {record['records']}")
        if batch.manifest is None:
            console.print("no manifest: this UUID was minted but never planned")
        fmt, caption = _clock([c["written_at"] for c in record["channels"]])
        table = _table("channels", caption + "; --json shows whole tokens")
        table.add_column("channel", no_wrap=True)
        table.add_column("parents")
        table.add_column("start token (tail)", no_wrap=True)
        table.add_column("start", justify="right", no_wrap=True)
        table.add_column("end token (tail)", no_wrap=True)
        table.add_column("end", justify="right", no_wrap=True)
        table.add_column("records", justify="right", no_wrap=True)
        table.add_column("attempt")
        table.add_column("written", no_wrap=True)
        for c in record["channels"]:
            start, end = c["start"], c["end"]
            table.add_row(
                c["channel_id"], ", ".join(c["parent_ids"]) or "-",
                _short(start["token"], 14) if start else "-",
                str(start["sequence_number"]) if start else "-",
                _short(end["token"], 14) if end else "(not recorded)",
                str(end["sequence_number"]) if end else "-",
                "-" if c["records"] is None else str(c["records"]),
                c["attempt"] or "-", _time(c["written_at"], fmt),
            )
        console.print(table)


@app.command()
def diff(
    uuid1: Annotated[str, typer.Argument(help="The older batch (UUID or prefix).")],
    uuid2: Annotated[str, typer.Argument(help="The newer batch (UUID or prefix).")],
    meta: MetaOpt, namespace: NamespaceOpt = None, as_json: JsonOpt = False,
) -> None:
    """Per-channel progress from the end of UUID1 to the end of UUID2."""
    with _store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        a, b = find_batch(store, ns, uuid1), find_batch(store, ns, uuid2)
        pos_a = positions_after(a, store.get_end_checkpoints(ns, a.uuid))
        pos_b = positions_after(b, store.get_end_checkpoints(ns, b.uuid))
        chain = [x.uuid for x in store.list_batches(ns)]
        between: list[str] | None = None
        if a.uuid in chain and b.uuid in chain:
            i, j = chain.index(a.uuid), chain.index(b.uuid)
            between = chain[i + 1: j + 1] if i <= j else None
        per_batch: dict[str, dict[str, int]] = {}
        for u in between or []:
            per_batch[u] = {ch: e.records for ch, e in store.get_end_checkpoints(ns, u).items()}
        channels: list[dict[str, Any]] = []
        # a channel may appear and finish strictly between A and B (a split child merged
        # again): it is in neither position set, only in the batches between
        in_between = {ch for r in per_batch.values() for ch in r}
        for ch in sorted(set(pos_a) | set(pos_b) | in_between):
            pa, pb = pos_a.get(ch), pos_b.get(ch)
            only = ("between" if pa is None and pb is None else "from" if pb is None
                    else "to" if pa is None else None)
            channels.append({
                "channel_id": ch, "only_in": only,
                "from": pa, "to": pb,
                "sequence_delta": pb["sequence_number"] - pa["sequence_number"]
                if pa and pb else None,
                "records": sum(r.get(ch, 0) for r in per_batch.values())
                if between is not None else None,
            })
        result: dict[str, Any] = {
            "namespace": ns, "from": a.uuid, "to": b.uuid,
            "batches_between": len(between) if between is not None else None,
            "records": sum(c["records"] or 0 for c in channels) if between is not None else None,
            "channels": channels,
        }
        if as_json:
            _print_json(result)
            return
        console = _console()
        console.print(f"from {a.uuid} to {b.uuid}: " + (
            f"{result['batches_between']} batch(es), {result['records']} record(s)"
            if between is not None else "UUID2 is not after UUID1 on the batch chain"))
        table = _table()
        for col in ("channel", "from seq", "to seq", "Δ seq", "records", "note"):
            table.add_column(col, justify="left" if col in ("channel", "note") else "right")
        for c in channels:
            note = {"from": "only in UUID1 (finished and dropped)",
                    "to": "only in UUID2 (new channel)",
                    "between": "appeared and finished in between"}.get(c["only_in"] or "", "")
            if c["to"] and c["to"]["finished"] and not (c["from"] and c["from"]["finished"]):
                note = (note + " finished").strip()
            table.add_row(
                c["channel_id"],
                str(c["from"]["sequence_number"]) if c["from"] else "-",
                str(c["to"]["sequence_number"]) if c["to"] else "-",
                "-" if c["sequence_delta"] is None else f"{c['sequence_delta']:+d}",
                "-" if c["records"] is None else str(c["records"]), note,
            )
        console.print(table)


@app.command()
def channels(
    meta: MetaOpt, namespace: NamespaceOpt = None, endpoint: EndpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The tunnel's channel tree: lineage, status, pushed checkpoint, waiting-for-parent."""
    with _store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        info = store.get_namespace_info(ns) or {}
        view = channel_view(store, ns, endpoint)
        tree = channel_tree(view.channels)
        if as_json:
            _print_json({"namespace": ns, "tunnel": info, "channels": view.channels,
                         "tree": tree})
            return
        by_id = {c["channel_id"]: c for c in view.channels}
        root = Tree(f"[bold]{info.get('table')}[/bold] / tunnel {info.get('tunnel')} "
                    f"({info.get('tunnel_id')})")

        def label(node: dict[str, Any]) -> str:
            c = by_id[node["channel_id"]]
            colour = {"OPEN": "green", "WAIT": "yellow", "TERMINATED": "dim"}.get(c["status"], "")
            text = f"[{colour}]{c['channel_id']} {c['status']}[/{colour}]" if colour else (
                f"{c['channel_id']} {c['status']}")
            pushed = c["pushed"]
            if pushed is not None:
                text += (" pushed=finished" if pushed["finished"]
                         else f" pushed seq={pushed['sequence_number']}")
            if c["consumed"] is not None:
                text += f" consumed={c['consumed']}"
            if c["lag"] and c["lag"]["records_behind"]:
                text += f" behind={c['lag']['records_behind']}"
            if c["waiting_for"]:
                text += f" [yellow]waiting for {', '.join(c['waiting_for'])}[/yellow]"
            if node["also_under"]:
                text += f" (also child of {', '.join(node['also_under'])})"
            return text

        def add(parent: Tree, node: dict[str, Any]) -> None:
            branch = parent.add(label(node))
            for child in node["children"]:
                add(branch, child)

        for node in tree:
            add(root, node)
        _console().print(root)


@app.command()
def lag(
    meta: MetaOpt, namespace: NamespaceOpt = None, endpoint: EndpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Per channel, records and seconds behind the head from the latest committed batch."""
    with _store(meta) as store, reported_errors():
        from connector.tunnel import open_tunnel_service

        ns = resolve_namespace(store, namespace)
        info = store.get_namespace_info(ns) or {}
        batch, positions = committed_positions(store, ns)
        with open_tunnel_service(tunnel_endpoint(info, endpoint)) as tunnel:
            tunnel_id = info.get("tunnel_id") or tunnel.describe_tunnel(
                info["table"], info["tunnel"]).tunnel.tunnel_id
            raw = tunnel.lag(tunnel_id, {ch: p["token"] for ch, p in positions.items()})
        rows: list[dict[str, Any]] | None = None
        if raw is not None:
            rows = [{"channel_id": ch, "records_behind": v.records_behind,
                     "seconds_behind": v.seconds_behind,
                     "position": "batch" if ch in positions else "tunnel"}
                    for ch, v in sorted(raw.items())]
        result: dict[str, Any] = {
            "namespace": ns, "batch": batch.uuid if batch else None,
            "spark_batch_id": None if batch is None else batch.spark_batch_id
            if batch.spark_batch_id is not None
            else load_query_progress(store, ns).get(batch.uuid, {}).get("batch_id"),
            "lag": rows,
            # the figures of Spark's progress report (connector.progress): a total only when
            # every channel's count is known; the oldest unread change of any channel
            "records_behind": _total(r["records_behind"] for r in rows or ()),
            "seconds_behind": _oldest(r["seconds_behind"] for r in rows or ()),
            "reason": None if raw is not None else "the tunnel backend cannot report lag",
        }
        if as_json:
            _print_json(result)
            return
        console = _console()
        if rows is None:
            console.print(f"lag unknown: {result['reason']}")
            return
        table = _table(f"lag from batch {result['batch']}")
        for col in ("channel", "records behind", "seconds behind", "position from"):
            table.add_column(col, justify="right" if "behind" in col else "left")
        for r in rows:
            table.add_row(r["channel_id"], str(r["records_behind"]),
                          "-" if r["seconds_behind"] is None else f"{r['seconds_behind']:.1f}",
                          "latest committed batch" if r["position"] == "batch"
                          else "tunnel checkpoint (not in the batch yet)")
        console.print(table)
        total = result["records_behind"]
        console.print(f"total records behind: {'unknown' if total is None else total}; oldest "
                      f"unread change: {_seconds(result['seconds_behind'])}")


def _total(counts: Iterable[int | None]) -> int | None:
    """The sum of per-channel counts, ``None`` when one of them is unknown."""
    values = list(counts)
    return None if None in values else sum(v for v in values if v is not None)


def _oldest(ages: Iterable[float | None]) -> float | None:
    """The largest per-channel age, ``None`` when one of them is unknown (0 for none)."""
    values = list(ages)
    return None if None in values else max((v for v in values if v is not None), default=0.0)


def _seconds(age: float | None) -> str:
    return "unknown" if age is None else f"{age:.1f} s"


@app.command()
def gc(
    keep: Annotated[int, typer.Option("--keep", min=1, help="Committed batches to keep.")],
    meta: MetaOpt, namespace: NamespaceOpt = None,
    minted_older_than: Annotated[float, typer.Option(
        help="Delete unused (minted, never planned) UUIDs older than this many seconds.")
    ] = 3600.0,
    yes: Annotated[bool, typer.Option("--yes", help="Delete (default: dry run).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Retention: list what would be deleted (dry run), or delete it with --yes."""
    with _store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        victims = store.retention_victims(ns, keep, minted_older_than)
        deleted = store.gc(ns, keep, minted_older_than) if yes else []
        rows: list[dict[str, Any]] = [
            {"uuid": b.uuid, "state": b.state.value, "created_at": b.created_at,
             "committed_at": b.committed_at} for b in victims]
        if as_json:
            _print_json({"namespace": ns, "dry_run": not yes, "keep": keep,
                         "minted_older_than_s": minted_older_than, "victims": rows,
                         "deleted": deleted})
            return
        console = _console()
        fmt, caption = _clock([r[k] for r in rows for k in ("created_at", "committed_at")])
        table = _table("deleted" if yes else "would delete (dry run; --yes deletes)",
                       caption if rows else None)
        for col in ("uuid", "state", "created", "committed"):
            table.add_column(col, no_wrap=True)
        for r in rows:
            table.add_row(r["uuid"], r["state"], _time(r["created_at"], fmt),
                          _time(r["committed_at"], fmt))
        console.print(table)
        console.print(f"{len(deleted)} batch(es) deleted" if yes
                      else f"{len(rows)} batch(es) would be deleted")


@app.command()
def reset(
    meta: MetaOpt, namespace: NamespaceOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Delete (default: dry run).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Forget a namespace's batches and its tunnel binding (after its tunnel was deleted or
    re-created): the next query, in a new checkpoint location, binds to the tunnel as it is.
    Dry run unless --yes. A checkpoint location that used the namespace cannot resume after."""
    with _store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        info = store.get_namespace_info(ns) or {}
        batches = len(store.list_batches(ns))
        deleted = store.reset_namespace(ns) if yes else 0
        if as_json:
            _print_json({"namespace": ns, "dry_run": not yes, "tunnel_id": info.get("tunnel_id"),
                         "batches": batches, "deleted": deleted})
            return
        console = _console()
        if yes:
            console.print(f"{ns}: {deleted} batch(es) deleted, tunnel binding "
                          f"{info.get('tunnel_id')!r} cleared")
        else:
            console.print(f"{ns}: would delete {batches} batch(es) and clear the tunnel binding "
                          f"{info.get('tunnel_id')!r} (dry run; --yes deletes)")


@app.command()
def export(
    meta: MetaOpt, namespace: NamespaceOpt = None, as_json: JsonOpt = False,
    output: Annotated[Path | None, typer.Option("--output", "-o",
                                                help="Write to FILE instead of stdout.")] = None,
) -> None:
    """The whole namespace as JSON: info, batches with manifests and end checkpoints."""
    if output is not None and not output.parent.is_dir():
        fail(f"cannot write {output}: directory {output.parent} does not exist")
    with _store(meta) as store, reported_errors():
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
            "query_progress": sorted(load_query_progress(store, ns).values(),
                                     key=lambda e: e.get("batch_id") or -1),
            # rows that did not decode (skipped above; their raw bytes stay in the store)
            "corrupt": store.corrupt_records(),
        }
        if document["corrupt"]:
            typer.echo(f"{len(document['corrupt'])} corrupt record(s) skipped in the export: "
                       + ", ".join(c["key"] for c in document["corrupt"]), err=True)
        if output is None:
            _print_json(document)
            return
        output.write_text(json.dumps(document, indent=2) + "\n")
        summary = {"path": str(output), "namespace": ns, "batches": len(batches_out),
                   "end_checkpoints": ends_total}
        if as_json:
            _print_json(summary)
        else:
            _console().print(f"exported {len(batches_out)} batch(es) and {ends_total} end "
                             f"checkpoint(s) of {ns} to {output}")


# --- tablestore-cdc progress (mounted by tablestore_cdc/cli.py) ---------------------------------


def progress_command(
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
    with _store(meta) as store, reported_errors():
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
