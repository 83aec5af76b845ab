"""Read limits: whether a batch runs now, and how much each channel of it may read (pure).

How the limits compose. PySpark hands a Python source one ``ReadLimit`` per trigger and has no
composite limit, so ``getDefaultReadLimit`` returns the most telling one configured
(``ReadMaxRows``, else ``ReadMaxBytes``, else ``ReadMinRows``, else ``ReadAllAvailable``) and
Spark passes it back to ``latestOffset`` on every trigger, Trigger.AvailableNow included
(tests/test_source_spark.py checks what Spark passes). ``trigger_limits`` turns what Spark passed
into ``TriggerLimits``: ``ReadAllAvailable`` (Trigger.Once, or no limit configured) means no
limit at all, whatever the options say; any other limit means the source applies every limit
configured, Spark's value standing for its own kind:

- ``minOffsetsPerTrigger`` + ``maxTriggerDelay`` (``holds_back``): no batch while fewer records
  wait and the delay since the last batch was planned has not passed (Kafka's meaning; the
  delay is kept here, ``ReadMinRows`` has no field for it). Not under Trigger.AvailableNow,
  which must end (``ReadMinRows``' contract).
- ``maxOffsetsPerTrigger`` (``read_caps``): the batch's records, shared among the channels by
  their backlog, each also under ``maxOffsetsPerChannel``.
- ``maxBytesPerTrigger`` (``byte_budgets``): the batch's bytes, shared among the channels with a
  record cap; each read stops once its share is taken (the last record may cross it).

``StreamProtocol`` calls these on the driver. The record caps and byte budgets go into the
batch's manifest (and the totals into the offset Spark logs), so a replay reads them from there
and never computes them again. Inputs and outputs are plain (channel ids, backlog figures, the
parents waiting children depend on, the batch UUID that sets the rotation), so the rules are
tested without a tunnel.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TriggerLimits:
    """The limits one ``latestOffset`` applies (``None``: no such limit)."""

    max_rows: int | None = None
    max_bytes: int | None = None
    min_rows: int | None = None
    #: ``maxTriggerDelay`` in seconds: how long ``min_rows`` may hold a batch back
    max_delay_s: float | None = None


def trigger_limits(options: Any, *, all_available: bool, max_rows: int | None = None,
                   max_bytes: int | None = None, min_rows: int | None = None) -> TriggerLimits:
    """The limits of a trigger: none when Spark passed ``ReadAllAvailable``
    (``all_available``), else every limit ``options`` (``SourceOptions``) configures, the value
    Spark passed replacing the option of its kind."""
    if all_available:
        return TriggerLimits()
    min_rows = min_rows or options.min_offsets_per_trigger
    return TriggerLimits(
        max_rows=max_rows or options.max_offsets_per_trigger,
        max_bytes=max_bytes or options.max_bytes_per_trigger,
        min_rows=min_rows,
        max_delay_s=options.max_trigger_delay_ms / 1000 if min_rows else None,
    )


def holds_back(min_rows: int, available: int | None, waited_s: float,
               max_delay_s: float) -> bool:
    """``minOffsetsPerTrigger``: hold the next batch back? Only while fewer than ``min_rows``
    records are known to wait (``available``; ``None``: the backend cannot tell, and a batch
    is not held back for records nobody can count) and the last batch was planned less than
    ``max_delay_s`` ago (``waited_s``)."""
    if waited_s >= max_delay_s or available is None:
        return False
    return available < min_rows


def byte_budgets(caps: Mapping[str, int], *, max_bytes: int, batch_uuid: str,
                 backlog: Mapping[str, int | None] | None) -> dict[str, int]:
    """Per-channel byte budgets of ``maxBytesPerTrigger`` (``max_bytes``) among the channels
    that have a record cap (``caps``). A channel known to be caught up (``backlog`` 0) asks
    for one byte (enough for the one record that may arrive: the last record may cross a
    budget); the others share the rest max-min fairly, remainders rotating with the batch
    UUID. Channels without a record cap, or left with no byte (``max_bytes`` smaller than the
    number of channels), get 0: they are not read in this batch."""
    reading = sorted(ch for ch, cap in caps.items() if cap > 0)
    if not reading:
        return {}
    rotated = rotation(reading, batch_uuid)
    asks = {ch: 1 if backlog is not None and backlog.get(ch) == 0 else max_bytes
            for ch in rotated}
    return share(max_bytes, asks)


def rotation(channels: Sequence[str], batch_uuid: str) -> list[str]:
    """``channels`` starting at a place derived from ``batch_uuid``: ties and remainders go to
    the first ones, so the rotation keeps any channel from always coming last."""
    offset = uuid.UUID(batch_uuid).int % len(channels)
    return [*channels[offset:], *channels[:offset]]


def share(total: int, asks: Mapping[str, int]) -> dict[str, int]:
    """Split ``total`` max-min fairly: no channel gets more than it asks for, and none gets
    less than an equal share unless it asked for less. ``asks`` is in rotation order: when a
    share does not divide evenly, the first channels get the extra unit."""
    caps = dict.fromkeys(asks, 0)
    left = total
    hungry = [ch for ch, ask in asks.items() if ask > 0]
    while hungry and left > 0:
        each = left // len(hungry)
        if each == 0:
            for ch in hungry[:left]:
                caps[ch] += 1
            break
        for ch in hungry:
            give = min(each, asks[ch] - caps[ch])
            caps[ch] += give
            left -= give
        still = [ch for ch in hungry if caps[ch] < asks[ch]]
        if len(still) == len(hungry):  # nobody was satisfied: only the remainder is left
            for ch in still[:left]:
                caps[ch] += 1
            break
        hungry = still
    return caps


def read_caps(channels: Collection[str], *, per_channel: int, max_rows: int | None,
              batch_uuid: str, backlog: Mapping[str, int | None] | None,
              waiting_parents: Collection[str] | None) -> dict[str, int]:
    """Per-channel record caps of the unfinished ``channels`` of batch ``batch_uuid``:
    ``per_channel`` (``maxOffsetsPerChannel``), and a ``max_rows`` total (``ReadMaxRows``)
    given where the data is.

    Each channel asks for its backlog (``backlog``: records behind, from the tunnel's ``lag``;
    a channel missing there or with ``None`` asks for ``per_channel``); a parent in
    ``waiting_parents`` asks for at least one, since reading it to its end releases its
    children (``None``: the tunnel holds waiting channels without naming their parents, so the
    first channel in rotation order asks for at least one). The total is shared max-min fairly
    among the asks, and what is left over is spread evenly, so records that arrive between
    planning and reading are still read. Without backlog figures (``backlog`` is ``None``) the
    total is split evenly. Ties and remainders rotate with the batch UUID so no channel starves.
    """
    active = sorted(channels)
    if max_rows is None or not active:
        return dict.fromkeys(active, per_channel)
    rotated = rotation(active, batch_uuid)
    if backlog is None:  # the backend cannot tell: an even split
        return share(max_rows, dict.fromkeys(rotated, per_channel))
    asks = {ch: per_channel if (behind := backlog.get(ch)) is None else min(per_channel, behind)
            for ch in rotated}
    parents = rotated[:1] if waiting_parents is None else [c for c in rotated
                                                           if c in waiting_parents]
    for ch in parents:
        asks[ch] = max(asks[ch], 1)  # parents' ends release children
    caps = share(max_rows, asks)
    left = max_rows - sum(caps.values())
    if left > 0:
        extra = share(left, {ch: per_channel - caps[ch] for ch in rotated})
        caps = {ch: caps[ch] + extra[ch] for ch in rotated}
    return caps
