"""What every route handler of the emulator gets, and the shape of a handler.

The server (``server.py``) builds one ``EmulatorContext`` per started emulator and dispatches
each authenticated request to a ``Handler`` from the route modules (``table_api.py``,
``tunnel_api.py``). Both sides import this module; the route modules never import the server,
so the server can import them plainly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connector.tunnel.local import LocalTablestore


@dataclass
class EmulatorContext:
    """What every route handler gets: the store, the instance, shared state.

    ``state`` is a free dict for API modules that keep in-memory state across requests (keyed by
    module name, e.g. ``state["tunnel"]``); guard it with ``lock``.
    """

    store: LocalTablestore
    instance: str
    write_lock: threading.RLock = field(default_factory=threading.RLock)
    lock: threading.RLock = field(default_factory=threading.RLock)
    state: dict[str, Any] = field(default_factory=dict)
    #: Change-log channels a table gets at CreateTable.
    channels: int = 4
    #: Row cap of one GetRange page (the service's is 5000; tests lower it).
    range_page_rows: int = 5000


#: A route: the request's protobuf bytes (already authenticated) -> the response's; raises
#: ``errors.OtsError`` for a service error.
Handler = Callable[[EmulatorContext, bytes], bytes]
