"""The Tablestore Tunnel service's protobuf messages, with the published field numbers.

Built at import time from a ``FileDescriptorProto`` (no generated code: the ``tablestore`` SDK
pins protobuf < 6 and the newest code generators demand >= 6). Field numbers, labels and types
follow the Java SDK's ``tunnel_service_api.proto`` (see docs/tablestore.md). All messages are
proto2, so ``SerializeToString`` and ``ParseFromString`` refuse a message missing a required
field -- the same check both vendor SDKs make.

Two additions the service does not have, both field 1000 so they cannot collide with a
published field: ``ChannelInfo.parent_ids`` (repeated string; the project's emulator fills it
so lineage can be checked; the real service holds children in WAIT instead, and the client
treats its absence as "lineage unknown") and ``ReadRecordsRequest.max_records`` (int32; the
emulator returns at most that many records; the real service ignores unknown fields and pages
on its own, and the client then cuts its pages itself -- see ``client.py``).

Used by ``connector.tunnel.tablestore.client`` (driver and executors) and
``tablestore_emulator.tunnel_api`` (the emulator's server).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from connector.tunnel.tablestore.proto_text import invalid_string_field

_F = descriptor_pb2.FieldDescriptorProto
_REQ, _OPT, _REP = _F.LABEL_REQUIRED, _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_T = {
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "int64": _F.TYPE_INT64,
    "int32": _F.TYPE_INT32,
    "uint64": _F.TYPE_UINT64,
    "bool": _F.TYPE_BOOL,
}
PACKAGE = "tablestore_cdc.tunnel"

#: enum name -> [(value name, number)]
_ENUMS: dict[str, list[tuple[str, int]]] = {
    "TunnelType": [("BaseData", 1), ("Stream", 2), ("BaseAndStream", 3)],
    "ChannelStatus": [("OPEN", 1), ("CLOSING", 2), ("CLOSE", 3), ("TERMINATED", 4)],
    "ActionType": [("PUT_ROW", 1), ("UPDATE_ROW", 2), ("DELETE_ROW", 3)],
    "StartOffsetFlag": [("LATEST", 0), ("EARLIEST", 1)],
}

#: message name -> [(field name, number, label, type name)]; a type name that is not a scalar
#: is a message or enum of this file
_MESSAGES: dict[str, list[tuple[str, int, int, str]]] = {
    "StreamTunnelConfig": [
        ("flag", 1, _OPT, "StartOffsetFlag"),
        ("startOffset", 2, _OPT, "uint64"),
        ("endOffset", 3, _OPT, "uint64"),
    ],
    "Tunnel": [
        ("table_name", 1, _REQ, "string"),
        ("tunnel_name", 3, _REQ, "string"),
        ("tunnel_type", 4, _REQ, "TunnelType"),
        ("stream_tunnel_config", 5, _OPT, "StreamTunnelConfig"),
        ("need_all_time_series_columns", 6, _OPT, "bool"),
    ],
    "TunnelInfo": [
        ("tunnel_id", 1, _REQ, "string"),
        ("tunnel_type", 2, _REQ, "string"),
        ("table_name", 3, _REQ, "string"),
        ("instance_name", 4, _REQ, "string"),
        ("stream_id", 5, _REQ, "string"),
        ("stage", 6, _REQ, "string"),
        ("expired", 7, _OPT, "bool"),
        ("tunnel_name", 8, _OPT, "string"),
        ("public", 9, _OPT, "bool"),
        ("stream_tunnel_config", 10, _OPT, "StreamTunnelConfig"),
        ("create_time", 11, _OPT, "int64"),
    ],
    "ChannelInfo": [
        ("channel_id", 1, _REQ, "string"),
        ("channel_type", 2, _OPT, "string"),
        ("channel_status", 3, _OPT, "string"),
        ("client_id", 4, _OPT, "string"),
        ("channel_rpo", 5, _OPT, "int64"),
        ("channel_count", 6, _OPT, "int64"),
        ("parent_ids", 1000, _REP, "string"),  # emulator only, see the module docstring
    ],
    "Channel": [
        ("channel_id", 1, _REQ, "string"),
        ("version", 2, _REQ, "int64"),
        ("status", 3, _REQ, "ChannelStatus"),
        ("detail", 4, _OPT, "bytes"),
    ],
    "ClientConfig": [("timeout", 1, _OPT, "int64"), ("client_tag", 2, _OPT, "string")],
    "Record": [
        ("action_type", 1, _REQ, "ActionType"),
        ("record", 2, _REQ, "bytes"),
        ("origin_record", 3, _OPT, "bytes"),
    ],
    "Token": [("version", 1, _REQ, "int64"), ("content", 2, _REQ, "bytes")],
    "TokenContent": [
        ("primary_key", 1, _OPT, "bytes"),
        ("iterator", 2, _OPT, "string"),
        ("timestamp", 3, _OPT, "int64"),
    ],
    "TokenContentV2": [
        ("primary_key", 1, _OPT, "bytes"),
        ("iterator", 2, _OPT, "string"),
        ("timestamp", 3, _OPT, "int64"),
        ("total_count", 4, _OPT, "int64"),
    ],
    "Error": [
        ("code", 1, _REQ, "string"),
        ("message", 2, _OPT, "string"),
        ("tunnel_id", 3, _OPT, "string"),
    ],
    # requests and responses
    "CreateTunnelRequest": [("tunnel", 1, _REQ, "Tunnel")],
    "CreateTunnelResponse": [("tunnel_id", 1, _REQ, "string")],
    "ListTunnelRequest": [("table_name", 1, _OPT, "string")],
    "ListTunnelResponse": [("tunnels", 1, _REP, "TunnelInfo")],
    "DescribeTunnelRequest": [
        ("table_name", 1, _REQ, "string"),
        ("tunnel_name", 2, _REQ, "string"),
        ("tunnel_id", 3, _OPT, "string"),
    ],
    "DescribeTunnelResponse": [
        ("tunnel", 1, _REQ, "TunnelInfo"),
        ("channels", 2, _REP, "ChannelInfo"),
        ("tunnel_rpo", 3, _OPT, "int64"),
    ],
    "DeleteTunnelRequest": [
        ("table_name", 1, _REQ, "string"),
        ("tunnel_name", 2, _REQ, "string"),
        ("tunnel_id", 3, _OPT, "string"),
    ],
    "DeleteTunnelResponse": [],
    "ConnectRequest": [
        ("tunnel_id", 1, _REQ, "string"),
        ("client_config", 2, _OPT, "ClientConfig"),
    ],
    "ConnectResponse": [("client_id", 1, _REQ, "string")],
    "HeartbeatRequest": [
        ("tunnel_id", 1, _REQ, "string"),
        ("client_id", 2, _REQ, "string"),
        ("channels", 3, _REP, "Channel"),
    ],
    "HeartbeatResponse": [("channels", 1, _REP, "Channel")],
    "ShutdownRequest": [("tunnel_id", 1, _REQ, "string"), ("client_id", 2, _REQ, "string")],
    "ShutdownResponse": [],
    "GetCheckpointRequest": [
        ("tunnel_id", 1, _REQ, "string"),
        ("client_id", 2, _REQ, "string"),
        ("channel_id", 3, _REQ, "string"),
    ],
    "GetCheckpointResponse": [
        ("checkpoint", 1, _REQ, "string"),
        ("sequence_number", 2, _REQ, "int64"),
    ],
    "ReadRecordsRequest": [
        ("tunnel_id", 1, _REQ, "string"),
        ("client_id", 2, _REQ, "string"),
        ("channel_id", 3, _REQ, "string"),
        ("token", 4, _REQ, "string"),
        ("max_records", 1000, _OPT, "int32"),  # emulator only, see the module docstring
    ],
    "ReadRecordsResponse": [
        ("records", 1, _REP, "Record"),
        ("next_token", 2, _REQ, "string"),
        ("may_more_record", 3, _OPT, "bool"),
    ],
    "CheckpointRequest": [
        ("tunnel_id", 1, _REQ, "string"),
        ("client_id", 2, _REQ, "string"),
        ("channel_id", 3, _REQ, "string"),
        ("checkpoint", 4, _REQ, "string"),
        ("sequence_number", 5, _REQ, "int64"),
    ],
    "CheckpointResponse": [],
    # the Go SDK's only (GP): the tunnel's consumption summary, two JSON documents
    "GetRpoRequest": [("tunnel_id", 1, _OPT, "string"), ("limit", 2, _OPT, "int32")],
    "GetRpoResponse": [
        ("rpo_infos", 1, _OPT, "bytes"),
        ("tunnel_rpo_infos", 2, _OPT, "bytes"),
        ("tunnel_id", 3, _OPT, "string"),
    ],
}


def _build() -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="tablestore_cdc_tunnel_service.proto", package=PACKAGE, syntax="proto2"
    )
    for name, values in _ENUMS.items():
        enum = fdp.enum_type.add(name=name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for name, fields in _MESSAGES.items():
        msg = fdp.message_type.add(name=name)
        for field_name, number, label, type_name in fields:
            f = msg.field.add(name=field_name, number=number, label=label)
            if type_name in _T:
                f.type = _T[type_name]
            else:
                f.type = _F.TYPE_ENUM if type_name in _ENUMS else _F.TYPE_MESSAGE
                f.type_name = f".{PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    file_desc = pool.FindFileByName(fdp.name)
    classes = {
        name: message_factory.GetMessageClass(file_desc.message_types_by_name[name])
        for name in _MESSAGES
    }
    classes.update({name: file_desc.enum_types_by_name[name] for name in _ENUMS})
    return classes


_CLASSES = _build()


def __getattr__(name: str) -> Any:
    """The message classes (and enums) by name, ``m.ReadRecordsRequest``: built once, at
    import, from ``_MESSAGES`` and ``_ENUMS``."""
    try:
        return _CLASSES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


#: enum numbers
TUNNEL_TYPE = {"BaseData": 1, "Stream": 2, "BaseAndStream": 3}
CHANNEL_STATUS = {"OPEN": 1, "CLOSING": 2, "CLOSE": 3, "TERMINATED": 4}
ACTION_PUT_ROW, ACTION_UPDATE_ROW, ACTION_DELETE_ROW = 1, 2, 3
FLAG_LATEST, FLAG_EARLIEST = 0, 1


class MessageError(ValueError):
    """Bytes that are not a complete message of the expected type (missing required fields
    and ``string`` fields that are not UTF-8 included). Callers turn it into the product's
    typed errors."""


def parse(cls: Any, data: bytes) -> Any:
    """``cls`` parsed from ``data``, required fields enforced and ``string`` fields checked as
    UTF-8 (``ParseFromString`` alone checks neither in this protobuf runtime:
    ``proto_text``)."""
    msg = cls()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise MessageError(f"not a valid {cls.DESCRIPTOR.name}: {exc}") from None
    if not msg.IsInitialized():
        missing = ", ".join(msg.FindInitializationErrors())
        raise MessageError(f"{cls.DESCRIPTOR.name} lacks required field(s): {missing}")
    bad = invalid_string_field(msg)
    if bad is not None:
        raise MessageError(f"{cls.DESCRIPTOR.name} field {bad} is not UTF-8 text")
    return msg
