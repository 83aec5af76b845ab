"""The emulator's Tunnel API: ``POST /tunnel/*`` served from the embedded store's tunnels.

``server`` dispatches every ``/tunnel/...`` path to ``ROUTES`` (already authenticated). Each
handler parses the protobuf request (``connector.tunnel.tablestore.messages``), calls the
embedded store's ``LocalTunnelService`` -- the reference semantics: tunnels per table, Stream and
BaseAndStream, a child in ``WAIT`` until every parent's checkpoint for that tunnel is
``"finished"`` (base channels before stream channels), the checkpoint sequence rule, trimming --
and answers the way the service does.

What the wire sees, and where it is the emulator's own choice (docs/tablestore.md):

- Tokens are standard base64 of a ``Token{version=2, content=TokenContentV2}``. A stream
  channel's ``iterator`` holds the store's own position token; a base-data channel's iterator is
  empty (the one thing the SDKs inspect) and its ``primary_key`` holds the position instead.
  ``total_count`` is the number of records before the position. ``"finished"`` is literal.
- Records are PlainBuffer rows; stream records carry ``SequenceInfo(epoch 0, commit time in
  microseconds, the store's per-channel sequence)``; base-data records carry none. An UPDATE's
  deleted columns are ``DELETE_ALL_VERSION`` cells; a DELETE is the key plus the delete marker;
  ``origin_record`` is the before-image (an empty key section, then the columns), absent when
  the row did not exist.
- Errors: trimmed data is 503 ``OTSTunnelServerUnavailable`` whose message begins
  ``OTSTrimmedDataAccess`` (as the service's), followed by ``[resume=<token>]`` -- the first
  position still held, an emulator addition the client uses when present. Stale checkpoints are
  400 ``OTSSequenceNumberNotMatch``. Unknown tables/tunnels are 404 ``OTSObjectNotExist``,
  other refusals 400 ``OTSParameterInvalid``, with messages starting with a fixed phrase
  (``MESSAGE_*`` below) the client recognises.
- ``ChannelInfo.parent_ids`` (field 1000) carries the lineage; the service has no such field.
- ConnectTunnel, Heartbeat and ShutdownTunnel are accepted for SDK compatibility; reads and
  checkpoints accept any client id (as the service does for the vendor's Spark connector).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable
from typing import Any

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
    StartPosition,
    TunnelType,
)
from connector.tunnel.local import LocalTunnelService
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.plainbuffer import Cell, CellOp, Row, SequenceInfo, encode_row
from tablestore_emulator.context import EmulatorContext
from tablestore_emulator.errors import OtsError

#: the message phrases the client maps back to typed errors (connector.tunnel.tablestore.client)
MESSAGE_NO_TABLE = "Requested table does not exist"
MESSAGE_NO_TUNNEL = "Tunnel does not exist"
MESSAGE_NO_CHANNEL = "Channel does not exist"
MESSAGE_BAD_TOKEN = "Invalid token"
MESSAGE_NOT_READABLE = "Channel is not readable"
MESSAGE_BAD_CHECKPOINT = "Invalid checkpoint"
TRIMMED_PREFIX = "OTSTrimmedDataAccess"

_MAX_ROW_INDEX = 2**31 - 1


# --- tokens -----------------------------------------------------------------------------------


def _local_seq(local_token: str) -> int:
    body = json.loads(base64.b64decode(local_token))
    return int(body["s"])


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
        return OtsError(400, "OTSParameterInvalid",
                        f"{MESSAGE_BAD_TOKEN} for channel {channel_id}: {reason}")

    try:
        raw = base64.b64decode(token.encode("ascii"), validate=True)
        envelope = m.parse(m.Token, raw)
        if envelope.version not in (1, 2):
            raise bad(f"unknown token version {envelope.version}")
        content = m.parse(m.TokenContentV2 if envelope.version == 2 else m.TokenContent,
                          envelope.content)
    except (ValueError, UnicodeError, binascii.Error, m.MessageError) as exc:
        if isinstance(exc, OtsError):
            raise
        raise bad("not a tunnel token") from None
    inner = content.iterator or content.primary_key.decode("ascii", "replace")
    if not inner:
        raise bad("empty token")
    return str(inner)


# --- errors -----------------------------------------------------------------------------------


def _to_ots(exc: Exception) -> OtsError:
    """The service error for one of the store's typed errors."""
    fields = getattr(exc, "fields", {})
    if isinstance(exc, UnknownTableError):
        return OtsError(404, "OTSObjectNotExist", f"{MESSAGE_NO_TABLE}: {fields['table']}")
    if isinstance(exc, UnknownTunnelError):
        return OtsError(404, "OTSObjectNotExist", f"{MESSAGE_NO_TUNNEL}: {fields['tunnel']}")
    if isinstance(exc, UnknownChannelError):
        return OtsError(400, "OTSParameterInvalid", f"{MESSAGE_NO_CHANNEL}: {fields['channel_id']}")
    if isinstance(exc, TunnelExistsError):
        return OtsError(409, "OTSTunnelExist", f"Tunnel already exists: {fields['tunnel']}")
    if isinstance(exc, ChannelNotReadableError):
        return OtsError(400, "OTSParameterInvalid",
                        f"{MESSAGE_NOT_READABLE}: {fields['channel_id']} is {fields['status']}")
    if isinstance(exc, MalformedTokenError):
        return OtsError(400, "OTSParameterInvalid",
                        f"{MESSAGE_BAD_TOKEN} for channel {fields['channel_id']}: "
                        f"{fields['reason']}")
    if isinstance(exc, StaleCheckpointError):
        return OtsError(400, "OTSSequenceNumberNotMatch",
                        f"sequence number {fields['pushed']} is smaller than the stored "
                        f"{fields['stored']} [stored={fields['stored']}]")
    if isinstance(exc, InvalidCheckpointError):
        return OtsError(400, "OTSParameterInvalid", f"{MESSAGE_BAD_CHECKPOINT}: {fields['reason']}")
    if isinstance(exc, TransientTunnelError):
        return OtsError(503, "OTSTunnelServerUnavailable", "Tunnel server is busy, retry later.")
    return OtsError(400, "OTSParameterInvalid", str(exc))


