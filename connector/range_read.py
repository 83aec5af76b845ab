"""Bounded batch reads: ``spark.read.format("tablestore")`` over a time range.

``spark.read.format("tablestore").option("startingTimestamp", T0).option("endingTimestamp", T1)``
returns exactly the changes committed in ``[T0, T1)``, one partition per channel -- for
backfills and audits. The rows have the streaming output's schema; within a partition they are
in ``_sequence`` order, and partitions are listed parents before children, so per key the
changes of a parent come before those of its children (across channels, order by
``_commit_ts``; within one, by ``_sequence``).

Which tunnel it reads through. A range read must not disturb a streaming query: it never reads
through ``tunnel.name``'s tunnel, never pushes a checkpoint there and writes nothing to the meta
store. Not every backend can read a channel without a tunnel (Tablestore serves change records
only through tunnels, and holds a child channel back until its parents' ends are pushed), so
the read creates a **dedicated tunnel** of its own, ``<tunnel.name>-range-<time>-<id>``, started
at ``T0`` where the backend can (``TunnelService.create_tunnel(start_at_us=...)``), and reads
every channel through it. Dedicated tunnels older than ``RANGE_TUNNEL_RETENTION_S`` are deleted
by the next range read of the table (Spark does not tell a reader when its job is done).

Who calls what:
- ``TablestoreRangeReader.partitions`` runs on the driver (Spark's planning process): it creates
  the dedicated tunnel and lists its channels with their start checkpoints, parents first;
- ``TablestoreRangeReader.read`` runs on executors, one channel each (``read_range``).

Clients come from the seam (``connector.clients``), retried as every client of the source:
the driver opens one for the planning, each executor takes its process's pooled one.

Lineage through the dedicated tunnel. A child channel can hold changes in the range only when
its parents ended inside it: a parent with a change at or after ``T1`` split after ``T1``, and
so did one that is still open. So the task of a channel that reads to its end (``FINISHED``)
pushes that end to the dedicated tunnel, which releases its children; the task of a channel
that stops at ``T1`` (or finds nothing more) pushes where it stopped as a marker. A child's task
waits until it is released (then reads) or until a parent left such a marker (then it holds
nothing in the range). Spark launches a stage's tasks in partition order, so with parents listed
first the lowest unfinished task always runs: no task waits for one that cannot start. A
service that does not name a child's parents (the real Tablestore) leaves its task only the
release to wait for; it gives up after ``RANGE_WAIT_S`` with an error saying so.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from connector.clients import Clients, executor_clients
from connector.errors import OptionError, RangeReadError, TrimmedDataError
from connector.options import SourceOptions
from connector.reader import resume_after_trim
from connector.schema import RecordBatchBuilder, check_user_schema, output_schema
from connector.stop_rule import MAX_EMPTY_PAGES, PAGE_SIZE, commit_micros, leading_count
from connector.tunnel import (
    FINISHED,
    ChannelInfo,
    ChannelStatus,
    Checkpoint,
    StartPosition,
    TunnelAdministration,
    TunnelEndpoint,
    TunnelService,
    TunnelType,
)
from connector.tunnel.page import Page, PageLayout

log = logging.getLogger("connector.range_read")

#: dedicated tunnels of range reads are deleted by a later range read once this old
RANGE_TUNNEL_RETENTION_S = 24 * 3600.0
#: how long a child channel's task waits for its parents' tasks
RANGE_WAIT_S = 600.0
#: sequence numbers of the pushes a range read makes to its dedicated tunnel
MARKER_SEQUENCE, FINISHED_SEQUENCE = 1, 2
_RANGE_INFIX = "-range-"


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One channel of a range read (built on the driver, read on an executor): plain data."""

    #: the typed endpoint (its credentials ``SecretStr``): kept out of the repr
    endpoint: TunnelEndpoint = field(repr=False)
    table: str
    tunnel_name: str
    tunnel_id: str
    channel_id: str
    start_token: str
    #: the channel's parents where the backend names them (empty: none, or not named)
    parent_ids: tuple[str, ...]
    #: the channel was waiting for its parents when the read was planned
    waiting: bool
    start_us: int
    end_us: int
    fail_on_data_loss: bool


def range_tunnel_name(prefix: str, now: float) -> str:
    """The name of a range read's dedicated tunnel: ``<prefix>-range-<UTC time>-<id>``."""
    stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{prefix}{_RANGE_INFIX}{stamp}-{uuid.uuid4().hex[:8]}"


