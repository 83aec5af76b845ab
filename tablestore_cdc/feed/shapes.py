"""The feed's JSON shapes: a channel's position, a batch record, the channel tree.

One versioned shape (``FEED_SCHEMA_VERSION``; the JSON Schema is
``docs/progress-feed.schema.json``, the contract ``docs/progress-feed.md``), built from plain
data (batch records and end checkpoints of the meta store, the listener's entries): no I/O here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from cdc_common.tokens import FINISHED
from connector.planning.positions import positions_after_batch
from meta_store import BatchRecord, BatchState, EndCheckpoint

#: Version of the feed's JSON shape; bumped only for a change that breaks a consumer (a field
#: removed, renamed or changing meaning). Adding a field keeps the version (docs/progress-feed.md).
FEED_SCHEMA_VERSION = 1


# --- positions ------------------------------------------------------------------------------------


def position(token: str, sequence_number: int, last_sequence: str | None) -> dict[str, Any]:
    return {"token": token, "sequence_number": sequence_number, "last_sequence": last_sequence,
            "finished": token == FINISHED}


def positions_after(batch: BatchRecord, ends: Mapping[str, EndCheckpoint]) -> dict[str, dict]:
    """Every channel's position at the end of ``batch`` as the feed shows it: the planner's
    rule (``connector.planning.positions``: its end checkpoint, or its manifest start for a
    channel that recorded none yet), and also any end outside the manifest."""
    out = {channel_id: position(p.token, p.sequence_number, p.last_sequence)
           for channel_id, p in positions_after_batch(batch, ends).items()}
    for channel_id, end in ends.items():  # an end outside the manifest (never expected)
        out.setdefault(channel_id, position(end.token, end.sequence_number, end.last_sequence))
    return out


def consumed(pos: Mapping[str, Any] | None) -> int | None:
    """Records consumed from a channel at ``pos``: its sequence number, less the one the
    FINISHED checkpoint adds."""
    if pos is None:
        return None
    return int(pos["sequence_number"]) - (1 if pos["finished"] else 0)


# --- batch records (one feed line each) -----------------------------------------------------------


def push_state(batch: BatchRecord) -> str:
    """``not-committed`` | ``pending`` (committed, not yet pushed) | ``pushed``."""
    if batch.state is BatchState.PUSHED:
        return "pushed"
    if batch.state is BatchState.COMMITTED:
        return "pending"
    return "not-committed"


def query_entry(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The feed's ``query`` object from a stored listener entry (only the documented fields)."""
    if not entry:
        return None
    keys = ("batch_id", "query_id", "run_id", "name", "timestamp", "recorded_at",
            "num_input_rows", "input_rows_per_second", "processed_rows_per_second",
            "batch_duration_ms")
    return {k: entry.get(k) for k in keys}


def batch_record(
    namespace: str,
    batch: BatchRecord,
    ends: Mapping[str, EndCheckpoint],
    *,
    query: Mapping[str, Any] | None = None,
    lag: Mapping[str, Mapping[str, Any]] | None = None,
    waiting: Sequence[Mapping[str, Any]] | None = None,
    observed_at: float | None = None,
) -> dict[str, Any]:
    """One feed record: a batch with its per-channel starts, ends, records and lag.

    ``lag`` (channel -> {records_behind, seconds_behind}) and ``waiting`` (channels waiting for
    a parent) are what the tunnel says *now*; callers attach them to the newest batch only.
    """
    manifest = batch.manifest
    channels: list[dict[str, Any]] = []
    starts = {c.channel_id: c for c in manifest.channels} if manifest else {}
    for channel_id in sorted(set(starts) | set(ends)):
        start, end = starts.get(channel_id), ends.get(channel_id)
        channels.append({
            "channel_id": channel_id,
            "parent_ids": list(start.parent_ids) if start else [],
            "in_manifest": start is not None,
            "start": position(start.token, start.sequence_number, start.last_sequence)
            if start else None,
            "max_records": start.max_records if start else None,
            "end": position(end.token, end.sequence_number, end.last_sequence) if end else None,
            "read_from": end.start_token if end else None,
            "records": end.records if end else None,
            "attempt": end.attempt if end else None,
            "written_at": end.written_at if end else None,
            "lag": dict(lag[channel_id]) if lag and channel_id in lag else None,
        })
    written = [e.written_at for e in ends.values()]
    entry = query_entry(query)
    spark_batch_id = batch.spark_batch_id
    if spark_batch_id is None and entry is not None:
        spark_batch_id = entry.get("batch_id")
    return {
        "schema_version": FEED_SCHEMA_VERSION,
        "kind": "batch",
        "namespace": namespace,
        "uuid": batch.uuid,
        "prev_uuid": batch.prev_uuid,
        "spark_batch_id": spark_batch_id,
        "state": batch.state.value,
        "push_state": push_state(batch),
        "initial": batch.prev_uuid is None,
        "times": {
            "created": batch.created_at,
            "planned": manifest.planned_at if manifest else None,
            "first_end_written": min(written) if written else None,
            "last_end_written": max(written) if written else None,
            "committed": batch.committed_at,
            "pushed": batch.pushed_at,
        },
        "max_rows": batch.max_rows,
        "channel_count": len(manifest.channels) if manifest else 0,
        "channels_to_read": sum(1 for c in manifest.channels
                                if c.token != FINISHED and c.max_records > 0) if manifest else 0,
        "ends_recorded": len(ends),
        "records": sum(e.records for e in ends.values()),
        "children_added": list(manifest.children_added) if manifest else [],
        "waiting_for_parent": [dict(w) for w in waiting] if waiting is not None else None,
        "channels": channels,
        "query": entry,
        "observed_at": time.time() if observed_at is None else observed_at,
    }


def channel_tree(channels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Nest channels under their parents: roots are channels without a known parent. A merge
    child (two parents) is nested under its first parent and listed with ``also_under``."""
    by_id = {c["channel_id"]: c for c in channels}

    def node(c: Mapping[str, Any], seen: frozenset[str]) -> dict[str, Any]:
        kids = [by_id[k] for k in c.get("children", []) if k in by_id and k not in seen]
        return {
            "channel_id": c["channel_id"], "status": c.get("status"),
            "waiting_for": list(c.get("waiting_for") or []),
            "also_under": [p for p in c.get("parent_ids", []) if p in by_id][1:],
            "children": [node(k, seen | {k["channel_id"]}) for k in kids
                         if [p for p in k.get("parent_ids", []) if p in by_id][:1]
                         == [c["channel_id"]]],
        }

    roots = [c for c in channels if not any(p in by_id for p in c.get("parent_ids", []))]
    return [node(c, frozenset({c["channel_id"]})) for c in roots]
