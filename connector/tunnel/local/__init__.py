"""The embedded backend: a table store in one SQLite file and the tunnel service over it.

URI ``local:///abs/path/store.db``. The public names: ``LocalTablestore`` (also importable as
``from connector.local import LocalTablestore``), ``ChannelRow`` and ``LocalTunnelService``.

The modules, one concern each (the store's side first, then the tunnel's):

- ``store``: ``LocalTablestore``, the row API (create_table, put/update/delete_row,
  batch_write, get_row, split/merge_channels, trim_history, change_log), its connection and
  transactions. Writer processes (the ``tablestore-cdc local`` CLI, demos, tests, the
  emulator's table API) call it; the tunnel service opens its own instance.
- ``schema``: the DDL of every table of the file, the tunnel's included.
- ``values``: type checks and the JSON encoding of values, key hash, sequence strings.
- ``rows``: validating and applying writes to ``cdc_rows``; row reads.
- ``channels``: key ranges, split, merge, trim.
- ``changelog``: appending and decoding change records (``cdc_changes``).
- ``segments``: sealing records into LZ4 Arrow segments; slicing them into pages.
- ``tunnels``: the tunnel's tables (tunnels, checkpoints, base data), tokens, channel status.
- ``service``: ``LocalTunnelService``, the ``TunnelService`` contract: on the Spark driver
  (planning, checkpoint pushes), on executors (reads), in the inspection CLI and the
  emulator's Tunnel API.

``LocalTunnelService`` is imported on first use: a writer process that only writes rows never
loads pyarrow, which only the read path and segment sealing need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connector.tunnel.local.channels import ChannelRow
from connector.tunnel.local.store import LocalTablestore

if TYPE_CHECKING:
    from connector.tunnel.local.service import LocalTunnelService

__all__ = ["ChannelRow", "LocalTablestore", "LocalTunnelService"]


def __getattr__(name: str) -> Any:
    if name == "LocalTunnelService":
        from connector.tunnel.local.service import LocalTunnelService

        return LocalTunnelService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
