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
- holds the ``Trigger.AvailableNow`` bound (``AvailableNowBound``: the instant the run was
  prepared, with every channel's newest record then where the backend reports heads) and says
  when the run is done.

The decisions are the pure functions below; the class adds the tunnel calls and the timing.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from connector.options import SourceOptions
from connector.planning.logs import log
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
class AvailableNowBound:
    """Where one Trigger.AvailableNow run stops (``prepareForTriggerAvailableNow``).

    ``at_us`` is the instant the trigger was prepared (microseconds since the epoch): the run's
    identity, recorded in every manifest it plans and every claim that reaches it, and the
    commit time a channel's reads stop after. ``heads`` holds, where the backend reports them
    (the embedded store, DynamoDB Streams), each channel's newest sequence at that instant
    (``""``: none): such a channel stops after its head instead, and channels born after the
    instant are left for the next run. Without heads (Tablestore, or a run resumed after a
    restart) every channel stops at ``at_us``: a channel born later holds only later changes.
    """

    at_us: int
    heads: Mapping[str, str] | None = None

    def covers(self, channel_id: str) -> bool:
        """Does the run read ``channel_id`` at all?"""
        return self.heads is None or channel_id in self.heads

    def head(self, channel_id: str) -> str | None:
        """The sequence a read of ``channel_id`` stops after (None: stop by commit time)."""
        return None if self.heads is None else self.heads.get(channel_id)

    def reached(self, channel_id: str, position: Position) -> bool:
        """Has ``position`` consumed everything the run reads of ``channel_id``?"""
        if position.finished or position.bound_reached_us == self.at_us:
            return True
        head = self.head(channel_id)
        return head is not None and (head == "" or (position.last_sequence or "") >= head)


@dataclass(frozen=True)
class AvailableNowCheck:
    """Where an AvailableNow run stands after a batch."""

    #: every channel reached the bound: ``latestOffset`` returns its start (the run ends)
    done: bool
    #: a channel read to its end is not TERMINATED yet: push at once, so its children are
    #: released (and, when they hold changes before the bound, read in this run)
    release: bool
    #: the tunnel offers a channel the positions do not hold yet (a child released during the
    #: run): refresh the channel list at the next plan
    untracked: bool = False


def available_now_check(bound: AvailableNowBound, positions: Mapping[str, Position],
                        channels: Iterable[ChannelInfo]) -> AvailableNowCheck:
    """Is the run bounded by ``bound`` done at ``positions``, given the tunnel's ``channels``
    now? Done when every tracked channel the run covers reached the bound
    (``AvailableNowBound.reached``), no finished channel waits for the push that releases its
    children, and the tunnel offers no channel the run would still read: an OPEN one not
    tracked, or (with heads) one that existed at the start with changes and is not TERMINATED.
    A WAIT channel without a head waits for parents that stopped at the bound: its changes
    come after it."""
    statuses = {c.channel_id: c.status for c in channels}
    release = any(p.finished and statuses.get(ch) is not ChannelStatus.TERMINATED
                  for ch, p in positions.items())
    pending = [ch for ch, p in positions.items()
               if bound.covers(ch) and not bound.reached(ch, p)]
    untracked = False
    for channel_id, status in statuses.items():
        if channel_id in positions or not bound.covers(channel_id) or bound.head(channel_id) == "":
            continue  # tracked, left for the next run, or had nothing at the start
        if status is ChannelStatus.OPEN:
            untracked = True
        elif status is ChannelStatus.WAIT and bound.head(channel_id):
            pending.append(channel_id)  # existed with changes at the start: its parents end
    done = not pending and not untracked and not release
    return AvailableNowCheck(done=done, release=release, untracked=untracked)


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
        #: Trigger.AvailableNow: the bound prepared by this process (None: not such a run),
        #: and the bound the run follows, once settled by its first batch (``bound_for``)
        self._prepared: AvailableNowBound | None = None
        self.bound: AvailableNowBound | None = None

    def request_refresh(self) -> None:
        """Refresh at the next plan (a FINISHED push released children: they join at once)."""
        self._refresh_now = True

    def _refresh_due(self) -> bool:
        interval_s = self._options.channel_refresh_interval_ms / 1000
        return self._refresh_now or time.monotonic() - self._last_refresh >= interval_s

    def _channels(self) -> tuple[ChannelInfo, ...]:
        return self._tunnel.describe_tunnel(self._options.table_name,
                                            self._options.named_tunnel).channels

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
            # AvailableNow with heads: channels born after the start wait for the next run
            if self.bound is None or self.bound.covers(start.channel_id):
                positions[start.channel_id] = Position.at_start(start)
                added.append(start.channel_id)
        self._last_refresh = time.monotonic()
        self._refresh_now = False
        return added

    # --- Trigger.AvailableNow -------------------------------------------------------------------

    def prepare_available_now(self, now_us: int) -> None:
        """``prepareForTriggerAvailableNow`` at ``now_us``: fix the run's bound there, with
        every channel's newest sequence now where the backend reports heads. Which bound the
        run follows is settled at its first batch (``bound_for``): a restart of a run killed
        before it finished goes on to that run's bound."""
        self._prepared = AvailableNowBound(now_us, self._tunnel.head_sequences(self._tunnel_id))
        self.bound = None
        self._refresh_now = True

    @property
    def available_now(self) -> bool:
        return self._prepared is not None

    def bound_for(self, previous_us: int | None,
                  positions: Mapping[str, Position]) -> AvailableNowBound:
        """The bound of this AvailableNow run, settled on first use: the bound ``previous_us``
        of the batch the run starts from when that run did not finish (a restart goes on to
        the same bound), else the one just prepared."""
        assert self._prepared is not None, "not a Trigger.AvailableNow run"
        if self.bound is None:
            bound = self._prepared
            if previous_us is not None and previous_us != bound.at_us:
                earlier = AvailableNowBound(previous_us)
                if not available_now_check(earlier, positions, self._channels()).done:
                    log.info("Trigger.AvailableNow: resuming the run prepared at %s, which did "
                             "not finish: reading to its bound", _iso_us(previous_us))
                    bound = earlier
            if bound is self._prepared:
                log.info("Trigger.AvailableNow: reading every change committed by %s (%s)",
                         _iso_us(bound.at_us), "channel heads" if bound.heads is not None
                         else "commit times")
            self.bound = bound
        return self.bound

    def head(self, at_us: int, channel_id: str) -> str | None:
        """The head sequence a read of ``channel_id`` stops after under the bound ``at_us``
        (None: stop by commit time; heads are known only for the bound prepared here)."""
        if self.bound is None or self.bound.at_us != at_us:
            return None
        return self.bound.head(channel_id)

    def available_now_check(self, bound: AvailableNowBound,
                            positions: Mapping[str, Position]) -> AvailableNowCheck:
        """``available_now_check`` at ``positions``, with the tunnel's channels now; a channel
        released and not tracked yet joins at the next plan."""
        check = available_now_check(bound, positions, self._channels())
        if check.untracked:
            self._refresh_now = True
        return check


def _iso_us(micros: int) -> str:
    return dt.datetime.fromtimestamp(micros / 1e6, dt.UTC).isoformat(timespec="milliseconds")
