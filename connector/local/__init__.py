"""The embedded local table store under its public name: ``from connector.local import
LocalTablestore``.

The code lives in ``connector.tunnel.local`` (the store, its tunnel service and the tables
they share, one package); this module only re-exports the store's public names. The
``tablestore-cdc local ...`` commands live in ``tablestore_cdc.commands.local``.
"""

from __future__ import annotations

from connector.tunnel.local import ChannelRow, LocalTablestore

__all__ = ["ChannelRow", "LocalTablestore"]
