"""The driver side of the UUID-offset protocol (docs/protocol.md): one micro-batch, step by step.

``StreamProtocol`` is owned by the stream reader (``connector.source``) in Spark's planning
process on the driver; it is never pickled to executors (``ChannelPartition``s are:
``connector.partition``). Spark calls, per micro-batch::

    latestOffset(start)  -> latest_offset   mint a UUID (or return start: nothing new)
    commit(end of N-1)   -> commit          mark committed; push checkpoints when due
    partitions(start,end)-> plan            reuse or write the batch manifest; one partition
                                            per readable channel
    read(partition)      -> connector.reader.claim_and_read (executors)

The first call binds the query (``binding``: its meta store, namespace, tunnel and ``lease``,
every refusal before anything is created). The steps call the pieces in ``connector.planning``:
``offsets`` (the offset JSON), ``namespace`` (tunnel binding, generations of initial offsets),
``positions`` (where channels stand after a batch), ``tracker`` (which channels a new batch
reads), ``read_limits`` (their caps) and ``pushes`` (commit catch-up, checkpoint pushes).

Invariants kept here:
- the initial offset is deterministic per namespace (Spark calls ``initialOffset`` again
  after every restart until batch 0 commits and never logs batch 0's start);
- a batch's manifest is written once; a replay reuses it even if the channels changed since;
- a finished channel stays in the manifests (token FINISHED, no partition) until the tunnel
  reports it TERMINATED, so a channel is never planned again from a stale pushed checkpoint;
- commits catch up: Spark does not re-send a commit lost in a crash, so every commit (and every
  ``latestOffset``, which implies the previous batch is in Spark's commit log) marks the whole
  prev chain committed and pushes everything committed but not yet pushed;
- children are added only when the tunnel releases them (all parents finished and pushed), and
  the channel list is refreshed right after a FINISHED push so they join the very next batch.
"""

from __future__ import annotations

import logging
import time
import uuid as uuid_lib
from dataclasses import dataclass
from typing import Any

from connector.clients import Clients
from connector.crash_hook import crash_point
from connector.errors import CheckpointBehindMetaError, TunnelError, UnknownBatchError
from connector.identity import SourceIdentity
from connector.options import DataLossPolicy, SourceOptions
from connector.partition import ChannelPartition
from connector.planning.backlog import records_available
from connector.planning.binding import (
    Binding,
    bind_new_query,
    bind_restart,
    shown_meta_store,
)
from connector.planning.logs import configure_planner_logging, log
from connector.planning.namespace import NamespaceRecord
from connector.planning.offsets import offset_json, uuid_of
from connector.planning.positions import Position, positions_after_batch
from connector.planning.pushes import CheckpointPushes
from connector.planning.read_limits import (
    TriggerLimits,
    byte_budgets,
    holds_back,
    read_caps,
)
from connector.planning.starting import check_starting_timestamp
from connector.planning.tracker import ChannelTracker
from connector.tunnel import FINISHED, TunnelService
from meta_store import BatchRecord, BatchState, ChannelStart, Manifest, MetaStore

#: minted-but-never-planned UUIDs older than this are garbage-collected
ORPHAN_RETENTION_S = 3600.0
#: retention runs every ``metaRetentionBatches // GC_EVERY_DIV`` commits (at least every one)
GC_EVERY_DIV = 10

#: the initial offsets this process has logged at INFO (``StreamProtocol.initial_offset``)
_INITIAL_LOGGED: set[str] = set()


@dataclass
class BatchStats:
    """What the last planned batch looked like (for the batch log line and tests)."""

    uuid: str
    channels: int
    children_added: tuple[str, ...]
    replay: bool
    plan_ms: float