_STORE_ERRORS = (
    UnknownTableError, UnknownTunnelError, UnknownChannelError, TunnelExistsError,
    ChannelNotReadableError, MalformedTokenError, StaleCheckpointError,
    InvalidCheckpointError, TransientTunnelError,
)


def _service(ctx: EmulatorContext) -> LocalTunnelService:
    with ctx.lock:
        service = ctx.state.get("tunnel")
        if service is None:
            service = ctx.state["tunnel"] = LocalTunnelService(ctx.store)
        return service  # type: ignore[no-any-return]


def _route(request_type: Any) -> Callable[[Callable[..., Any]], Callable[..., bytes]]:
    """Parse the request (400 on a malformed one), run the handler, map the store's errors."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., bytes]:
        def handler(ctx: EmulatorContext, body: bytes) -> bytes:
            try:
                request = m.parse(request_type, body)
            except m.MessageError as exc:
                raise OtsError(400, "OTSParameterInvalid", str(exc)) from None
            try:
                response = fn(ctx, _service(ctx), request)
            except _STORE_ERRORS as exc:
                raise _to_ots(exc) from None
            return bytes(response.SerializeToString())

        handler.__name__ = fn.__name__
        handler.__doc__ = fn.__doc__
        return handler

    return wrap


# --- tunnels ----------------------------------------------------------------------------------


def _tunnel_info(ctx: EmulatorContext, service: LocalTunnelService, table: str,
                 name: str) -> tuple[Any, list[Any]]:
    desc = service.describe_tunnel(table, name)
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
        expired=False,
        tunnel_name=t.tunnel_name,
        public=False,
        create_time=int(t.created_at * 1e9),
    )
    info.stream_tunnel_config.flag = (
        m.FLAG_LATEST if t.start_position is StartPosition.LATEST else m.FLAG_EARLIEST
    )
    channels = []
    for c in desc.channels:
        ci = m.ChannelInfo(channel_id=c.channel_id, channel_type=c.channel_type.value,
                           channel_status=c.status.value)
        ci.parent_ids.extend(c.parent_ids)
        channels.append(ci)
    return info, channels


@_route(m.CreateTunnelRequest)
def create_tunnel(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/create: Stream or BaseAndStream (BaseData alone is not emulated)."""
    t = req.tunnel
    types = {m.TUNNEL_TYPE["Stream"]: TunnelType.STREAM,
             m.TUNNEL_TYPE["BaseAndStream"]: TunnelType.BASE_AND_STREAM}
    if t.tunnel_type not in types:
        raise OtsError(400, "OTSParameterInvalid",
                       "The emulator supports Stream and BaseAndStream tunnels only.")
    start = StartPosition.EARLIEST
    config = t.stream_tunnel_config
    if t.HasField("stream_tunnel_config"):
        if config.HasField("startOffset") or config.HasField("endOffset"):
            raise OtsError(400, "OTSParameterInvalid",
                           "The emulator does not support start/end offsets; use flag.")
        if config.HasField("flag") and config.flag == m.FLAG_LATEST:
            start = StartPosition.LATEST
    if not t.tunnel_name:
        raise OtsError(400, "OTSParameterInvalid", "tunnel_name is empty.")
    info = service.create_tunnel(t.table_name, t.tunnel_name, types[t.tunnel_type], start)
    return m.CreateTunnelResponse(tunnel_id=info.tunnel_id)


