"""The embedded backend: a table store in one SQLite file and the tunnel service over it.

``LocalTablestore`` (``store``) holds tables, rows and a per-channel change log;
``LocalTunnelService`` (``service``) serves tunnels on the same file, URI
``local:///abs/path/store.db``.

``LocalTunnelService`` is imported on first use: a writer process that only writes rows never
loads pyarrow, which only the read path and segment sealing need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connector.tunnel.local.store import ChannelRow, LocalTablestore

if TYPE_CHECKING:
    from connector.tunnel.local.service import LocalTunnelService

__all__ = ["ChannelRow", "LocalTablestore", "LocalTunnelService"]


def __getattr__(name: str) -> Any:
    if name == "LocalTunnelService":
        from connector.tunnel.local.service import LocalTunnelService

        return LocalTunnelService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
