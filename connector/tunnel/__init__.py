"""Tunnel-service backends, chosen by URI scheme.

``open_tunnel_service("local:///abs/path/store.db")`` returns a ``TunnelService``. Backends are
imported lazily, so an SDK a backend needs is only required when that scheme is used.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

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

#: scheme -> (dotted path of the backend class, how to install what it needs)
TUNNEL_BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("connector.tunnel.local:LocalTunnelService", "included"),
    # the Tunnel wire client needs protobuf and urllib3 (the tablestore extra brings both)
    "http": ("connector.tunnel.tablestore.client:TablestoreTunnelService",
             "pip install 'tablestore-cdc[tablestore]'"),
    "https": ("connector.tunnel.tablestore.client:TablestoreTunnelService",
              "pip install 'tablestore-cdc[tablestore]'"),
    "dynamodb-streams": (
        "connector.tunnel.dynamodb_streams.service:DynamoDbStreamsTunnelService",
        "pip install 'tablestore-cdc[dynamodb]'",
    ),
}


def open_tunnel_service(uri: str) -> TunnelService:
    """Open a client for the tunnel service at ``uri`` (driver or executor)."""
    scheme = urlsplit(uri).scheme
    if scheme not in TUNNEL_BACKENDS:
        raise OptionError(
            option="endpoint",
            value=uri,
            problem="unsupported endpoint scheme",
            allowed=", ".join(f"{s}://..." for s in sorted(TUNNEL_BACKENDS)),
        )
    target, install_hint = TUNNEL_BACKENDS[scheme]
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # an optional SDK is missing
        raise OptionError(
            option="endpoint", value=uri, problem=f"backend unavailable ({exc})",
            allowed=install_hint,
        ) from exc
    return getattr(module, class_name).from_uri(uri)


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