@_route(m.DescribeTunnelRequest)
def describe_tunnel(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/describe: the tunnel and its channels with their status for it."""
    info, channels = _tunnel_info(ctx, service, req.table_name, req.tunnel_name)
    return m.DescribeTunnelResponse(tunnel=info, channels=channels, tunnel_rpo=0)


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
    """/tunnel/delete: the tunnel and its checkpoints."""
    service.delete_tunnel(req.table_name, req.tunnel_name)
    return m.DeleteTunnelResponse()


@_route(m.ConnectRequest)
def connect(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/connect: a fresh client id (the emulator does not track clients)."""
    with service.store.transaction() as conn:
        service._tunnel_by_id(conn, req.tunnel_id)
    return m.ConnectResponse(client_id=f"{req.tunnel_id}-{uuid.uuid4().hex[:12]}")


@_route(m.HeartbeatRequest)
def heartbeat(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/heartbeat: every OPEN channel assigned to the caller, at version 0 (the
    emulator does not balance channels between clients)."""
    with service.store.transaction() as conn:
        tunnel = service._tunnel_by_id(conn, req.tunnel_id)
    desc = service.describe_tunnel(tunnel.table, tunnel.name)
    out = m.HeartbeatResponse()
    for c in desc.channels:
        if c.status is ChannelStatus.OPEN:
            out.channels.add(channel_id=c.channel_id, version=0, status=1)
    return out


@_route(m.ShutdownRequest)
def shutdown(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/shutdown: accepted."""
    return m.ShutdownResponse()


# --- checkpoints and records -------------------------------------------------------------------


def _is_base(service: LocalTunnelService, tunnel_id: str, channel_id: str) -> bool:
    with service.store.transaction() as conn:
        tunnel = service._tunnel_by_id(conn, tunnel_id)
        return service._channel(conn, tunnel, channel_id).channel_type is ChannelType.BASE_DATA


@_route(m.GetCheckpointRequest)
def get_checkpoint(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/getcheckpoint: the stored checkpoint, else the channel's start position."""
    base = _is_base(service, req.tunnel_id, req.channel_id)
    cp = service.get_checkpoint(req.tunnel_id, req.channel_id)
    return m.GetCheckpointResponse(checkpoint=wire_token(cp.token, base),
                                   sequence_number=cp.sequence_number)


@_route(m.CheckpointRequest)
def checkpoint(ctx: EmulatorContext, service: LocalTunnelService, req: Any) -> Any:
    """/tunnel/checkpoint: accepted when the sequence is not lower than the stored one."""
    _is_base(service, req.tunnel_id, req.channel_id)  # unknown tunnel/channel first
    token = local_token(req.checkpoint, req.channel_id)
    service.checkpoint(req.tunnel_id, req.channel_id,
                       Checkpoint(token, int(req.sequence_number)))
    return m.CheckpointResponse()


#: records per ReadRecords response (the service sends pages of up to about 500 records)
READ_PAGE = 500


def encode_record(record: Any, base: bool) -> Any:
    """One store ``Record`` as a wire ``Record`` (PlainBuffer bodies)."""
    pk = tuple(record.primary_key.items())
    ts_ms = record.commit_ts_us // 1000
    seq = None
    if not base:
        index = int(record.sequence)
        if index > _MAX_ROW_INDEX:
            raise OtsError(500, "OTSInternalServerError",
                           "the emulator's row index overflowed 31 bits")
        seq = SequenceInfo(0, record.commit_ts_us, index)
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
    """/tunnel/readrecords: up to ``READ_PAGE`` records after the token (fewer when the
    emulator-only ``max_records`` asks for fewer)."""
    base = _is_base(service, req.tunnel_id, req.channel_id)
    token = local_token(req.token, req.channel_id)
    page = READ_PAGE
    if req.HasField("max_records") and req.max_records > 0:
        page = min(page, req.max_records)
    try:
        result = service.read_records(req.tunnel_id, req.channel_id, token, page)
    except TrimmedDataError as exc:
        resume = wire_token(exc.resume_token, base)
        raise OtsError(
            503, "OTSTunnelServerUnavailable",
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
}
