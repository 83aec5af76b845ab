"""Tunnel-service backends, chosen by URI scheme.

``open_tunnel_service("local:///abs/path/store.db")`` returns a ``TunnelService``. Backends are
imported lazily (``cdc_common.registry``), so an SDK a backend needs is only required when that
scheme is used; a missing one is refused with the ``pip install`` line that brings it.
"""

from __future__ import annotations

from cdc_common.registry import Backend, BackendRegistry
from connector.errors import OptionError
from connector.tunnel.base import (
    FINISHED,
    ChannelInfo,
    ChannelLag,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    ColumnSpec,
    Op,
    ReadResult,
    Record,
    StartPosition,
    TableSchema,
    TunnelDescription,
    TunnelInfo,
    TunnelService,
    TunnelType,
)

_TABLESTORE_TARGET = "connector.tunnel.tablestore.client:TablestoreTunnelService"
#: the Tunnel wire client needs protobuf and httptools (the extra brings both)
_TABLESTORE_INSTALL = "pip install 'tablestore-cdc[tablestore]'"
#: scheme -> the tunnel backend class and how to install what it needs (the order of the
#: schemes is the order an endpoint error lists them in)
TUNNEL_BACKENDS = BackendRegistry(
    {
        "local": Backend("connector.tunnel.local:LocalTunnelService",
                         form="local:///abs/path/store.db"),
        "http": Backend(_TABLESTORE_TARGET, _TABLESTORE_INSTALL,
                        form="http://HOST:PORT (a Tablestore emulator)"),
        "https": Backend(_TABLESTORE_TARGET, _TABLESTORE_INSTALL,
                         form="https://INSTANCE.REGION.ots.aliyuncs.com (Tablestore)"),
        "dynamodb-streams": Backend(
            "connector.tunnel.dynamodb_streams.service:DynamoDbStreamsTunnelService",
            "pip install 'tablestore-cdc[dynamodb]'",
            form="dynamodb-streams://[TABLE]?checkpoint_table=NAME&region=..."),
    },
    refuse=lambda uri, problem, allowed: OptionError(option="endpoint", value=uri,
                                                     problem=problem, allowed=allowed),
)


def open_tunnel_service(uri: str) -> TunnelService:
    """Open a client for the tunnel service at ``uri`` (driver or executor). An unknown scheme
    or a backend whose SDK is missing raises ``OptionError`` naming ``endpoint``."""
    service: TunnelService = TUNNEL_BACKENDS.load(uri).from_uri(uri)
    return service


__all__ = [
    "FINISHED",
    "TUNNEL_BACKENDS",
    "ChannelInfo",
    "ChannelLag",
    "ChannelStatus",
    "ChannelType",
    "Checkpoint",
    "ColumnSpec",
    "Op",
    "ReadResult",
    "Record",
    "StartPosition",
    "TableSchema",
    "TunnelDescription",
    "TunnelInfo",
    "TunnelService",
    "TunnelType",
    "open_tunnel_service",
]