def parents_first(channels: Sequence[ChannelInfo]) -> list[ChannelInfo]:
    """``channels`` with every channel after the parents it names (ties by channel id), and
    the waiting channels that name none after all the others."""
    by_id = {c.channel_id: c for c in channels}
    ordered: list[ChannelInfo] = []
    placed: set[str] = set()

    def place(channel: ChannelInfo) -> None:
        if channel.channel_id in placed:
            return
        placed.add(channel.channel_id)
        for parent in sorted(channel.parent_ids):
            if parent in by_id:
                place(by_id[parent])
        ordered.append(channel)

    unnamed = [c for c in channels if c.status is ChannelStatus.WAIT and not c.parent_ids]
    for channel in sorted(channels, key=lambda c: c.channel_id):
        if channel not in unnamed:
            place(channel)
    return ordered + sorted(unnamed, key=lambda c: c.channel_id)


class TablestoreRangeReader(DataSourceReader):
    """``spark.read.format("tablestore")``: the changes of ``[startingTimestamp,
    endingTimestamp)`` (module docstring)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        assert options.starting_timestamp is not None and options.ending_timestamp is not None
        self.options = options
        self.schema = schema

    # --- driver --------------------------------------------------------------------------

    def partitions(self) -> Sequence[InputPartition]:
        """Create the dedicated tunnel (started at ``startingTimestamp``) and plan one
        partition per channel it has not finished already, parents first."""
        o = self.options
        assert o.starting_timestamp is not None and o.ending_timestamp is not None
        if o.ending_timestamp > time.time() * 1000:
            raise OptionError(option="endingTimestamp", value=o.ending_timestamp,
                              problem="is in the future: changes still to come would make two "
                              "reads of the range differ", allowed="an instant that has passed")
        with Clients().tunnel(o.endpoint) as tunnel:
            o = o.resolved(tunnel)  # tunnel.id names the tunnel: its name is the prefix
            assert o.starting_timestamp is not None and o.ending_timestamp is not None
            table = tunnel.table_schema(o.table_name)
            if self.schema != output_schema(table, o.before_format):
                check_user_schema(self.schema, table, o.before_format)
            _delete_stale_range_tunnels(tunnel, o.table_name, o.named_tunnel)
            name = range_tunnel_name(o.named_tunnel, time.time())
            # a service that rounds commit times down (DynamoDB Streams: to the second) gets
            # the range widened to whole units: no change inside it is lost to the rounding
            grain = tunnel.commit_time_granularity_us
            start_us = o.starting_timestamp * 1000 // grain * grain
            end_us = -(-o.ending_timestamp * 1000 // grain) * grain
            info = tunnel.create_tunnel(o.table_name, name, TunnelType.STREAM,
                                        StartPosition.EARLIEST, start_at_us=start_us)
            log.info("range read of %s [%s, %s) through its own tunnel %s (%s)", o.table_name,
                     o.starting_timestamp, o.ending_timestamp, name, info.tunnel_id)
            partitions = []
            for channel in parents_first(tunnel.describe_tunnel(o.table_name, name).channels):
                if channel.status is ChannelStatus.TERMINATED:
                    continue  # nothing at or after the start (its end was before it)
                start = tunnel.get_checkpoint(info.tunnel_id, channel.channel_id)
                if start.finished:
                    continue
                partitions.append(RangePartition(
                    endpoint=o.endpoint, table=o.table_name, tunnel_name=name,
                    tunnel_id=info.tunnel_id,
                    channel_id=channel.channel_id, start_token=start.token,
                    parent_ids=channel.parent_ids,
                    waiting=channel.status is ChannelStatus.WAIT, start_us=start_us,
                    end_us=end_us, fail_on_data_loss=o.fail_on_data_loss))
        return partitions

    # --- executors ----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        builder = RecordBatchBuilder(self.schema, policy=self.options.schema_change_behavior,
                                     table=self.options.table_name)
        tunnel = executor_clients().tunnel(partition.endpoint)
        for page in read_range(tunnel, partition, builder.layout):
            yield builder.project(page.batch, partition.channel_id)


def _delete_stale_range_tunnels(tunnel: TunnelAdministration, table: str, prefix: str) -> None:
    """Delete this table's dedicated range-read tunnels of ``prefix`` older than
    ``RANGE_TUNNEL_RETENTION_S`` (driver)."""
    cutoff = time.time() - RANGE_TUNNEL_RETENTION_S
    for info in tunnel.list_tunnels(table):
        if info.tunnel_name.startswith(prefix + _RANGE_INFIX) and 0 < info.created_at < cutoff:
            log.info("deleting range-read tunnel %s (created %s)", info.tunnel_name,
                     dt.datetime.fromtimestamp(info.created_at, dt.UTC).isoformat())
            tunnel.delete_tunnel(table, info.tunnel_name)


def read_range(tunnel: TunnelService, p: RangePartition, layout: PageLayout) -> Iterator[Page]:
    """The pages of ``p``'s channel committed in ``[p.start_us, p.end_us)`` (executor), then
    the push that tells its children where it ended (module docstring)."""
    if p.waiting and not _released(tunnel, p):
        return
    token = p.start_token
    started = False  # a change at or after the start was seen (no more skipping)
    empty_pages = 0
    while True:
        try:
            page = tunnel.read_page(p.tunnel_id, p.channel_id, token, PAGE_SIZE, layout)
        except TrimmedDataError as lost:
            token = resume_after_trim(tunnel, p.tunnel_id, p.channel_id, lost, layout,
                                      before_us=p.start_us, before_what="the range",
                                      kept_any=started, fail_on_data_loss=p.fail_on_data_loss)
            continue
        if page.next_token == FINISHED:  # read to its end: release its children
            yield from _in_range(p, page, started)
            tunnel.checkpoint(p.tunnel_id, p.channel_id, Checkpoint(FINISHED, FINISHED_SEQUENCE))
            return
        if not page.count:
            if page.next_token == token or not page.may_more or empty_pages >= MAX_EMPTY_PAGES:
                _mark(tunnel, p, page.next_token)  # nothing more now: an open channel
                return
            empty_pages += 1
            token = page.next_token
            continue
        empty_pages = 0
        yield from _in_range(p, page, started)
        last = commit_micros(page.batch.column("_commit_ts"))[-1].as_py()
        started = started or last >= p.start_us
        token = page.next_token
        if last >= p.end_us or not page.may_more:  # past the range, or nothing more now
            _mark(tunnel, p, token)
            return


def _in_range(p: RangePartition, page: Page, started: bool) -> Iterator[Page]:
    """The part of ``page`` committed in the range: past the leading changes before its start
    (until one at or after it was seen), up to the first change at or after its end (commit
    times increase within a channel)."""
    if not page.count:
        return
    batch = page.batch
    stamps = commit_micros(batch.column("_commit_ts"))
    skip = 0 if started else leading_count(pc.less(stamps, p.start_us))
    stop = leading_count(pc.less(stamps, p.end_us))
    if stop > skip:
        yield Page(batch.slice(skip, stop - skip), page.next_token, page.may_more)


def _mark(tunnel: TunnelService, p: RangePartition, token: str) -> None:
    """Push where the read stopped short of the channel's end: children it may have split
    into after the range hold nothing in it, and their tasks stop waiting."""
    tunnel.checkpoint(p.tunnel_id, p.channel_id, Checkpoint(token, MARKER_SEQUENCE))


def _released(tunnel: TunnelService, p: RangePartition) -> bool:
    """Wait until the waiting channel is released (True: read it) or a parent stopped short
    of its end (False: nothing in the range) -- also a parent that is itself waiting for one
    that did (a merge of two children of a late split). Polls with a growing pause, up to
    ``RANGE_WAIT_S``."""
    deadline = time.monotonic() + RANGE_WAIT_S
    pause = 0.1
    while True:
        channels = {c.channel_id: c
                    for c in tunnel.describe_tunnel(p.table, p.tunnel_name).channels}
        mine = channels.get(p.channel_id)
        if mine is None or mine.status is not ChannelStatus.WAIT:
            return True
        if any(_stopped_short(tunnel, p.tunnel_id, channels, parent, set())
               for parent in mine.parent_ids or p.parent_ids):
            return False
        if time.monotonic() > deadline:
            raise RangeReadError(
                channel_id=p.channel_id, tunnel=p.tunnel_name,
                problem=f"it still waits for its parents after {RANGE_WAIT_S:.0f} s" + (
                    f" ({', '.join(p.parent_ids)})" if p.parent_ids else
                    "; the service does not name them, so whether they ended inside the "
                    "range cannot be told"))
        time.sleep(pause)
        pause = min(2.0, pause * 2)


def _stopped_short(tunnel: TunnelService, tunnel_id: str, channels: dict[str, ChannelInfo],
                   channel_id: str, seen: set[str]) -> bool:
    """Did ``channel_id``'s read stop short of its end (its marker is pushed), or is it waiting
    for a parent that did? Then none of its descendants holds changes in the range."""
    if channel_id in seen:
        return False
    seen.add(channel_id)
    pushed = tunnel.get_checkpoint(tunnel_id, channel_id)
    if not pushed.finished and pushed.sequence_number >= MARKER_SEQUENCE:
        return True
    channel = channels.get(channel_id)
    return channel is not None and channel.status is ChannelStatus.WAIT and any(
        _stopped_short(tunnel, tunnel_id, channels, parent, seen)
        for parent in channel.parent_ids)
