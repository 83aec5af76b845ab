"""Positions after a batch: where every channel of a batch stands once the batch is read.

One rule, used by the driver's planner (``StreamProtocol.positions_after``: the next batch starts
there) and by the progress feed (``tablestore_cdc.feed.shapes.positions_after``: what the CLI and
the dashboard show): a channel's end checkpoint when its read recorded one, else its manifest
start (a channel not read in that batch, or not read yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from connector.tunnel import FINISHED
from meta_store import BatchRecord, ChannelStart, EndCheckpoint


@dataclass(frozen=True)
class Position:
    """Where a channel stands at the end of a batch (or the start of the next)."""

    token: str
    sequence_number: int
    last_sequence: str | None
    parent_ids: tuple[str, ...] = ()
    #: the Trigger.AvailableNow bound (µs) a read of the channel reached, carried from batch to
    #: batch (``ChannelStart.bound_reached_us``); None: none reached
    bound_reached_us: int | None = None

    @property
    def finished(self) -> bool:
        return self.token == FINISHED

    @classmethod
    def at_start(cls, start: ChannelStart) -> Position:
        """Where ``start`` (a manifest's or the tunnel's channel start) begins reading."""
        return cls(start.token, start.sequence_number, start.last_sequence, start.parent_ids,
                   start.bound_reached_us)

    @classmethod
    def at_end(cls, end: EndCheckpoint, start: ChannelStart | None = None) -> Position:
        """Where a read that recorded ``end`` stopped (``start``: the channel's manifest start,
        whose lineage carries over; and its reached bound, when this read reached none)."""
        parents = start.parent_ids if start is not None else ()
        reached = end.bound_reached_us
        if reached is None and start is not None:
            reached = start.bound_reached_us
        return cls(end.token, end.sequence_number, end.last_sequence, parents, reached)


def positions_after_batch(batch: BatchRecord, ends: Mapping[str, EndCheckpoint]
                          ) -> dict[str, Position]:
    """Every channel of ``batch``'s manifest (in manifest order) at the end of the batch: its
    end checkpoint in ``ends`` (the batch's, by channel id), or its manifest start for a channel
    that recorded none. A batch without a manifest has no positions."""
    positions: dict[str, Position] = {}
    for start in batch.manifest.channels if batch.manifest else ():
        end = ends.get(start.channel_id)
        positions[start.channel_id] = (Position.at_start(start) if end is None
                                       else Position.at_end(end, start))
    return positions