class StreamProtocol:
    """Driver-side protocol for one streaming query. Opened lazily by the stream reader.

    Opening makes no request and creates nothing: the query is bound to its meta store,
    namespace, tunnel and lease at the first call that needs them
    (``connector.planning.binding``): ``initial_offset`` binds a new query, a call handed an
    offset from Spark's log binds a restart -- checking that offset's source and meta store
    before anything is created.

    ``clients``: the seam that opens the tunnel and the meta store, retried
    (``connector.clients``); a test passes one with its own collaborators."""

    def __init__(self, options: SourceOptions, clients: Clients | None = None) -> None:
        configure_planner_logging()
        self.options = options
        self.clients = clients or Clients()
        self.tunnel: TunnelService = self.clients.tunnel(options.endpoint)
        self._identity: SourceIdentity | None = None
        self._binding: Binding | None = None
        #: the instant prepare_available_now was called, before the binding (µs; None: not)
        self._available_now_at_us: int | None = None
        self._committed_through: str | None = None
        self._commits_since_gc = 1_000_000  # the first commit of a process applies retention
        #: a batch known to have no planned successor (this process planned it last, or
        #: looked): ``latestOffset`` from it need not search the chain for one
        self._known_tip: str | None = None
        self.last_batch: BatchStats | None = None
        #: seconds since the epoch for time-based decisions (the seam's ``Clock``: the wall
        #: clock); a unit test may replace it
        self.clock = self.clients.clock

    def close(self) -> None:
        if self._binding is not None:
            self._binding.pushes.close()
            self._binding.lease.release()
            self._binding.meta.close()
        self.tunnel.close()

    # --- binding (connector.planning.binding) --------------------------------------------------

    @property
    def identity(self) -> SourceIdentity:
        """The source this query reads (``connector.identity``). A query named by
        ``tunnel.id`` reads its tunnel's name first (one ListTunnel, once: never during option
        validation)."""
        if self._identity is None:
            self.options = self.options.resolved(self.tunnel)
            self._identity = self.options.identity
        return self._identity

    def _bind(self, offset: dict | None) -> Binding:
        """The binding, made now if it is not: for a restart when ``offset`` (from Spark's
        log) is given, else for a new query. The offset is also the evidence a lease left
        pending by ``initialOffset`` is decided on (``connector.planning.lease``). A bound
        query checks its lease is still its own (another process took it over: this one is a
        leftover)."""
        if self._binding is None:
            identity = self.identity  # first: it may read tunnel.id's name into the options
            if offset is None:
                self._binding = bind_new_query(self.options, identity, self.tunnel,
                                               self.clients)
            else:
                self._binding = bind_restart(self.options, identity, self.tunnel, offset,
                                             self.clients)
            if self._available_now_at_us is not None:
                self._binding.tracker.prepare_available_now(self._available_now_at_us)
        elif offset is not None and self._binding.lease.pending:
            evidence = offset.get("uuid") if isinstance(offset, dict) else None
            self._binding.lease.take(self._binding.namespace,
                                     evidence if isinstance(evidence, str) else None)
        self._binding.lease.check()
        return self._binding

    @property
    def namespace(self) -> str:
        """The meta namespace of this query's batches (the identity's, or a legacy one its
        checkpoint names: ``connector.identity``)."""
        return self._bind(None).namespace

    @property
    def meta(self) -> MetaStore:
        return self._bind(None).meta

    @property
    def namespace_record(self) -> NamespaceRecord:
        return self._bind(None).record

    @property
    def tunnel_id(self) -> str:
        return self._bind(None).tunnel_id

    @property
    def tracker(self) -> ChannelTracker:
        return self._bind(None).tracker

    @property
    def pushes(self) -> CheckpointPushes:
        return self._bind(None).pushes

    # --- offsets -----------------------------------------------------------------------------

    def offset(self, uuid: str, max_rows: int | None = None,
               max_bytes: int | None = None) -> dict:
        """The offset Spark logs (``connector.planning.offsets``)."""
        return offset_json(self.namespace, uuid, max_rows, max_bytes,
                           shown_meta_store(self.options))

    def uuid_of(self, offset: dict) -> str:
        """The UUID of an offset from Spark's log; refuses an offset of another source
        (``CheckpointMismatchError``) and one this source did not write
        (``MalformedOffsetError``). Binds a restart on the first call."""
        return uuid_of(offset, self.identity, self._bind(offset).namespace)

    def initial_offset(self) -> dict:
        """``initialOffset``: the same UUID every time until batch 0 of this query commits.

        The UUID is derived from the namespace, the tunnel id and a generation number.
        A generation is used once a batch after its initial batch has committed: a later query
        (a new checkpoint directory) starts the next generation from the tunnel's pushed
        checkpoints, while a restart of the same query never calls ``initialOffset`` again.
        """
        binding = self._bind(None)
        uuid = binding.record.initial_uuid()
        existing = self.meta.find_batch(self.namespace, uuid)
        if existing is None:
            starts = tuple(self.tracker.starts(exclude=set()))
            if self.options.starting_timestamp is not None:
                check_starting_timestamp(self.options, self.tunnel, self.tunnel_id, self.meta,
                                         starts, self.namespace_record.created_tunnel)
            manifest = Manifest(channels=starts, planned_at=self.clock())
            existing = self.meta.create_batch(self.namespace, uuid, None,
                                              state=BatchState.PUSHED, manifest=manifest)
        if binding.lease.tip is None:
            binding.lease.advance(uuid, now=True)  # a restart during batch 0 finds it
        # Spark asks twice at a query's start (an AvailableNow run once more): said once
        level = logging.DEBUG if uuid in _INITIAL_LOGGED else logging.INFO
        _INITIAL_LOGGED.add(uuid)
        log.log(level, "initial offset %s (%d channels)", uuid,
                len(existing.manifest.channels) if existing.manifest else 0)
        return self.offset(uuid)

    def latest_offset(self, start: dict, limits: TriggerLimits | int | None = None) -> dict:
        """``latestOffset(start, limit)``: mint the end UUID of the next batch, or return
        ``start`` when nothing is new (``skipEmptyBatches``), when ``minOffsetsPerTrigger``
        holds the batch back, or when an AvailableNow run is done. ``limits``: what applies to
        this trigger (``connector.planning.read_limits.trigger_limits``); an integer is a
        ``maxOffsetsPerTrigger`` total alone, ``None`` no limit."""
        if not isinstance(limits, TriggerLimits):
            limits = TriggerLimits(max_rows=limits)
        start_uuid = self.uuid_of(start)
        crash_point("latest_offset_start")
        # Spark asks for a new batch only once the batch ending at `start` is in its commit
        # log: catch up a commit lost in a crash before anything else.
        self._commit_through(start_uuid)
        # Spark's checkpoint is behind the meta table: replay the stored chain exactly (this
        # works even when retention took `start` itself; positions_after refuses otherwise)
        successor = self._planned_successor(start_uuid)
        if successor is not None:
            log.info("batch %s was planned after %s before (Spark's checkpoint is behind the "
                     "meta table): replaying it", successor.uuid, start_uuid)
            return self.offset(successor.uuid, successor.max_rows)
        batch, positions = self._after(start_uuid)
        if self.tracker.available_now:
            if self._available_now_done(batch, positions):
                return start
        else:
            if limits.min_rows is not None and self._holds_back(batch, positions, limits):
                return start
            if self.options.skip_empty_batches:
                tokens = {ch: p.token for ch, p in positions.items()}
                if self.tunnel.has_new_data(self.tunnel_id, tokens) is False:
                    return start
        end_uuid = str(uuid_lib.uuid4())
        self.meta.create_batch(self.namespace, end_uuid, start_uuid, max_rows=limits.max_rows)
        crash_point("after_latest_offset")
        return self.offset(end_uuid, limits.max_rows, limits.max_bytes)

    def _available_now_done(self, batch: BatchRecord, positions: dict[str, Position]) -> bool:
        """Trigger.AvailableNow: has every channel reached the run's bound after ``batch``? A
        channel read to its end is pushed at once first, so its children are released (and
        read, when they hold changes before the bound)."""
        bound = self.tracker.bound_for(_bound_of(batch), positions)
        check = self.tracker.available_now_check(bound, positions)
        if check.release:
            self.push_if_due(force=True)
            check = self.tracker.available_now_check(bound, positions)
        if check.done:
            log.info("Trigger.AvailableNow: every channel reached the bound; the run is done")
        return check.done

    def _holds_back(self, batch: BatchRecord, positions: dict[str, Position],
                    limits: TriggerLimits) -> bool:
        """``minOffsetsPerTrigger``: hold the next batch back while fewer records wait and
        ``maxTriggerDelay`` has not passed since ``batch`` (the last one) was planned
        (``read_limits.holds_back``). Records are counted only while the delay runs, and only
        up to the minimum (``planning.backlog.records_available``)."""
        assert limits.min_rows is not None and limits.max_delay_s is not None
        planned = batch.manifest.planned_at if batch.manifest is not None else batch.created_at
        waited = self.clock() - planned
        if waited >= limits.max_delay_s:
            return False
        tokens = {ch: p.token for ch, p in positions.items()}
        available = records_available(self.tunnel, self.tunnel_id, tokens, limits.min_rows)
        held = holds_back(limits.min_rows, available, waited, limits.max_delay_s)
        if held:
            log.debug("minOffsetsPerTrigger: %s record(s) waiting, fewer than %d; %.1f s of "
                      "maxTriggerDelay left", available, limits.min_rows,
                      limits.max_delay_s - waited)
        return held

    def _start_batch(self, uuid: str) -> BatchRecord:
        """The batch an offset from Spark's log ends; ``CheckpointBehindMetaError`` when the
        meta table no longer holds it but holds newer committed batches (a checkpoint restored
        beyond retention), ``UnknownBatchError`` when the namespace holds nothing."""
        batch = self.meta.find_batch(self.namespace, uuid)
        if batch is not None:
            return batch
        retained = [b for b in self.meta.list_batches(self.namespace)
                    if b.state.rank >= BatchState.COMMITTED.rank and b.prev_uuid is not None]
        if retained:
            raise CheckpointBehindMetaError(uuid=uuid, namespace=self.namespace,
                                            retained=len(retained),
                                            retention=self.options.meta_retention_batches)
        raise UnknownBatchError(uuid=uuid, namespace=self.namespace)

    def _planned_successor(self, uuid: str) -> BatchRecord | None:
        """The batch Spark planned after ``uuid`` earlier, if any: found when Spark's
        checkpoint is behind the meta table (restored from a backup, newest offsets/commits
        files deleted). The oldest planned one is the one on the chain."""
        if uuid == self._known_tip:
            return None
        planned = [b for b in self.meta.successors(self.namespace, uuid) if b.manifest is not None]
        if not planned:
            self._known_tip = uuid
            return None
        return min(planned, key=lambda b: (b.created_at, b.uuid))

    # --- planning ------------------------------------------------------------------------------

    def positions_after(self, uuid: str) -> dict[str, Position]:
        """Every channel's position at the end of batch ``uuid``
        (``connector.planning.positions``), from the batch this process committed when it
        kept it, else from the meta table."""
        return self._after(uuid)[1]

    def _after(self, uuid: str) -> tuple[BatchRecord, dict[str, Position]]:
        """Batch ``uuid`` and every channel's position at its end (``positions_after``)."""
        cached = self.pushes.committed_batch(uuid)
        if cached is not None:
            batch, ends = cached
        else:
            batch = self._start_batch(uuid)
            ends = self.meta.get_end_checkpoints(self.namespace, uuid)
        expired = self.namespace_record.expired_tunnel
        if expired is not None and expired.planned_on(uuid):
            # the positions are those of a tunnel replaced after its expiry
            # (connector.planning.expiry): go on from the new tunnel's channels
            return batch, {s.channel_id: Position.at_start(s)
                           for s in self.tracker.starts(exclude=set())}
        return batch, positions_after_batch(batch, ends)

    def plan(self, start: dict, end: dict) -> list[ChannelPartition]:
        """``partitions(start, end)``: one partition per readable channel of the batch."""
        began = time.perf_counter()
        self._bind(end)  # the end is from Spark's log: a restart's evidence (lease)
        start_uuid, end_uuid = self.uuid_of(start), self.uuid_of(end)
        if start_uuid == end_uuid:
            return []
        crash_point("plan_start")  # Spark's offset log already holds this batch
        batch = self.meta.find_batch(self.namespace, end_uuid)
        replay = batch is not None and batch.manifest is not None
        if replay:
            assert batch is not None and batch.manifest is not None
            manifest = batch.manifest
        else:
            # the lease carries the line; a process whose lease was taken over (a leftover of
            # a restarted query) finds out here, before it plans anything
            lease = self._bind(end).lease
            lease.advance(end_uuid)
            lease.check()
            # the limits travel in the offset: the minted row may have been collected
            max_rows = end.get("maxRows") or (batch.max_rows if batch is not None else None)
            manifest = self.meta.put_manifest(
                self.namespace, end_uuid, start_uuid,
                self._new_manifest(start_uuid, end_uuid, max_rows, end.get("maxBytes")))
            self._known_tip = end_uuid  # just planned: nothing was planned after it
        shared = self._partition_fields(end_uuid, manifest.available_now_us)
        partitions = [self._partition(shared, c) for c in manifest.channels
                      if c.token != FINISHED and c.max_records > 0]
        expired = self.namespace_record.expired_tunnel
        if replay and expired is not None and expired.planned_on(end_uuid):
            log.warning("batch %s was planned on tunnel %s, which expired: nothing of it can be "
                        "read any more, it is replayed empty (the resnapshot recorded for the "
                        "expiry repairs the target)", end_uuid, expired.tunnel_id)
            partitions = []
        self.last_batch = BatchStats(end_uuid, len(partitions), manifest.children_added,
                                     replay, (time.perf_counter() - began) * 1000)
        log.debug("batch %s planned%s: %d channel(s) to read, children added %s, %.1f ms",
                 end_uuid, " (replay)" if replay else "", len(partitions),
                 list(manifest.children_added), self.last_batch.plan_ms)
        return partitions

    def _new_manifest(self, start_uuid: str, end_uuid: str, max_rows: int | None,
                      max_bytes: int | None) -> Manifest:
        """A new batch's manifest: the positions after ``start``, brought up to date by the
        channel tracker, each unfinished channel with its caps; under Trigger.AvailableNow the
        run's bound."""
        start_batch, positions = self._after(start_uuid)
        bound = None
        if self.tracker.available_now:
            bound = self.tracker.bound_for(_bound_of(start_batch), positions)
        children = self.tracker.refresh(positions)
        records, budgets = self._caps(positions, max_rows, max_bytes, end_uuid)
        channels = tuple(
            ChannelStart(channel_id=ch, token=p.token, sequence_number=p.sequence_number,
                         max_records=records.get(ch, 0), parent_ids=p.parent_ids,
                         last_sequence=p.last_sequence, max_bytes=budgets.get(ch),
                         bound_reached_us=p.bound_reached_us)
            for ch, p in sorted(positions.items())
        )
        return Manifest(channels=channels, children_added=tuple(children),
                        planned_at=self.clock(),
                        available_now_us=bound.at_us if bound is not None else None)

    def _caps(self, positions: dict[str, Position], max_rows: int | None,
              max_bytes: int | None, end_uuid: str) -> tuple[dict[str, int], dict[str, int]]:
        """Per-channel record caps and byte budgets (``connector.planning.read_limits``). A
        ``ReadMaxRows`` total is given where the data is, so only with a total is the tunnel
        asked for the backlog. Under AvailableNow a channel at the bound is still read: its
        read stops there at once, and a closed one reaches its end (``finished``), which
        releases its children. The caps go into the manifest: a replay reads them from there,
        never recomputes them."""
        active = [ch for ch, p in positions.items() if not p.finished]
        backlog = None
        if (max_rows is not None or max_bytes is not None) and active:
            backlog = self._backlog({ch: positions[ch].token for ch in active})
        caps = read_caps(active, per_channel=self.options.max_offsets_per_channel,
                         max_rows=max_rows, batch_uuid=end_uuid, backlog=backlog,
                         waiting_parents=self.tracker.waiting_parents)
        if max_bytes is None:
            return caps, {}
        budgets = byte_budgets(caps, max_bytes=max_bytes, batch_uuid=end_uuid, backlog=backlog)
        return {ch: cap if budgets.get(ch, 0) > 0 else 0 for ch, cap in caps.items()}, budgets

    def _backlog(self, tokens: dict[str, str]) -> dict[str, int | None] | None:
        """Records behind per channel at ``tokens`` (the tunnel's ``lag``); ``None`` when the
        backend cannot tell, per channel where only a lower bound is known."""
        try:
            lags = self.tunnel.lag(self.tunnel_id, tokens)
        except TunnelError as exc:  # the backlog only shapes the split: never fail a batch on it
            log.debug("no backlog figures (%s): splitting the read limit evenly", exc)
            return None
        if lags is None:
            return None
        return {ch: lag.records_behind if lag.exact else None for ch, lag in lags.items()}

    def _partition_fields(self, end_uuid: str, available_now_us: int | None) -> dict[str, Any]:
        """What every partition of batch ``end_uuid`` carries alike (made once per batch: a
        batch plans a partition per channel, hundreds of them)."""
        return {
            "namespace": self.namespace, "meta_uri": self.options.meta_store,
            "meta_credentials": tuple(sorted((self.options.meta_store_credentials or {}).items())),
            "endpoint": self.options.endpoint, "tunnel_id": self.tunnel_id, "end_uuid": end_uuid,
            "fail_on_data_loss": self.options.fail_on_data_loss,
            "resnapshot_table": (self.options.table_name if self.options.on_data_loss
                                 is DataLossPolicy.RESNAPSHOT else None),
            "available_now_us": available_now_us,
        }

    def _partition(self, shared: dict[str, Any], start: ChannelStart) -> ChannelPartition:
        """The plain data an executor needs to read ``start``'s channel (``shared``: the
        batch's ``_partition_fields``)."""
        head = None
        if shared["available_now_us"] is not None:
            head = self.tracker.head(shared["available_now_us"], start.channel_id)
        skip = None
        if self.options.starting_timestamp is not None and start.last_sequence is None:
            # nothing of the channel consumed yet; a service that rounds commit times down
            # (to the second) must not lose a change made after the instant to the rounding
            grain = self.tunnel.commit_time_granularity_us
            skip = self.options.starting_timestamp * 1000 // grain * grain
        return ChannelPartition(
            **shared, channel_id=start.channel_id, start_token=start.token,
            start_sequence_number=start.sequence_number, start_last_sequence=start.last_sequence,
            max_records=start.max_records, stop_after_sequence=head,
            max_bytes=start.max_bytes, skip_before_us=skip,
        )

    # --- commit and push -----------------------------------------------------------------------

    def commit(self, end: dict) -> None:
        """``commit(end)``: Spark durably finished the batch ending at ``end``."""
        end_uuid = self.uuid_of(end)
        crash_point("commit_start")  # Spark's commit log already holds this batch
        self._commit_through(end_uuid)
        # retention lists the namespace's batches: every commit for a small
        # metaRetentionBatches, else every tenth of it (at most that many more are held between)
        self._commits_since_gc += 1
        if self._commits_since_gc < max(1, self.options.meta_retention_batches // GC_EVERY_DIV):
            return
        self._commits_since_gc = 0
        removed = self.meta.gc(self.namespace, self.options.meta_retention_batches,
                               ORPHAN_RETENTION_S)
        if removed:
            log.info("meta retention removed %d batch(es)", len(removed))

    def _commit_through(self, uuid: str) -> None:
        """Mark ``uuid`` and its uncommitted ancestors committed and push when due. Spark polls
        ``latestOffset`` with the same start many times while idle: after the first success
        this is a no-op, since only a commit changes what is due."""
        if uuid == self._committed_through:
            return
        for batch in self.pushes.record_commits(uuid):
            self.namespace_record.note_committed(batch)  # a batch 0 uses up its generation
        self.push_if_due()
        self._committed_through = uuid

    def push_if_due(self, force: bool = False) -> list[str]:
        """Push the newest committed checkpoint of every channel to the tunnel when
        ``commitInterval`` committed batches are waiting, or at once when one of them finished
        a channel (its children are released only by that push). Returns pushed UUIDs."""
        push = self.pushes.push_if_due(force)
        if push.finished:
            self.tracker.request_refresh()  # released children join the very next batch
        return push.uuids

    # --- Trigger.AvailableNow -----------------------------------------------------------------

    def prepare_available_now(self) -> None:
        """``prepareForTriggerAvailableNow``: the run reads every change committed by now
        (``ChannelTracker.prepare_available_now``; a restart of an unfinished run goes on to
        that run's bound, settled at the first batch). Spark calls it before the first offset
        call, which decides how the query binds: until then the instant is only noted."""
        self._available_now_at_us = int(self.clock() * 1_000_000)
        if self._binding is not None:
            self.tracker.prepare_available_now(self._available_now_at_us)


def _bound_of(batch: BatchRecord) -> int | None:
    """The AvailableNow bound ``batch`` was planned under (None: none)."""
    return batch.manifest.available_now_us if batch.manifest is not None else None
