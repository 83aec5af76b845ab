"""What the tunnel says now about a namespace's channels: status, lineage, pushed checkpoints, lag.

``channel_view`` opens the namespace's tunnel (its recorded endpoint, or ``--endpoint``) and
describes every channel; ``safe_channel_view`` reports a failure instead of raising (the
dashboard and ``--follow`` keep going when the tunnel cannot be reached). Runs where the CLI or
the dashboard runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connector.errors import CdcError, MalformedTokenError
from meta_store import BatchRecord, MetaStore
from tablestore_cdc.feed.reading import InspectedStore, InspectionError, corrupt_info_message
from tablestore_cdc.feed.retention import default_retention_s, headroom
from tablestore_cdc.feed.shapes import consumed, positions_after


@dataclass
class TunnelView:
    """What the tunnel says now: channels (lineage, status, pushed checkpoint) and lag.

    ``error`` is set instead when the tunnel could not be asked (its endpoint is unreachable or
    was stored without the secrets it needs); ``lag`` is ``None`` when the backend cannot tell.
    """

    channels: list[dict[str, Any]] = field(default_factory=list)
    lag: dict[str, dict[str, Any]] | None = None
    error: str | None = None

    def waiting(self) -> list[dict[str, Any]]:
        return [{"channel_id": c["channel_id"], "waiting_for": c["waiting_for"]}
                for c in self.channels if c["status"] == "WAIT"]


def tunnel_endpoint(info: Mapping[str, str] | None, override: str | None) -> str:
    """The tunnel endpoint to open: ``override`` (``--endpoint``) or the namespace's own."""
    if override:
        return override
    if not info or not info.get("endpoint"):
        raise InspectionError(detail="the namespace does not record its tunnel endpoint; "
                              "pass --endpoint")
    return info["endpoint"]


def committed_positions(store: MetaStore, namespace: str) -> tuple[BatchRecord | None, dict]:
    """The latest committed batch and every channel's position after it."""
    batch = store.latest_committed(namespace)
    if batch is None:
        return None, {}
    return batch, positions_after(batch, store.get_end_checkpoints(namespace, batch.uuid))


def lag_at(store: MetaStore, namespace: str, batch: BatchRecord | None, tunnel: Any,
           tunnel_id: str, positions: Mapping[str, Mapping[str, Any]]
           ) -> tuple[dict[str, Any] | None, set[str]]:
    """``tunnel.lag`` from the channels' ``positions`` after ``batch`` (CLI, dashboard), and
    the channels whose stored token the tunnel refused. A token the tunnel calls malformed
    (``MalformedTokenError`` naming a channel of ``positions``: another writer's row, a token
    nested past the backend's bound) is a corrupt row: noted in ``store.corrupt`` when it is an
    ``InspectedStore`` (the command names it on stderr), left out, and the lag asked again
    without it; the caller shows that channel's lag as unknown."""
    tokens = {ch: str(p["token"]) for ch, p in positions.items()}
    refused: set[str] = set()
    while True:
        try:
            return tunnel.lag(tunnel_id, tokens), refused
        except MalformedTokenError as exc:
            channel = exc.fields.get("channel_id")
            if channel not in tokens:
                raise
            del tokens[channel]
            refused.add(channel)
            if isinstance(store, InspectedStore) and batch is not None:
                ends = store.get_end_checkpoints(namespace, batch.uuid)
                key = (f"{namespace}/end/{batch.uuid}/{channel}" if channel in ends
                       else f"{namespace}/batch/{batch.uuid}/manifest")
                store.corrupt.setdefault(key, f"channel {channel!r}: the tunnel refuses its "
                                         f"token: {exc.fields.get('reason', exc)}")


def channel_view(store: MetaStore, namespace: str, endpoint: str | None = None) -> TunnelView:
    """Open the namespace's tunnel and describe every channel: status, parents, children,
    which unfinished parents a WAIT channel waits for, its pushed checkpoint, its position in
    the latest committed batch and its lag. Raises ``CdcError`` when the tunnel cannot be
    opened (callers that must not fail use ``safe_channel_view``)."""
    from connector.tunnel import ChannelStatus, open_tunnel_service

    info = store.get_namespace_info(namespace) or {}
    if not info.get("table") or not info.get("tunnel"):
        if isinstance(store, InspectedStore) and any(k.startswith(namespace + "/")
                                                    for k in store.corrupt):
            raise InspectionError(detail=corrupt_info_message(namespace)
                                  + "; the channels cannot be described")
        raise InspectionError(detail=f"namespace {namespace!r} does not record its table and "
                              "tunnel names; the query that wrote it is too old to inspect")
    batch, committed = committed_positions(store, namespace)
    with open_tunnel_service(tunnel_endpoint(info, endpoint)) as tunnel:
        description = tunnel.describe_tunnel(info["table"], info["tunnel"])
        tunnel_id = info.get("tunnel_id") or description.tunnel.tunnel_id
        status = {c.channel_id: c.status for c in description.channels}
        lag_raw, refused = lag_at(store, namespace, batch, tunnel, tunnel_id, committed)
        channels: list[dict[str, Any]] = []
        for c in sorted(description.channels, key=lambda c: c.channel_id):
            try:
                cp = tunnel.get_checkpoint(tunnel_id, c.channel_id)
                pushed: dict[str, Any] | None = {"token": cp.token,
                                                  "sequence_number": cp.sequence_number,
                                                  "finished": cp.finished}
            except CdcError:
                pushed = None
            pos = committed.get(c.channel_id)
            channels.append({
                "channel_id": c.channel_id,
                "status": c.status.value,
                "channel_type": c.channel_type.value,
                "parent_ids": list(c.parent_ids),
                "children": sorted(o.channel_id for o in description.channels
                                   if c.channel_id in o.parent_ids),
                "waiting_for": [p for p in c.parent_ids
                                if status.get(p) is not ChannelStatus.TERMINATED]
                if c.status is ChannelStatus.WAIT else [],
                "pushed": pushed,
                "position": pos,
                "consumed": consumed(pos),
            })
    lag = None
    if lag_raw is not None:
        retention_s = default_retention_s(tunnel_endpoint(info, endpoint))
        lag = {ch: {"records_behind": v.records_behind, "seconds_behind": v.seconds_behind,
                    "exact": v.exact,
                    **headroom(v.seconds_behind, retention_s)}
               for ch, v in lag_raw.items() if ch not in refused}
    for entry in channels:
        entry["lag"] = lag.get(entry["channel_id"]) if lag is not None else None
    return TunnelView(channels=channels, lag=lag)


def safe_channel_view(store: MetaStore, namespace: str, endpoint: str | None = None
                      ) -> TunnelView:
    """``channel_view`` that reports a failure in ``error`` instead of raising."""
    try:
        return channel_view(store, namespace, endpoint)
    except (CdcError, OSError, KeyError) as exc:
        return TunnelView(error=f"{type(exc).__name__}: {exc}")
