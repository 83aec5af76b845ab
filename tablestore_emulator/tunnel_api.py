"""The emulator's Tunnel API: ``POST /tunnel/*`` served from the embedded store's tunnels.

``server`` dispatches every ``/tunnel/...`` path to ``ROUTES`` (already authenticated). Each
handler parses the protobuf request (``connector.tunnel.tablestore.messages``), calls the
embedded store's ``LocalTunnelService`` -- the reference semantics: tunnels per table, Stream and
BaseAndStream, a child in ``WAIT`` until every parent's checkpoint for that tunnel is
``"finished"`` (base channels before stream channels), trimming -- and answers the way the
service does. Connected workers and channel ownership (Connect, Heartbeat, Shutdown) are the
client state machine of ``tablestore_emulator.tunnel_clients``.

What the wire sees, and where it is the emulator's own choice, is written down once, in
docs/tablestore.md ("The emulator's Tunnel API": channel names, tokens, sequence info,
CreateTunnel's start, the checkpoint rule, errors, DescribeTunnel's and GetRpo's figures) and
docs/emulator.md (tunnel workers, an expired tunnel). Besides, on the wire:

- a token's ``TokenContentV2.total_count`` is the number of records before the position, and
  ``"finished"`` is literal;
- an UPDATE's deleted columns are ``DELETE_ALL_VERSION`` cells; a DELETE is the key plus the
  delete marker; ``origin_record`` is the before-image (an empty key section, then the
  columns), absent when the row did not exist;
- ``ChannelInfo.parent_ids`` (field 1000) carries the lineage; the service has no such field.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from connector.errors import (
    ChannelNotReadableError,
    InvalidCheckpointError,
    MalformedTokenError,
    StaleCheckpointError,
    TransientTunnelError,
    TrimmedDataError,
    TunnelExistsError,
    UnknownChannelError,
    UnknownTableError,
    UnknownTunnelError,
)
from connector.tunnel.base import (
    FINISHED,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    Op,
    Record,
    StartPosition,
    TunnelType,
)
from connector.tunnel.local import LocalTunnelService
from connector.tunnel.local.tunnels import BASE_PREFIX, MAX_TOKEN_DEPTH, json_depth_exceeds
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.plainbuffer import Cell, CellOp, Row, SequenceInfo, encode_row
from tablestore_emulator.context import EmulatorContext
from tablestore_emulator.errors import OtsError, parameter_invalid
from tablestore_emulator.tunnel_clients import ChannelState, ClientGone, TunnelClients

TRIMMED_PREFIX = "OTSTrimmedDataAccess"
#: how the SDKs name a base-data channel (the Go SDK tells base from stream channels by it)
BASE_WIRE_PREFIX = "BaseData_"

_MAX_ROW_INDEX = 2**31 - 1
T = TypeVar("T")
_STATUS_NAMES = {number: name for name, number in m.CHANNEL_STATUS.items()}


# --- channel ids ------------------------------------------------------------------------------


def wire_channel_id(store_id: str) -> str:
    """The id the wire shows for a store channel (``base-X`` -> ``BaseData_X``)."""
    if store_id.startswith(BASE_PREFIX):
        return BASE_WIRE_PREFIX + store_id[len(BASE_PREFIX):]
    return store_id


def store_channel_id(wire_id: str) -> str:
    """The store's id for a channel the wire names; the store's own base form is not a wire
    id (400, as any unknown channel)."""
    if wire_id.startswith(BASE_WIRE_PREFIX):
        return BASE_PREFIX + wire_id[len(BASE_WIRE_PREFIX):]
    if wire_id.startswith(BASE_PREFIX):
        raise parameter_invalid(f"Channel does not exist: {wire_id}")
    return wire_id


# --- tokens -----------------------------------------------------------------------------------


#: Deepest JSON nesting a store token's text may have (the store's own tokens are one flat
#: object); a token nested deeper is refused before any JSON parser sees it (the local
#: store's own bound, checked by its ``json_depth_exceeds``).
MAX_TOKEN_JSON_DEPTH = MAX_TOKEN_DEPTH


def _token_json(local_token: str) -> bytes | None:
    """The JSON text inside a store token (base64), or None if it is not base64."""
    try:
        return base64.b64decode(local_token.encode("ascii"), validate=True)
    except (ValueError, UnicodeError, binascii.Error):
        return None


def _local_seq(local_token: str) -> int:
    """The sequence a store token stands for (the store's tokens: ``{"t", "c", "s"}``);
    400 for a text that is not one, however it is nested."""
    raw = _token_json(local_token)
    if raw is None or json_depth_exceeds(raw, MAX_TOKEN_JSON_DEPTH):
        raise parameter_invalid("Invalid token: not a tunnel token.")
    try:
        body = json.loads(raw)
        seq = body["s"]
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        raise parameter_invalid("Invalid token: not a tunnel token.") from None
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise parameter_invalid("Invalid token: not a tunnel token.")
    return seq


def wire_token(local_token: str, base: bool) -> str:
    """The store's token as a base64 ``Token`` envelope (``FINISHED`` unchanged)."""
    if local_token == FINISHED:
        return FINISHED
    content = m.TokenContentV2(total_count=_local_seq(local_token))
    if base:
        content.primary_key = local_token.encode("ascii")
        content.iterator = ""
    else:
        content.iterator = local_token
    envelope = m.Token(version=2, content=content.SerializeToString())
    return base64.b64encode(envelope.SerializeToString()).decode("ascii")


def local_token(token: str, channel_id: str) -> str:
    """The store's token inside a wire token; ``OtsError`` (400) if it is not one of ours."""
    if token == FINISHED:
        return FINISHED

    def bad(reason: str) -> OtsError:
        return parameter_invalid(f"Invalid token for channel {channel_id}: {reason}")

    try:
        raw = base64.b64decode(token.encode("ascii"), validate=True)
        envelope = m.parse(m.Token, raw)
        if envelope.version not in (1, 2):
            raise bad(f"unknown token version {envelope.version}")
        content = m.parse(m.TokenContentV2 if envelope.version == 2 else m.TokenContent,
                          envelope.content)
    except (ValueError, UnicodeError, binascii.Error, m.MessageError):
        raise bad("not a tunnel token") from None
    inner = content.iterator or content.primary_key.decode("ascii", "replace")
    if not inner:
        raise bad("empty token")
    text = _token_json(inner) if inner != FINISHED else None
    if text is not None and json_depth_exceeds(text, MAX_TOKEN_JSON_DEPTH):
        # the store parses its tokens' JSON: nesting it never writes stops here
        raise bad(f"nested deeper than {MAX_TOKEN_JSON_DEPTH} levels")
    return str(inner)


# --- errors -----------------------------------------------------------------------------------


def _to_ots(exc: Exception) -> OtsError:
    """The service error for one of the store's typed errors (statuses and codes from the
    service's error reference; the messages are the emulator's own)."""
    fields = getattr(exc, "fields", {})
    channel = wire_channel_id(str(fields.get("channel_id", "")))
    if isinstance(exc, UnknownTableError):
        return parameter_invalid(f"The requested table does not exist: {fields['table']}")
    if isinstance(exc, UnknownTunnelError):
        return parameter_invalid(f"The tunnel does not exist: {fields['tunnel']}")
    if isinstance(exc, UnknownChannelError):
        return parameter_invalid(f"Channel does not exist: {channel}")
    if isinstance(exc, TunnelExistsError):
        return OtsError(409, "OTSTunnelExist", f"Tunnel already exists: {fields['tunnel']}")
    if isinstance(exc, ChannelNotReadableError):
        return parameter_invalid(f"Channel is not readable: {channel} is {fields['status']}")
    if isinstance(exc, MalformedTokenError):
        return parameter_invalid(f"Invalid token for channel {channel}: {fields['reason']}")
    if isinstance(exc, StaleCheckpointError):
        pushed, stored = fields["pushed"], fields["stored"]
        return OtsError(400, "OTSSequenceNumberNotMatch", f"Sequence number {pushed} is not "
                        f"the stored {stored} + 1 [stored={stored}]")
    if isinstance(exc, InvalidCheckpointError):
        return parameter_invalid(f"Invalid checkpoint for channel {channel}: {fields['reason']}")
    if isinstance(exc, TransientTunnelError):
        return OtsError(503, "OTSTunnelServerUnavailable", "Tunnel server is busy, retry later.")
    return parameter_invalid(str(exc))


_STORE_ERRORS = (
    UnknownTableError, UnknownTunnelError, UnknownChannelError, TunnelExistsError,
    ChannelNotReadableError, MalformedTokenError, StaleCheckpointError,
    InvalidCheckpointError, TransientTunnelError,
)


def _kept(ctx: EmulatorContext, key: str, make: Callable[[], T]) -> T:
    """The tunnel API's in-memory state ``key`` of this emulator, made at first use."""
    with ctx.lock:
        if key not in ctx.state:
            ctx.state[key] = make()
        return cast(T, ctx.state[key])


def _service(ctx: EmulatorContext) -> LocalTunnelService:
    return _kept(ctx, "tunnel", lambda: LocalTunnelService(ctx.store))


def tunnel_clients(ctx: EmulatorContext) -> TunnelClients:
    """The emulator's client state machine (created on first use; a test may install one
    with its own clock first: ``ctx.state["tunnel_clients"] = TunnelClients(clock)``)."""
    return _kept(ctx, "tunnel_clients", TunnelClients)


def _expired(ctx: EmulatorContext) -> set[str]:
    """Ids of the tunnels ``expire_tunnel`` expired (until deleted)."""
    return _kept(ctx, "expired_tunnels", set)


def expire_tunnel(ctx: EmulatorContext, table: str, tunnel_name: str) -> str:
    """The test hook ``EmulatorServer.expire_tunnel``: expire the named tunnel as the service
    does once its change log passed the stream's retention; returns its id."""
    tunnel_id = _service(ctx).describe_tunnel(table, tunnel_name).tunnel.tunnel_id
    with ctx.lock:
        _expired(ctx).add(tunnel_id)
    return tunnel_id


def _refuse_expired(ctx: EmulatorContext, tunnel_id: str) -> None:
    with ctx.lock:
        expired = tunnel_id in _expired(ctx)
    if expired:
        raise OtsError(400, "OTSTunnelExpired",
                       f"The tunnel has expired: {tunnel_id}. Its log data passed the stream's "
                       "retention.")


#: calls an expired tunnel still answers (by table and tunnel name): the others name its id
_ANSWERED_WHEN_EXPIRED = (m.CreateTunnelRequest, m.ListTunnelRequest, m.DescribeTunnelRequest,
                          m.DeleteTunnelRequest)


def _route(request_type: Any) -> Callable[[Callable[..., Any]], Callable[..., bytes]]:
    """Parse the request (400 on a malformed one), refuse a call on an expired tunnel's id,
    run the handler, map the store's errors."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., bytes]:
        @functools.wraps(fn)
        def handler(ctx: EmulatorContext, body: bytes) -> bytes:
            try:
                request = m.parse(request_type, body)
            except m.MessageError as exc:
                raise parameter_invalid(str(exc)) from None
            if request_type not in _ANSWERED_WHEN_EXPIRED and request.tunnel_id:
                _refuse_expired(ctx, request.tunnel_id)
            try:
                response = fn(ctx, _service(ctx), request)
            except _STORE_ERRORS as exc:
                raise _to_ots(exc) from None
            return bytes(response.SerializeToString())

        return handler

    return wrap


# --- tunnels ----------------------------------------------------------------------------------


def _tunnel_info(ctx: EmulatorContext, service: LocalTunnelService, table: str,
                 name: str, channels: Any = None) -> tuple[Any, int]:
    """``(TunnelInfo, tunnel_rpo)`` of one tunnel; its channels' ``ChannelInfo`` are added to
    ``channels`` (a response's repeated field: made in place, not copied in) when given."""
    desc, consumed = service.describe_with_progress(table, name)
    t = desc.tunnel
    base_open = any(c.channel_type is ChannelType.BASE_DATA
                    and c.status is not ChannelStatus.TERMINATED for c in desc.channels)
    info = m.TunnelInfo(
        tunnel_id=t.tunnel_id,
        tunnel_type=t.tunnel_type.value,
        table_name=t.table_name,
        instance_name=ctx.instance,
        stream_id=f"{t.table_name}_stream",
        stage="ProcessBaseData" if base_open else "ProcessStream",
        expired=t.tunnel_id in _expired(ctx),
        tunnel_name=t.tunnel_name,
        public=False,
        create_time=int(t.created_at * 1e9),
    )
    info.stream_tunnel_config.flag = (
        m.FLAG_LATEST if t.start_position is StartPosition.LATEST else m.FLAG_EARLIEST
    )
    owners = tunnel_clients(ctx).owners(t.tunnel_id)
    reading = []
    for c in desc.channels:
        # records before the checkpoint; commit time in ns of the last of them (0: none)
        count, last_us = consumed.get(c.channel_id, (0, None))
        rpo = (last_us or 0) * 1000
        if c.channel_type is ChannelType.STREAM and c.status is ChannelStatus.OPEN and rpo:
            reading.append(rpo)
        if channels is None:
            continue
        wire_id = wire_channel_id(c.channel_id)
        ci = channels.add(channel_id=wire_id, channel_type=c.channel_type.value,
                          channel_status=c.status.value, channel_count=count, channel_rpo=rpo)
        if wire_id in owners:
            ci.client_id = owners[wire_id]
        if c.parent_ids:
            ci.parent_ids.extend(wire_channel_id(p) for p in c.parent_ids)
    return info, min(reading, default=0)


def _tunnel_by_id(service: LocalTunnelService, tunnel_id: str) -> Any:
    """The store's record of a tunnel (``UnknownTunnelError`` -> 400 when missing)."""
    with service.store.transaction() as conn:
        return service._tunnel_by_id(conn, tunnel_id)


@_route(m.CreateTunnelRequest)
def create_tunnel(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/create: Stream or BaseAndStream (BaseData alone is not emulated)."""
    t = req.tunnel
    types = {m.TUNNEL_TYPE["Stream"]: TunnelType.STREAM,
             m.TUNNEL_TYPE["BaseAndStream"]: TunnelType.BASE_AND_STREAM}
    if t.tunnel_type not in types:
        raise parameter_invalid("The emulator supports Stream and BaseAndStream tunnels only.")
    start = StartPosition.EARLIEST
    start_at_us = None
    config = t.stream_tunnel_config
    if t.HasField("stream_tunnel_config"):
        if config.HasField("endOffset"):
            raise parameter_invalid("The emulator does not support an end offset.")
        if config.HasField("startOffset"):
            # nanoseconds since the epoch (the SDKs convert milliseconds x 1e6); the SDKs
            # send either a start offset or a flag, never both
            if config.HasField("flag"):
                raise parameter_invalid("Set either flag or startOffset, not both.")
            if t.tunnel_type != m.TUNNEL_TYPE["Stream"]:
                raise parameter_invalid("startOffset applies to a Stream tunnel.")
            start_at_us = int(config.startOffset) // 1000
        elif config.HasField("flag") and config.flag == m.FLAG_LATEST:
            start = StartPosition.LATEST
    if not t.tunnel_name:
        raise parameter_invalid("tunnel_name is empty.")
    info = service.create_tunnel(t.table_name, t.tunnel_name, types[t.tunnel_type], start,
                                 start_at_us)
    return m.CreateTunnelResponse(tunnel_id=info.tunnel_id)


@_route(m.DescribeTunnelRequest)
def describe_tunnel(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/describe: the tunnel, its channels with their status for it, their owners and
    progress."""
    response = m.DescribeTunnelResponse()
    info, response.tunnel_rpo = _tunnel_info(ctx, service, req.table_name, req.tunnel_name,
                                             response.channels)
    response.tunnel.CopyFrom(info)
    return response


@_route(m.ListTunnelRequest)
def list_tunnels(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/list: tunnels of one table, or of every table when none is named."""
    table = req.table_name if req.HasField("table_name") and req.table_name else None
    out = m.ListTunnelResponse()
    for t in service.list_tunnels(table):
        info, _ = _tunnel_info(ctx, service, t.table_name, t.tunnel_name)
        out.tunnels.append(info)
    return out


@_route(m.DeleteTunnelRequest)
def delete_tunnel(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/delete: the tunnel, its checkpoints and its connected clients."""
    tunnel_id = service.describe_tunnel(req.table_name, req.tunnel_name).tunnel.tunnel_id
    service.delete_tunnel(req.table_name, req.tunnel_name)
    tunnel_clients(ctx).forget(tunnel_id)
    with ctx.lock:
        _expired(ctx).discard(tunnel_id)
    return m.DeleteTunnelResponse()


# --- connected clients ------------------------------------------------------------------------


@_route(m.ConnectRequest)
def connect(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/connect: a new client id; ``ClientConfig.timeout`` (seconds) is how long it may
    go without a heartbeat before its channels move to other clients."""
    _tunnel_by_id(service, req.tunnel_id)
    config = req.client_config
    client_id = tunnel_clients(ctx).connect(
        req.tunnel_id, config.timeout if config.HasField("timeout") else None,
        config.client_tag if config.HasField("client_tag") else "")
    return m.ConnectResponse(client_id=client_id)


@_route(m.HeartbeatRequest)
def heartbeat(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/heartbeat: the client's channels in, the server's view of its channels out
    (``tunnel_clients.TunnelClients.heartbeat``); 410 ``OTSResourceGone`` for a client that is
    not connected (never was, shut down, or missed heartbeats past its timeout)."""
    tunnel = _tunnel_by_id(service, req.tunnel_id)
    desc = service.describe_tunnel(tunnel.table, tunnel.name)
    readable = [wire_channel_id(c.channel_id) for c in desc.channels
                if c.status is ChannelStatus.OPEN]
    terminated = [wire_channel_id(c.channel_id) for c in desc.channels
                  if c.status is ChannelStatus.TERMINATED]
    reported = [ChannelState(c.channel_id, int(c.version), _STATUS_NAMES[c.status])
                for c in req.channels]
    try:
        view = tunnel_clients(ctx).heartbeat(req.tunnel_id, req.client_id, reported,
                                             readable, terminated)
    except ClientGone as exc:
        raise OtsError(410, "OTSResourceGone", str(exc)) from None
    out = m.HeartbeatResponse()
    for c in view:
        out.channels.add(channel_id=c.channel_id, version=c.version,
                         status=m.CHANNEL_STATUS[c.status])
    return out


@_route(m.ShutdownRequest)
def shutdown(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/shutdown: the client is dropped and its channels are free at once."""
    _tunnel_by_id(service, req.tunnel_id)
    tunnel_clients(ctx).shutdown(req.tunnel_id, req.client_id)
    return m.ShutdownResponse()


@_route(m.GetRpoRequest)
def get_rpo(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/getrpo (the Go SDK's ``GetRpo``): two JSON documents. ``rpo_infos``:
    ``{tunnel id: {channel id: {ChannelTyp, Status, TotalCount, AccessTime, RpoTime}}}``;
    ``tunnel_rpo_infos``: ``{tunnel id: {Status, TotalCount, AccessTime, RpoTime}}``.
    TotalCount is the records before the checkpoint, RpoTime the commit time of the last of
    them and AccessTime the last checkpoint pushed through this emulator (both nanoseconds,
    0 when unknown); the tunnel's Status is its stage. The Go SDK's model names these keys;
    what the service puts under them is unverified."""
    if not req.HasField("tunnel_id") or not req.tunnel_id:
        raise parameter_invalid("tunnel_id is required.")
    tunnel = _tunnel_by_id(service, req.tunnel_id)
    described = m.DescribeTunnelResponse()
    info, tunnel_rpo = _tunnel_info(ctx, service, tunnel.table, tunnel.name,
                                    described.channels)
    channels = described.channels
    pushed = _checkpoint_times(ctx)
    per_channel = {
        c.channel_id: {"ChannelTyp": c.channel_type, "Status": c.channel_status,
                       "TotalCount": c.channel_count, "RpoTime": c.channel_rpo,
                       "AccessTime": pushed.get((req.tunnel_id, c.channel_id), 0)}
        for c in channels
    }
    summary = {"Status": info.stage, "TotalCount": sum(c.channel_count for c in channels),
               "AccessTime": max((v["AccessTime"] for v in per_channel.values()), default=0),
               "RpoTime": tunnel_rpo}
    return m.GetRpoResponse(
        tunnel_id=req.tunnel_id,
        rpo_infos=json.dumps({req.tunnel_id: per_channel}).encode(),
        tunnel_rpo_infos=json.dumps({req.tunnel_id: summary}).encode(),
    )


def _checkpoint_times(ctx: EmulatorContext) -> dict[tuple[str, str], int]:
    """(tunnel id, wire channel id) -> when its last checkpoint was pushed here (ns)."""
    return _kept(ctx, "checkpoint_times", dict)


# --- checkpoints and records -------------------------------------------------------------------


def _is_base(service: LocalTunnelService, tunnel_id: str, channel_id: str) -> bool:
    with service.store.transaction() as conn:
        tunnel = service._tunnel_by_id(conn, tunnel_id)
        return service._channel(conn, tunnel, channel_id).channel_type is ChannelType.BASE_DATA


@_route(m.GetCheckpointRequest)
def get_checkpoint(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/getcheckpoint: the stored checkpoint, else the channel's start position (any
    client id)."""
    channel = store_channel_id(req.channel_id)
    base = _is_base(service, req.tunnel_id, channel)
    cp = service.get_checkpoint(req.tunnel_id, channel)
    return m.GetCheckpointResponse(checkpoint=wire_token(cp.token, base),
                                   sequence_number=cp.sequence_number)


@_route(m.CheckpointRequest)
def checkpoint(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/checkpoint (any client id): accepted when the sequence number is the stored
    one + 1 (the SDKs' rule; 400 ``OTSSequenceNumberNotMatch`` otherwise), and when the store
    accepts the position (a FINISHED only at a closed channel's end...)."""
    channel = store_channel_id(req.channel_id)
    try:
        token = local_token(req.checkpoint, req.channel_id)
    except OtsError:
        _is_base(service, req.tunnel_id, channel)  # an unknown tunnel or channel is named first
        raise
    pushed = int(req.sequence_number)
    with ctx.write_lock:  # the rule's check and the write: one transaction for every client
        service.checkpoint(req.tunnel_id, channel, Checkpoint(token, pushed),
                           next_of_stored=True)
    with ctx.lock:
        _checkpoint_times(ctx)[(req.tunnel_id, req.channel_id)] = time.time_ns()
    return m.CheckpointResponse()


#: records per ReadRecords response (the service sends pages of up to about 500 records)
READ_PAGE = 500


def sequence_info(record: Any) -> SequenceInfo:
    """Where a store's stream record sits on the wire: epoch 0, its commit time in
    microseconds, the store's per-channel sequence as the row index."""
    index = int(record.sequence)
    if index > _MAX_ROW_INDEX:
        raise OtsError(500, "OTSInternalServerError", "the emulator's row index overflowed 31 bits")
    return SequenceInfo(0, record.commit_ts_us, index)


def wire_change_log(change_log: list[Record]) -> list[Record]:
    """A store's change log with each record's ``sequence`` as a reader of this emulator's
    Tunnel API sees it (the wire client's ``SequenceInfo`` text), so a sink's deliveries over
    the wire compare with the store's own log (the demo's verification, the tests')."""
    return [dataclasses.replace(r, sequence=sequence_info(r).sortable()) for r in change_log]


def encode_record(record: Any, base: bool) -> Any:
    """One store ``Record`` as a wire ``Record`` (PlainBuffer bodies)."""
    pk = tuple(record.primary_key.items())
    ts_ms = record.commit_ts_us // 1000
    seq = None if base else sequence_info(record)
    if record.op is Op.DELETE:
        action = m.ACTION_DELETE_ROW
        row = Row(pk, (), True, seq)
    else:
        action = m.ACTION_PUT_ROW if record.op is Op.PUT else m.ACTION_UPDATE_ROW
        cells = tuple(
            Cell(name, None, CellOp.DELETE_ALL_VERSION) if value is None
            else Cell(name, value, CellOp.PUT, ts_ms)
            for name, value in record.columns.items()
            if not (value is None and record.op is Op.PUT)
        )
        row = Row(pk, cells, False, seq)
    out = m.Record(action_type=action, record=encode_row(row))
    if record.before is not None:
        before = tuple(Cell(k, v, CellOp.PUT, ts_ms) for k, v in record.before.items()
                       if v is not None)
        out.origin_record = encode_row(Row((), before))
    return out


@_route(m.ReadRecordsRequest)
def read_records(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/readrecords (any client id): up to ``READ_PAGE`` records after the token
    (fewer when the emulator-only ``max_records`` asks for fewer)."""
    channel = store_channel_id(req.channel_id)
    base = _is_base(service, req.tunnel_id, channel)
    token = local_token(req.token, req.channel_id)
    page = READ_PAGE
    if req.HasField("max_records") and req.max_records > 0:
        page = min(page, req.max_records)
    try:
        result = service.read_records(req.tunnel_id, channel, token, page)
    except TrimmedDataError as exc:
        resume = wire_token(exc.resume_token, base)
        raise OtsError(
            400, "OTSTunnelServerUnavailable",
            f"{TRIMMED_PREFIX} Requested stream data is already trimmed or does not exist. "
            f"[requested={exc.fields['requested']} earliest={exc.fields['earliest']} "
            f"lost={exc.fields['lost']} "
            f"resume={resume}]",
        ) from None
    out = m.ReadRecordsResponse(next_token=wire_token(result.next_token, base),
                                may_more_record=result.may_more)
    out.records.extend(encode_record(r, base) for r in result.records)
    return out


ROUTES: dict[str, Callable[[EmulatorContext, bytes], bytes]] = {
    "/tunnel/create": create_tunnel,
    "/tunnel/list": list_tunnels,
    "/tunnel/describe": describe_tunnel,
    "/tunnel/delete": delete_tunnel,
    "/tunnel/connect": connect,
    "/tunnel/heartbeat": heartbeat,
    "/tunnel/shutdown": shutdown,
    "/tunnel/getcheckpoint": get_checkpoint,
    "/tunnel/readrecords": read_records,
    "/tunnel/checkpoint": checkpoint,
    "/tunnel/getrpo": get_rpo,
}
