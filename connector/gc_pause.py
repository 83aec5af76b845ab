"""Pause Python's cyclic garbage collector around one bulk build of records (executor, writer).

Behaviour is unchanged: the objects built (a page of records, an Arrow batch) form no cycles and
reference counting frees them as before. Only the collector runs less often: it starts a
collection every few hundred container allocations and, every so often, a full one over every
live object; a reader that held a large partition as ``Record`` objects spent about a third of
its time there (docs/performance.md).

Off the hot path since reads are columnar (``connector.tunnel.page``): the local store's sealed
segments make no Python object per record. Still used where records are converted: the local
store decoding a page of records (the unsealed tail, base data, sealing a segment).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collector off for the block; restores the previous state (a caller that disabled the
    collector keeps it disabled)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
