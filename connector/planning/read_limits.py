"""Read limits: how many records each channel of a new batch may read (pure functions).

``StreamProtocol`` calls ``read_caps`` on the driver when it plans a batch for the first time. The
caps go into the batch's manifest, so a replay reads them from there and never computes them
again. Inputs and outputs are plain (channel ids, backlog figures, the parents waiting children
depend on, the batch UUID that sets the rotation), so the rules are tested without a tunnel.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence


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
    asks = {}
    for ch in rotated:
        behind = backlog.get(ch)
        asks[ch] = per_channel if behind is None else min(per_channel, behind)
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
