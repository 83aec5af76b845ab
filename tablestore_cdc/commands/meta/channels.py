"""The tunnel's side: ``meta channels`` (the channel tree) and ``meta lag``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import typer
from rich.tree import Tree

from connector.option_values import parse_duration_ms
from tablestore_cdc.commands.errors import fail, reported_errors
from tablestore_cdc.commands.meta import common
from tablestore_cdc.feed.reading import resolve_namespace
from tablestore_cdc.feed.retention import default_retention_s, headroom
from tablestore_cdc.feed.shapes import channel_tree
from tablestore_cdc.feed.tunnel_view import (
    channel_view,
    committed_positions,
    lag_at,
    tunnel_endpoint,
)
from tablestore_cdc.query_record import load_spark_metrics


def channels(
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None,
    endpoint: common.EndpointOpt = None, as_json: common.JsonOpt = False,
) -> None:
    """The tunnel's channel tree: lineage, status, pushed checkpoint, waiting-for-parent."""
    with common.inspected_store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        info = store.get_namespace_info(ns) or {}
        view = channel_view(store, ns, endpoint)
        tree = channel_tree(view.channels)
        if as_json:
            common.print_json({"namespace": ns, "tunnel": info, "channels": view.channels,
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
        common.stdout_console().print(root)


def lag(
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None,
    endpoint: common.EndpointOpt = None, as_json: common.JsonOpt = False,
    retention: Annotated[str | None, typer.Option(
        help="What the service keeps of a channel's history (15m, 24h, 7d; default: 7d, "
        "DynamoDB Streams 24h): the headroom is it minus the oldest unread change's age.")]
    = None,
) -> None:
    """Per channel, records and seconds behind the head from the latest committed batch, and
    the retention headroom (a warning once the oldest unread change passes 80 % of it)."""
    with common.inspected_store(meta) as store, reported_errors():
        from connector.tunnel import open_tunnel_service

        ns = resolve_namespace(store, namespace)
        info = store.get_namespace_info(ns) or {}
        retention_s = (default_retention_s(tunnel_endpoint(info, endpoint))
                       if retention is None else _duration_s(retention))
        batch, positions = committed_positions(store, ns)
        with open_tunnel_service(tunnel_endpoint(info, endpoint)) as tunnel:
            tunnel_id = info.get("tunnel_id") or tunnel.describe_tunnel(
                info["table"], info["tunnel"]).tunnel.tunnel_id
            raw, refused = lag_at(store, ns, batch, tunnel, tunnel_id, positions)
        rows: list[dict[str, Any]] | None = None
        if raw is not None:
            # a channel whose stored token the tunnel refused (a corrupt row): lag unknown
            rows = [{"channel_id": ch, "records_behind": v.records_behind,
                     "seconds_behind": v.seconds_behind, "exact": v.exact,
                     "position": "batch" if ch in positions else "tunnel",
                     **headroom(v.seconds_behind, retention_s)} if ch not in refused else
                    {"channel_id": ch, "records_behind": None, "seconds_behind": None,
                     "exact": False, "position": "corrupt", **headroom(None, retention_s)}
                    for ch, v in sorted(raw.items())]
        result: dict[str, Any] = {
            "namespace": ns, "batch": batch.uuid if batch else None,
            "spark_batch_id": None if batch is None else batch.spark_batch_id
            if batch.spark_batch_id is not None
            else load_spark_metrics(store, ns).get(batch.uuid, {}).get("batch_id"),
            "lag": rows,
            # the figures of Spark's progress report (connector.latest_offset_report): the
            # total over the channels; the oldest unread change of any channel; lower bounds
            # when one channel's are
            "records_behind": _total(r["records_behind"] for r in rows or ()),
            "seconds_behind": _oldest(r["seconds_behind"] for r in rows or ()),
            "exact": rows is not None and all(r["exact"] for r in rows),
            "reason": None if raw is not None else "the tunnel backend cannot report lag",
        }
        if as_json:
            common.print_json(result)
            return
        console = common.stdout_console()
        if rows is None:
            console.print(f"lag unknown: {result['reason']}")
            return
        table = common.compact_table(f"lag from batch {result['batch']}")
        for col in ("channel", "records behind", "seconds behind", "headroom", "position from"):
            table.add_column(col, justify="right" if "behind" in col else "left")
        for r in rows:
            table.add_row(r["channel_id"], _at_least(r["records_behind"], r["exact"]),
                          "-" if r["seconds_behind"] is None else f"{r['seconds_behind']:.1f}",
                          _headroom(r),
                          {"batch": "latest committed batch",
                           "corrupt": "corrupt row (see stderr)"}.get(
                              r["position"], "tunnel checkpoint (not in the batch yet)"))
        console.print(table)
        total = result["records_behind"]
        console.print(f"total records behind: {_at_least(total, result['exact'])}; oldest "
                      f"unread change: {_seconds(result['seconds_behind'])}")
        for r in rows:
            if r["retention_warning"]:
                console.print(f"warning: channel {r['channel_id']}: its oldest unread change "
                              f"is {r['seconds_behind']:.0f} s old, {r['headroom_s']:.0f} s "
                              f"before the service's retention ({retention_s:.0f} s) trims it")


def _at_least(count: int | None, exact: bool) -> str:
    """A count as shown: ``>= n`` when it is a lower bound."""
    return "unknown" if count is None else str(count) if exact else f">= {count}"


def _total(counts: Iterable[int | None]) -> int | None:
    """The sum of per-channel counts, ``None`` when one of them is unknown."""
    values = list(counts)
    return None if None in values else sum(v for v in values if v is not None)


def _oldest(ages: Iterable[float | None]) -> float | None:
    """The largest per-channel age, ``None`` when one of them is unknown (0 for none)."""
    values = list(ages)
    return None if None in values else max((v for v in values if v is not None), default=0.0)


def _headroom(row: dict[str, Any]) -> str:
    if row["headroom_s"] is None:
        return "-"
    text = f"{row['headroom_s'] / 3600:.1f} h"
    return f"[red]{text}[/red]" if row["retention_warning"] else text


def _duration_s(text: str) -> float:
    """``--retention`` in seconds (a one-line error naming the flag otherwise)."""
    try:
        millis = parse_duration_ms(text)
    except ValueError:
        fail(f"--retention {text!r}: not a duration (15m, 24h, 7d)")
    if millis <= 0:
        fail(f"--retention {text!r}: must be above 0")
    return millis / 1000


def _seconds(age: float | None) -> str:
    return "unknown" if age is None else f"{age:.1f} s"
