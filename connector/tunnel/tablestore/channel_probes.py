"""Where a tunnel's channels stand, asked of the service with reads (driver).

The service reports no channel head and counts nothing ahead of a position, so both questions
the protocol asks on the driver are answered with ReadRecords from each channel's position:

- ``has_new_data`` (``latestOffset``): a one-record read of the first channel of the
  positions, before anything else (on a busy tunnel it says yes: one call); else one
  DescribeTunnel, then a one-record read per OPEN channel -- an idle query costs a few small
  reads per trigger instead of an empty Spark batch. The first OPEN channel is read alone, the
  others ``concurrency`` at a time, no more being sent after the first yes; a channel found to
  have records at the same position before is not read again.
- ``lag`` (progress report, read caps, ``minOffsetsPerTrigger``, ``tablestore-cdc meta lag``,
  the feed): one DescribeTunnel, then one ReadRecords per readable channel at its position.

``ChannelProbes`` belongs to one ``TablestoreTunnelService``, whose positions role
(``positions.py``) delegates both methods to it; it uses only the client's calls named in
``ProbedClient``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Protocol

from connector.errors import TrimmedDataError
from connector.tunnel.base import (
    FINISHED,
    ChannelLag,
    ChannelStatus,
    Checkpoint,
    ReadResult,
    TunnelDescription,
)
from connector.tunnel.tablestore.records import decode_page

if TYPE_CHECKING:
    from connector.tunnel.tablestore.reading import WireRecords

#: records ``lag`` asks for per channel (the service's page: it sends up to about 500 anyway)
LAG_PEEK_RECORDS = 500


class ProbedClient(Protocol):
    """What ``ChannelProbes`` calls on its client."""

    def names_of(self, tunnel_id: str) -> tuple[str, str]: ...
    def describe_tunnel(self, table: str, tunnel_name: str) -> TunnelDescription: ...
    def get_checkpoint(self, tunnel_id: str, channel_id: str) -> Checkpoint: ...
    def read_records(self, tunnel_id: str, channel_id: str, token: str,
                     limit: int) -> ReadResult: ...
    def fetch(self, tunnel_id: str, channel_id: str, token: str,
              limit: int) -> WireRecords | None: ...


class ChannelProbes:
    """``has_new_data`` and ``lag`` for one client (module docstring). Thread-safe."""

    def __init__(self, client: ProbedClient, concurrency: int) -> None:
        self._client = client
        self._concurrency = concurrency
        self._lock = threading.Lock()
        #: ``has_new_data``'s reads, ``concurrency`` at a time (made on first use)
        self._pool: ThreadPoolExecutor | None = None
        #: (tunnel id, channel id) -> a position a probe found records after: asked again at
        #: the same position, the answer is the same (records do not vanish; trimming is
        #: reported by the read), so the channel is not probed again
        self._has_data: dict[tuple[str, str], str] = {}

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def has_new_data(self, tunnel_id: str, positions: Mapping[str, str]) -> bool:
        """True when a channel is missing from ``positions``, returns a record, or reads to
        ``"finished"``; a trimmed position also counts (the batch reports it). An error is
        raised only when no channel says yes (the first in channel order)."""
        if any(self._has_data.get((tunnel_id, ch)) == token for ch, token in positions.items()):
            return True  # found to have records at this very position before
        # a busy tunnel: the first channel read tells, before the channel list is asked for
        first = next(((ch, token) for ch, token in positions.items() if token != FINISHED),
                     None)
        if first is not None:
            try:
                if self._probe(tunnel_id, *first):
                    return True
            except Exception:  # noqa: BLE001 - asked again below if the channel is OPEN
                first = None
        probes: list[tuple[str, str]] = []
        for channel in self._client.describe_tunnel(*self._client.names_of(tunnel_id)).channels:
            if channel.status is not ChannelStatus.OPEN:
                continue
            token = positions.get(channel.channel_id)
            if token is None or self._has_data.get((tunnel_id, channel.channel_id)) == token:
                return True
            if token != FINISHED and (channel.channel_id, token) != first:
                probes.append((channel.channel_id, token))
        if len(probes) < 3 or self._concurrency < 2:  # one after another
            return any(self._probe(tunnel_id, ch, token) for ch, token in probes)
        if self._probe(tunnel_id, *probes[0]):  # the first OPEN channel alone, then the rest
            return True
        probes = probes[1:]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._concurrency,
                                                thread_name_prefix="tablestore-probe")
            pool = self._pool
        futures = {pool.submit(self._probe, tunnel_id, ch, token): ch for ch, token in probes}
        errors: dict[str, BaseException] = {}
        try:
            for future in as_completed(futures):
                error = future.exception()
                if error is not None:
                    errors[futures[future]] = error
                elif future.result():
                    return True
        finally:
            for future in futures:
                future.cancel()  # not sent yet: not needed any more
        if errors:
            raise errors[min(errors)]
        return False

    def _probe(self, tunnel_id: str, channel_id: str, token: str) -> bool:
        """Does a one-record read from ``token`` find a record or ``"finished"``?"""
        try:
            result = self._client.read_records(tunnel_id, channel_id, token, 1)
        except TrimmedDataError:
            return True
        if result.records or result.next_token == FINISHED:
            self._has_data[(tunnel_id, channel_id)] = token
            return True
        return False

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag]:
        """How far ``positions`` (else the pushed checkpoints) are behind, per channel not
        TERMINATED, from what the service reports: one DescribeTunnel, then one ReadRecords
        per readable channel at its position (the page the service sends anyway; only its
        first record is decoded).

        - ``seconds_behind``: 0 when the read shows the channel caught up (``may_more`` false,
          or an empty page whose token did not move; ``"finished"``), else the age of the
          first unread change (now minus its commit time). A caught-up channel shows 0, not a
          clock growing since its last change. (The service's ``channel_rpo`` is the commit
          time of the last change before the *pushed* checkpoint: it trails the source's own
          position by up to ``commitInterval`` batches and grows while a channel is idle, so
          it is not used for this figure.)
        - ``records_behind``: exact when that page holds everything readable now
          (``may_more`` false); else the page's records, a lower bound (``exact`` false): the
          service does not count what is ahead, and reading further would cost a read per
          page of backlog on every measurement.
        - A WAIT channel cannot be read until its parents end (the service refuses the read,
          and the real service does not even name its parents): counted as what can be known,
          0 records and 0 s, a lower bound; so is a position whose records were trimmed, or an
          empty page that still says more may follow."""
        client = self._client
        now_us = time.time_ns() // 1000
        out: dict[str, ChannelLag] = {}
        for channel in client.describe_tunnel(*client.names_of(tunnel_id)).channels:
            ch = channel.channel_id
            if channel.status is ChannelStatus.TERMINATED:
                continue
            if channel.status is ChannelStatus.WAIT:
                out[ch] = ChannelLag.nothing_readable(ch)
                continue
            token = positions.get(ch) or client.get_checkpoint(tunnel_id, ch).token
            if token == FINISHED:
                out[ch] = ChannelLag(ch, 0, 0.0)
                continue
            try:
                fetched = client.fetch(tunnel_id, ch, token, LAG_PEEK_RECORDS)
            except TrimmedDataError:
                out[ch] = ChannelLag.nothing_readable(ch)
                continue
            assert fetched is not None
            if not fetched.records:
                caught_up = fetched.next_token == token or not fetched.may_more
                out[ch] = ChannelLag(ch, 0, 0.0) if caught_up else ChannelLag.nothing_readable(ch)
                continue
            oldest = decode_page(fetched.records[:1], ch, token,
                                 fetched.first_offset)[0].commit_ts_us
            out[ch] = ChannelLag(ch, len(fetched.records), max(0.0, (now_us - oldest) / 1e6),
                                 exact=not fetched.may_more)
        return out


__all__ = ["LAG_PEEK_RECORDS", "ChannelProbes", "ProbedClient"]
