"""The channel tracker: which channels the next batch reads (the driver's split tracker).

In the role of Flink's ``SplitTracker``: it follows the channels' lineage through the tunnel and
lets a channel into a batch only once the tunnel releases it. ``ChannelTracker`` is owned by
``StreamProtocol`` in Spark's planning process on the driver. It

- discovers channels: when a refresh is due (``channelRefreshIntervalMs`` elapsed; at once on a
  process's first plan, after a push that finished a channel, and at an AvailableNow start) it
  describes the tunnel and adds every OPEN channel not yet tracked, from its pushed checkpoint.
  The tunnel keeps a child in WAIT until all its parents' FINISHED checkpoints are pushed, so
  children join only after their parents are read to the end;
- keeps a finished channel (token FINISHED) until the tunnel reports it TERMINATED, so it is never
  planned again from a stale pushed checkpoint; then it leaves the manifests;
- notes the parents that waiting children depend on (``waiting_parents``): the read limits give
  each of them a share, since reading a parent to its end releases its children;
- holds the ``Trigger.AvailableNow`` bound (every channel's newest record when the run started)
  and says when the run is done.

The decisions are the pure functions below; the class adds the tunnel calls and the timing.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from connector.options import SourceOptions
from connector.planning.positions import Position
from connector.tunnel import ChannelInfo, ChannelStatus, TunnelService
from meta_store import ChannelStart


def waiting_parents_of(channels: Iterable[ChannelInfo]) -> set[str] | None:
    """The parents that WAIT channels depend on; ``None`` when a waiting channel names none
    (the real Tablestore service holds children in WAIT without naming their parents)."""
    waiting = [c for c in channels if c.status is ChannelStatus.WAIT]
    if any(not c.parent_ids for c in waiting):
        return None
    return {p for c in waiting for p in c.parent_ids}


def terminated_finished(positions: Mapping[str, Position],
                        statuses: Mapping[str, ChannelStatus]) -> list[str]:
    """Channels carried as finished whose FINISHED push the tunnel confirms (TERMINATED): they
    leave the manifests."""
    return [ch for ch, p in positions.items()
            if p.finished and statuses.get(ch) is ChannelStatus.TERMINATED]


@dataclass(frozen=True)
class AvailableNowCheck:
    """Where an AvailableNow run stands after a batch."""

    #: every channel reached its bound: ``latestOffset`` returns its start (the run ends)
    done: bool
    #: a channel read to its end is not TERMINATED yet: push at once, so its children (which the
    #: run reads too, when they existed at its start) are released
    release: bool


def available_now_check(targets: Mapping[str, str], positions: Mapping[str, Position],
                        terminated: Collection[str]) -> AvailableNowCheck:
    """Is an AvailableNow run with bounds ``targets`` (channel id -> the newest sequence when
    the run started; empty: the channel had nothing) done at ``positions``? A channel not read
    yet is done only if it had nothing or is already ``terminated``; a finished channel is done
    (and asks for a ``release`` while not terminated); any other is done once its last sequence
    reached its bound. Channels are looked at in ``targets`` order, and the first one not done
    ends the look (a ``release`` asked for before it stands)."""
    release = False
    for channel_id, target in targets.items():
        position = positions.get(channel_id)
        if position is None:
            if target and channel_id not in terminated:
                return AvailableNowCheck(done=False, release=release)
            continue
        if position.finished:
            release = release or channel_id not in terminated
            continue
        if target and (position.last_sequence or "") < target:
            return AvailableNowCheck(done=False, release=release)
    return AvailableNowCheck(done=True, release=release)


class ChannelTracker:
    """Channel discovery, lineage and the AvailableNow bound of one query (driver only)."""

    def __init__(self, tunnel: TunnelService, options: SourceOptions, tunnel_id: str) -> None:
        self._tunnel = tunnel
        self._options = options
        self._tunnel_id = tunnel_id
        self._last_refresh = 0.0
        self._refresh_now = True  # a process's first plan refreshes
        #: from the last refresh: parents of channels waiting for them (a finished parent needs
        #: a share of the read limit to reach FINISHED), or None when the tunnel holds waiting
        #: channels without naming their parents
        self.waiting_parents: set[str] | None = set()
        #: AvailableNow: every channel's newest sequence when the run started (None: not such
        #: a run)
        self.available_now_targets: dict[str, str] | None = None

    def request_refresh(self) -> None:
        """Refresh at the next plan (a FINISHED push released children: they join at once)."""
        self._refresh_now = True

    def _refresh_due(self) -> bool:
        interval_s = self._options.channel_refresh_interval_ms / 1000
        return self._refresh_now or time.monotonic() - self._last_refresh >= interval_s

    def _channels(self) -> tuple[ChannelInfo, ...]:
        return self._tunnel.describe_tunnel(self._options.table_name,
                                            self._options.tunnel_name).channels

    def starts(self, exclude: Collection[str],
               channels: Iterable[ChannelInfo] | None = None) -> list[ChannelStart]:
        """Readable channels the tunnel offers that are not in ``exclude``, with their pushed
        checkpoints (``channels``: the tunnel's, described now when not given). Only OPEN
        channels whose pushed checkpoint is not FINISHED."""
        starts = []
        for c in self._channels() if channels is None else channels:
            if c.channel_id in exclude or c.status is not ChannelStatus.OPEN:
                continue
            checkpoint = self._tunnel.get_checkpoint(self._tunnel_id, c.channel_id)
            if checkpoint.finished:
                continue
            starts.append(ChannelStart(
                channel_id=c.channel_id, token=checkpoint.token,
                sequence_number=checkpoint.sequence_number,
                max_records=self._options.max_offsets_per_channel, parent_ids=c.parent_ids,
            ))
        return starts

    def refresh(self, positions: dict[str, Position]) -> list[str]:
        """Bring ``positions`` (the positions a new batch starts from) up to date with the
        tunnel when a refresh is due: terminated channels leave, released children join
        (under AvailableNow only those that existed when the run started). Changes
        ``positions`` in place; returns the channels added."""
        if not self._refresh_due():
            return []
        channels = self._channels()
        statuses = {c.channel_id: c.status for c in channels}
        self.waiting_parents = waiting_parents_of(channels)
        for channel_id in terminated_finished(positions, statuses):
            del positions[channel_id]
        added = []
        for start in self.starts(exclude=set(positions), channels=channels):
            positions[start.channel_id] = Position.at_start(start)
            added.append(start.channel_id)
        self._last_refresh = time.monotonic()
        self._refresh_now = False
        targets = self.available_now_targets
        if targets is not None:  # AvailableNow: channels born after the run started wait
            for channel_id in added:
                if channel_id not in targets:
                    del positions[channel_id]
            added = [c for c in added if c in targets]
        return added

    # --- Trigger.AvailableNow -------------------------------------------------------------------

    def prepare_available_now(self) -> None:
        """Fix the stopping point: every channel's newest record now. Channels created later
        are not read; channels that exist now (even waiting children) are read up to it."""
        heads = self._tunnel.head_sequences(self._tunnel_id)
        if heads is None:
            raise NotImplementedError(
                f"the tunnel backend of {self._options.safe_endpoint} cannot report channel "
                "heads, so Trigger.AvailableNow is not supported for it"
            )
        self.available_now_targets = heads
        self._refresh_now = True

    @property
    def available_now(self) -> bool:
        return self.available_now_targets is not None

    def stop_after(self, channel_id: str) -> str | None:
        """AvailableNow: the sequence a read of ``channel_id`` stops after (None: no bound)."""
        if self.available_now_targets is None:
            return None
        return self.available_now_targets.get(channel_id)

    def available_now_check(self, positions: Mapping[str, Position]) -> AvailableNowCheck:
        """``available_now_check`` at ``positions``, with the tunnel's TERMINATED channels."""
        terminated = {c.channel_id for c in self._channels()
                      if c.status is ChannelStatus.TERMINATED}
        return available_now_check(self.available_now_targets or {}, positions, terminated)
