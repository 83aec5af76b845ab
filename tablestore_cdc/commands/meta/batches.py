"""The batch chain (``meta batches``, ``meta show``, ``meta diff``) and its retention (``gc``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer

from meta_store import BatchRecord, BatchState, MetaStore
from tablestore_cdc.commands.errors import reported_errors
from tablestore_cdc.commands.meta import common
from tablestore_cdc.feed.reading import (
    InspectedStore,
    InspectionError,
    find_batch,
    resolve_namespace,
)
from tablestore_cdc.feed.shapes import batch_record, positions_after
from tablestore_cdc.query_record import load_spark_metrics

#: channels ``meta show`` lists in its table (a manifest may hold tens of thousands: the table
#: of them all took minutes to lay out); ``--json`` gives every one
MAX_SHOWN_CHANNELS = 200
#: names ``meta show`` and ``meta batches`` list in one cell (children added, parents)
MAX_SHOWN_NAMES = 10


def _names(names: list[str]) -> str:
    """Names joined for one cell, the first ``MAX_SHOWN_NAMES`` of them."""
    if len(names) <= MAX_SHOWN_NAMES:
        return ", ".join(names) or "-"
    return ", ".join(names[:MAX_SHOWN_NAMES]) + f", … ({len(names) - MAX_SHOWN_NAMES} more)"


def _corrupt_batches(store: InspectedStore, namespace: str) -> list[str]:
    """Keys of corrupt batch rows of ``namespace`` noted so far, relative to the namespace
    (``batch/<uuid>`` on SQLite, ``B#<uuid>`` on DynamoDB)."""
    prefix = namespace + "/"
    return [k.removeprefix(prefix) for k in sorted(store.corrupt)
            if k.startswith(prefix) and ("/end/" not in k and "/E#" not in k)
            and not k.endswith("/info")]


def _local(epoch: float) -> dt.datetime | None:
    """``epoch`` as a local time; None for one no calendar date holds (a stored row may hold
    any finite number: year -1897267726 broke every command that showed it)."""
    try:
        return dt.datetime.fromtimestamp(epoch)
    except (ValueError, OverflowError, OSError):
        return None


def _time(epoch: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    if epoch is None:
        return "-"
    local = _local(epoch)
    return local.strftime(fmt) if local is not None else f"{epoch:g} (not a date)"


def _clock(epochs: list[float | None]) -> tuple[str, str]:
    """A compact time format for a table's times: the clock alone when they all fall on one
    day (returned as the caption), else month-day and clock."""
    days = {local.date() for local in (_local(e) for e in epochs if e is not None)
            if local is not None}
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
                   metrics: dict[str, dict], index: int) -> dict[str, Any]:
    ends = store.get_end_checkpoints(namespace, batch.uuid)
    entry = metrics.get(batch.uuid) or {}
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


def batches(
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None, as_json: common.JsonOpt = False,
    limit: Annotated[int | None, typer.Option(min=0, help="Only the newest N batches.")] = None,
) -> None:
    """Batches in chain order (oldest first; unused UUIDs last) with state, times, records.
    A corrupt row is listed as corrupt (and named on stderr); the others are shown."""
    with common.inspected_store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        all_batches = store.list_batches(ns)
        metrics = load_spark_metrics(store, ns)
        every = [_batch_summary(store, ns, b, metrics, i) for i, b in enumerate(all_batches)]
        rows = every if limit is None else every[-limit:] if limit > 0 else []
        corrupt = _corrupt_batches(store, ns)
        if as_json:
            common.print_json({"namespace": ns, "batches": rows, "total_batches": len(every),
                                "total_records": sum(r["records"] for r in every),
                                "corrupt": store.corrupt_records()})
            return
        fmt, caption = _clock([r[k] for r in rows for k in ("planned_at", "committed_at")])
        table = common.compact_table(f"batches of {ns}",
                                     caption + "; --json has every field (pushed at, ...)")
        for col in ("#", "uuid", "spark", "state", "planned", "committed", "chan", "records",
                    "children added"):
            table.add_column(col, justify="right" if col in ("#", "spark", "chan", "records")
                             else "left", no_wrap=col != "children added")
        for r in rows:
            spark = "-" if r["spark_batch_id"] is None else str(r["spark_batch_id"])
            table.add_row(
                str(r["index"]), r["uuid"], "initial" if r["initial"] else spark,
                r["state"] + (" (unused)" if r["unused"] else ""),
                _time(r["planned_at"], fmt), _time(r["committed_at"], fmt),
                str(r["channels"]), str(r["records"]), _names(r["children_added"]),
            )
        for key in corrupt:
            table.add_row("?", key, "-", "[red]CORRUPT[/red]", "-", "-", "-", "-",
                          "see stderr")
        console = common.stdout_console()
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


def show(
    uuid: Annotated[str, typer.Argument(help="Batch UUID (or a unique prefix of 4+ chars).")],
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None, as_json: common.JsonOpt = False,
) -> None:
    """One batch: per channel its start (manifest), end checkpoint, records, writing attempt."""
    with common.inspected_store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        batch = find_batch(store, ns, uuid)
        record = batch_record(ns, batch, store.get_end_checkpoints(ns, batch.uuid),
                              query=load_spark_metrics(store, ns).get(batch.uuid))
        if as_json:
            common.print_json(record)
            return
        console = common.stdout_console()
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
                      f"children added {_names(record['children_added'])}  "
                      f"records {record['records']}")
        if batch.manifest is None:
            console.print("no manifest: this UUID was minted but never planned")
        shown = record["channels"][:MAX_SHOWN_CHANNELS]
        fmt, caption = _clock([c["written_at"] for c in shown])
        table = common.compact_table("channels", caption + "; --json shows whole tokens")
        for col in ("channel", "parents", "start token (tail)", "start", "end token (tail)",
                    "end", "records", "attempt", "written"):
            table.add_column(col, justify="right" if col in ("start", "end", "records")
                             else "left", no_wrap=col not in ("parents", "attempt"))
        for c in shown:
            start, end = c["start"], c["end"]
            table.add_row(
                _short(c["channel_id"], 64), _names(c["parent_ids"]),
                _short(start["token"], 14) if start else "-",
                str(start["sequence_number"]) if start else "-",
                _short(end["token"], 14) if end else "(not recorded)",
                str(end["sequence_number"]) if end else "-",
                "-" if c["records"] is None else str(c["records"]),
                _short(c["attempt"], 64) if c["attempt"] else "-", _time(c["written_at"], fmt),
            )
        console.print(table)
        if len(record["channels"]) > len(shown):
            console.print(f"the first {len(shown)} of {len(record['channels'])} channels shown; "
                          "--json lists them all")


