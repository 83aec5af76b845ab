"""Read-ahead of a channel's next page (executors; ``TablestoreTunnelService.read_page``).

When a page says more records follow, the client sends the request for the next page (its
``next_token``, the same limit) before it decodes this one (``Transport.send``: on a connection
of its own, no thread), so the service prepares it while this process decodes and hands the
page on. ``PrefetchedReads`` holds those requests, one per channel. The next read of that
channel takes the answer when it asks for the same request -- or for a lower limit the answer
does not exceed, since a page shorter than asked is an answer the service may always give --
and sends its own request otherwise (another token, a page longer than the new limit, a
request sent more than ``PREFETCH_MAX_AGE_S`` ago; a prefetch that failed is done again as a
plain call, so its error is the caller's own). So a caller gets exactly the answers it asked
for, whatever was prefetched: a page requested past a batch's end is held unread (at most
``PREFETCH_HELD`` per client, the oldest dropped, each one kept-alive connection) and never
handed out unless a later read asks for it. ``prefetch=false`` in the endpoint's query (the
source option ``read.prefetch``) switches it off.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from connector.tunnel.tablestore.transport import PendingCall

#: prefetched requests a client holds (one per channel, each on its own connection; the
#: oldest is dropped first)
PREFETCH_HELD = 8
#: a prefetched answer older than this is not used: a fresh read may hold more records
PREFETCH_MAX_AGE_S = 5.0


@dataclass(frozen=True)
class Prefetch:
    """A ReadRecords request sent ahead for one channel, its answer not read yet."""

    page_token: str
    started: float
    answer: PendingCall


class PrefetchedReads:
    """The requests one client sent ahead, by (tunnel id, channel id). Thread-safe."""

    def __init__(self) -> None:
        self._held: OrderedDict[tuple[str, str], Prefetch] = OrderedDict()
        self._lock = threading.Lock()
        #: prefetched answers used / sent and not used (tests and benchmarks read them)
        self.stats = {"used": 0, "unused": 0}

    def take(self, key: tuple[str, str], page_token: str) -> Prefetch | None:
        """The channel's prefetched request when it reads from ``page_token`` and is fresh;
        any other prefetch of the channel is dropped."""
        with self._lock:
            held = self._held.pop(key, None)
        if held is None:
            return None
        if held.page_token == page_token and \
                time.monotonic() - held.started <= PREFETCH_MAX_AGE_S:
            return held
        self._drop([held])
        return None

    def hold(self, key: tuple[str, str], page_token: str, answer: PendingCall) -> None:
        """Keep ``answer``, the request for the page at ``page_token``, for the read that asks
        for it; the channel's older one, and the oldest past ``PREFETCH_HELD``, are dropped."""
        with self._lock:
            old = self._held.pop(key, None)
            self._held[key] = Prefetch(page_token, time.monotonic(), answer)
            dropped = [old] if old is not None else []
            while len(self._held) > PREFETCH_HELD:
                dropped.append(self._held.popitem(last=False)[1])
        self._drop(dropped)

    def close(self) -> None:
        """Drop every held request (their connections are closed, not reused)."""
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        for prefetch in held:
            prefetch.answer.discard()

    def _drop(self, dropped: list[Prefetch]) -> None:
        for held in dropped:
            held.answer.discard()
            self.stats["unused"] += 1


__all__ = ["PREFETCH_HELD", "PREFETCH_MAX_AGE_S", "Prefetch", "PrefetchedReads"]
