"""The embedded local table store (one SQLite file): the product's default backend.

``LocalTablestore`` holds tables, rows and a per-channel change log; the tunnel service over it
is ``connector.tunnel.local.LocalTunnelService`` (URI ``local:///abs/path/store.db``) and the
``tablestore-cdc local ...`` commands live in ``tablestore_cdc.local_cli``.
"""

from __future__ import annotations

from connector.local.store import ChannelRow, LocalTablestore

__all__ = ["ChannelRow", "LocalTablestore"]