def _refuse_unplanned(batch: BatchRecord) -> None:
    """A batch ``latestOffset`` minted that Spark never ran has no positions: comparing it
    would show every channel as dropped."""
    if batch.manifest is None:
        raise InspectionError(detail=(
            f"batch {batch.uuid} is no batch: latestOffset minted it but Spark never planned "
            "it (state minted), so it has no channel positions to compare; give planned "
            "batches (`tablestore-cdc meta batches` lists them)"))


def diff(
    uuid1: Annotated[str, typer.Argument(help="The older batch (UUID or prefix).")],
    uuid2: Annotated[str, typer.Argument(help="The newer batch (UUID or prefix).")],
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None, as_json: common.JsonOpt = False,
) -> None:
    """Per-channel progress from the end of UUID1 to the end of UUID2."""
    with common.inspected_store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        a, b = find_batch(store, ns, uuid1), find_batch(store, ns, uuid2)
        for batch in (a, b):
            _refuse_unplanned(batch)
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
            common.print_json(result)
            return
        console = common.stdout_console()
        console.print(f"from {a.uuid} to {b.uuid}: " + (
            f"{result['batches_between']} batch(es), {result['records']} record(s)"
            if between is not None else "UUID2 is not after UUID1 on the batch chain"))
        table = common.compact_table()
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


def gc(
    keep: Annotated[int, typer.Option("--keep", min=1, help="Committed batches to keep.")],
    meta: common.MetaOpt, namespace: common.NamespaceOpt = None,
    minted_older_than: Annotated[float, typer.Option(
        help="Delete unused (minted, never planned) UUIDs older than this many seconds.")
    ] = 3600.0,
    yes: Annotated[bool, typer.Option("--yes", help="Delete (default: dry run).")] = False,
    as_json: common.JsonOpt = False,
) -> None:
    """Retention: list what would be deleted (dry run), or delete it with --yes."""
    with common.inspected_store(meta) as store, reported_errors():
        ns = resolve_namespace(store, namespace)
        victims = store.retention_victims(ns, keep, minted_older_than)
        deleted = store.gc(ns, keep, minted_older_than) if yes else []
        rows: list[dict[str, Any]] = [
            {"uuid": b.uuid, "state": b.state.value, "created_at": b.created_at,
             "committed_at": b.committed_at} for b in victims]
        if as_json:
            common.print_json({"namespace": ns, "dry_run": not yes, "keep": keep,
                                "minted_older_than_s": minted_older_than, "victims": rows,
                                "deleted": deleted})
            return
        console = common.stdout_console()
        fmt, caption = _clock([r[k] for r in rows for k in ("created_at", "committed_at")])
        table = common.compact_table("deleted" if yes else "would delete (dry run; --yes deletes)",
                              caption if rows else None)
        for col in ("uuid", "state", "created", "committed"):
            table.add_column(col, no_wrap=True)
        for r in rows:
            table.add_row(r["uuid"], r["state"], _time(r["created_at"], fmt),
                          _time(r["committed_at"], fmt))
        console.print(table)
        console.print(f"{len(deleted)} batch(es) deleted" if yes
                      else f"{len(rows)} batch(es) would be deleted")
