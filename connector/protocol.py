"""The driver side of the UUID-offset protocol (docs/protocol.md).

``StreamProtocol`` is owned by the stream reader (``connector.source``) in Spark's planning
process on the driver; it is never pickled to executors (``ChannelPartition``s are:
``connector.partition``). Spark calls, per micro-batch::

    latestOffset(start)  -> latest_offset   mint a UUID (or return start: nothing new)
    commit(end of N-1)   -> commit          mark committed; push checkpoints when due
    partitions(start,end)-> plan            reuse or write the batch manifest; one partition
                                            per readable channel
    read(partition)      -> connector.reader.claim_and_read (executors)

Invariants kept here:
- the initial offset is deterministic per source identity (Spark calls ``initialOffset`` again
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

import time
import uuid as uuid_lib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from connector.errors import (
    CheckpointBehindMetaError,
    OptionError,
    StaleCheckpointError,
    TunnelError,
    TunnelGoneError,
    TunnelReplacedError,
    UnknownBatchError,
    UnknownTunnelError,
)
from connector.faults import fault_point, inject_transient_errors
from connector.options import SourceOptions
from connector.partition import ChannelPartition
from connector.planning.logs import configure_planner_logging, log
from connector.planning.offsets import initial_uuid, offset_json, uuid_of
from connector.planning.positions import Position, positions_after_batch
from connector.planning.read_limits import read_caps
from connector.retry import with_retries
from connector.tunnel import (
    FINISHED,
    ChannelStatus,
    Checkpoint,
    TunnelInfo,
    TunnelService,
    open_tunnel_service,
)
from meta_store import (
    BatchRecord,
    BatchState,
    ChannelStart,
    EndCheckpoint,
    Manifest,
    MetaStore,
    open_meta_store,
)

#: minted-but-never-planned UUIDs older than this are garbage-collected
ORPHAN_RETENTION_S = 3600.0
#: retention runs every ``metaRetentionBatches // GC_EVERY_DIV`` commits (at least every one)
GC_EVERY_DIV = 10


@dataclass
class BatchStats:
    """What the last planned batch looked like (for the batch log line and tests)."""

    uuid: str
    channels: int
    children_added: tuple[str, ...]
    replay: bool
    plan_ms: float


class StreamProtocol:
    """Driver-side protocol for one streaming query. Opened lazily by the stream reader."""

    def __init__(self, options: SourceOptions) -> None:
        configure_planner_logging()
        self.options = options
        self.namespace = options.source_identity
        # transient errors are retried (connector.retry); the injection is inert in production
        self.tunnel: TunnelService = with_retries(inject_transient_errors(
            open_tunnel_service(options.endpoint)))
        self.meta: MetaStore = with_retries(inject_transient_errors(
            open_meta_store(options.meta_store, options.meta_store_credentials)))
        recorded = self.meta.get_namespace_info(self.namespace) or {}
        info = self._bind_tunnel(recorded.get("tunnel_id"))
        if info.tunnel_type is not options.tunnel_type:
            raise OptionError(option="tunnel.type", value=options.tunnel_type.value,
                              problem=f"tunnel {options.tunnel_name!r} already exists with type "
                              f"{info.tunnel_type.value}",
                              allowed=f"{info.tunnel_type.value}, or another tunnel.name")
        self.tunnel_id = info.tunnel_id
        self._info = {
            **recorded,
            "endpoint": options.safe_endpoint, "table": options.table_name,
            "tunnel": options.tunnel_name, "tunnel_id": self.tunnel_id,
        }
        if recorded.get("tunnel_id") != self.tunnel_id:
            self._info.pop("committed_generation", None)  # generations of another tunnel
        if self._info != recorded:
            self.meta.set_namespace_info(self.namespace, self._info)
        self._committed_through: str | None = None
        self._commits_since_gc = 1_000_000  # the first commit of a process applies retention
        self._last_refresh = 0.0
        self._force_refresh = True
        self._available_now_targets: dict[str, str] | None = None
        #: a batch known to have no planned successor (this process planned it last, or
        #: looked): ``latestOffset`` from it need not search the chain for one
        self._known_tip: str | None = None
        #: from the last channel refresh: parents of channels waiting for them (a finished
        #: parent needs a share of the read limit to reach FINISHED), or None when the tunnel
        #: holds waiting channels without naming their parents
        self._waiting_parents: set[str] | None = set()
        self.last_batch: BatchStats | None = None
        #: committed batches' rows and end checkpoints, newest last: both are final once a
        #: batch is committed (manifests are write-once, every claim is in), so the push and the
        #: next batch's positions reuse what the commit read instead of decoding it again
        self._committed: OrderedDict[str, tuple[BatchRecord, dict[str, EndCheckpoint]]] = (
            OrderedDict())
        #: what this process last pushed per channel: an unchanged position is not pushed again
        self._pushed: dict[str, tuple[str, int]] = {}

    def _bind_tunnel(self, recorded_id: str | None) -> TunnelInfo:
        """The tunnel this namespace reads, checked against the id the meta table recorded.

        A namespace with committed batches is bound to its tunnel id: if the tunnel was deleted
        (and perhaps created again under the same name), its positions mean nothing to the
        current tunnel, so the query is refused (``TunnelReplacedError``/``TunnelGoneError``)
        and no tunnel is created. A namespace with nothing committed binds to the tunnel as it
        is, creating it when missing."""
        o = self.options
        try:
            current: TunnelInfo | None = self.tunnel.describe_tunnel(o.table_name,
                                                                     o.tunnel_name).tunnel
        except UnknownTunnelError:
            current = None
        if recorded_id and (current is None or current.tunnel_id != recorded_id):
            if self._has_committed():
                fields = {"table": o.table_name, "tunnel": o.tunnel_name,
                          "namespace": self.namespace, "recorded_id": recorded_id}
                if current is None:
                    raise TunnelGoneError(**fields)
                raise TunnelReplacedError(**fields, current_id=current.tunnel_id)
        if current is not None:
            return current
        return self.tunnel.ensure_tunnel(o.table_name, o.tunnel_name, o.tunnel_type,
                                         o.starting_position)

    def _has_committed(self) -> bool:
        """Does the namespace hold a committed batch (an initial batch does not count)?"""
        return any(b.prev_uuid is not None and b.state.rank >= BatchState.COMMITTED.rank
                   for b in self.meta.list_batches(self.namespace))

    def close(self) -> None:
        self.tunnel.close()
        self.meta.close()

    # --- offsets -----------------------------------------------------------------------------

    def offset(self, uuid: str, max_rows: int | None = None) -> dict:
        """The offset Spark logs (``connector.planning.offsets``)."""
        return offset_json(self.namespace, uuid, max_rows)

    def uuid_of(self, offset: dict) -> str:
        """The UUID of an offset from Spark's log; refuses an offset of another source
        (``CheckpointMismatchError``) and one this source did not write
        (``MalformedOffsetError``)."""
        return uuid_of(offset, self.namespace)

    def _initial_uuid(self, generation: int) -> str:
        return initial_uuid(self.namespace, self.tunnel_id, generation)

    @property
    def _marked_generation(self) -> int:
        """The generation after the newest one recorded as used in the namespace info (a
        hint: ``_open_generation`` checks it against the meta rows)."""
        return int(self._info.get("committed_generation", "-1")) + 1

    def _open_generation(self) -> int:
        """The first generation whose initial batch has no committed successor in the meta
        table, from the recorded marker on. Derived from the rows, so a lost marker write
        cannot hand a new query an initial offset an earlier query already committed after;
        the marker is rewritten (idempotently) when the rows show it is behind."""
        children: dict[str, list[BatchRecord]] = {}
        for b in self.meta.list_batches(self.namespace):
            if b.prev_uuid is not None:
                children.setdefault(b.prev_uuid, []).append(b)
        generation = self._marked_generation
        while any(c.state.rank >= BatchState.COMMITTED.rank
                  for c in children.get(self._initial_uuid(generation), ())):
            generation += 1
        if generation != self._marked_generation:
            self._record_generation(generation - 1)
        return generation

    def _record_generation(self, generation: int) -> None:
        if int(self._info.get("committed_generation", "-1")) < generation:
            self._info["committed_generation"] = str(generation)
            self.meta.set_namespace_info(self.namespace, self._info)

    def initial_offset(self) -> dict:
        """``initialOffset``: the same UUID every time until batch 0 of this query commits.

        The UUID is derived from the source identity, the tunnel id and a generation number.
        A generation is used once a batch after its initial batch has committed: a later query
        (a new checkpoint directory) starts the next generation from the tunnel's pushed
        checkpoints, while a restart of the same query never calls ``initialOffset`` again.
        """
        uuid = self._initial_uuid(self._open_generation())
        existing = self.meta.find_batch(self.namespace, uuid)
        if existing is None:
            manifest = Manifest(channels=tuple(self._tunnel_starts(exclude=set())),
                                planned_at=time.time())
            existing = self.meta.create_batch(self.namespace, uuid, None,
                                              state=BatchState.PUSHED, manifest=manifest)
        log.info("initial offset %s (%d channels)", uuid,
                 len(existing.manifest.channels) if existing.manifest else 0)
        return self.offset(uuid)

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

    def latest_offset(self, start: dict, max_rows: int | None) -> dict:
        """``latestOffset(start, limit)``: mint the end UUID of the next batch, or return
        ``start`` when nothing is new (``skipEmptyBatches``) or an AvailableNow run is done."""
        start_uuid = self.uuid_of(start)
        fault_point("latest_offset_start")
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
        positions = self.positions_after(start_uuid)
        if self._available_now_targets is not None and self._available_now_done(positions):
            return start
        if self.options.skip_empty_batches and self._available_now_targets is None:
            tokens = {ch: p.token for ch, p in positions.items()}
            if self.tunnel.has_new_data(self.tunnel_id, tokens) is False:
                return start
        end_uuid = str(uuid_lib.uuid4())
        self.meta.create_batch(self.namespace, end_uuid, start_uuid, max_rows=max_rows)
        fault_point("after_latest_offset")
        return self.offset(end_uuid, max_rows)

    # --- planning ------------------------------------------------------------------------------

    def positions_after(self, uuid: str) -> dict[str, Position]:
        """Every channel's position at the end of batch ``uuid``
        (``connector.planning.positions``), from the batch this process committed when it
        kept it, else from the meta table."""
        cached = self._committed.get(uuid)
        if cached is not None:
            batch, ends = cached
        else:
            batch = self._start_batch(uuid)
            ends = self.meta.get_end_checkpoints(self.namespace, uuid)
        return positions_after_batch(batch, ends)

    def plan(self, start: dict, end: dict) -> list[ChannelPartition]:
        """``partitions(start, end)``: one partition per readable channel of the batch."""
        began = time.perf_counter()
        start_uuid, end_uuid = self.uuid_of(start), self.uuid_of(end)
        if start_uuid == end_uuid:
            return []
        fault_point("plan_start")  # Spark's offset log already holds this batch
        batch = self.meta.find_batch(self.namespace, end_uuid)
        replay = batch is not None and batch.manifest is not None
        if replay:
            assert batch is not None and batch.manifest is not None
            manifest = batch.manifest
        else:
            # the limit travels in the offset: the minted row may have been collected
            max_rows = end.get("maxRows") or (batch.max_rows if batch is not None else None)
            manifest = self.meta.put_manifest(self.namespace, end_uuid, start_uuid,
                                              self._new_manifest(start_uuid, end_uuid, max_rows))
            self._known_tip = end_uuid  # just planned: nothing was planned after it
        partitions = [self._partition(end_uuid, c) for c in manifest.channels
                      if c.token != FINISHED and c.max_records > 0]
        self.last_batch = BatchStats(end_uuid, len(partitions), manifest.children_added,
                                     replay, (time.perf_counter() - began) * 1000)
        log.debug("batch %s planned%s: %d channel(s) to read, children added %s, %.1f ms",
                 end_uuid, " (replay)" if replay else "", len(partitions),
                 list(manifest.children_added), self.last_batch.plan_ms)
        return partitions

    def _new_manifest(self, start_uuid: str, end_uuid: str, max_rows: int | None) -> Manifest:
        positions = self.positions_after(start_uuid)
        children: list[str] = []
        if self._refresh_due():
            description = self.tunnel.describe_tunnel(self.options.table_name,
                                                      self.options.tunnel_name)
            status = {c.channel_id: c.status for c in description.channels}
            waiting = [c for c in description.channels if c.status is ChannelStatus.WAIT]
            self._waiting_parents = (None if any(not c.parent_ids for c in waiting)
                                     else {p for c in waiting for p in c.parent_ids})
            # a finished channel leaves the manifests once the tunnel confirms the push
            for channel_id in [ch for ch, p in positions.items() if p.finished]:
                if status.get(channel_id) is ChannelStatus.TERMINATED:
                    del positions[channel_id]
            for start in self._tunnel_starts(exclude=set(positions), channels=description.channels):
                positions[start.channel_id] = Position.at_start(start)
                children.append(start.channel_id)
            self._last_refresh = time.monotonic()
            self._force_refresh = False
        targets = self._available_now_targets
        if targets is not None:  # AvailableNow: channels born after the run started wait
            for channel_id in children:
                if channel_id not in targets:
                    del positions[channel_id]
            children = [c for c in children if c in targets]
        caps = self._caps(positions, max_rows, end_uuid)
        channels = tuple(
            ChannelStart(channel_id=ch, token=p.token, sequence_number=p.sequence_number,
                         max_records=caps.get(ch, 0), parent_ids=p.parent_ids,
                         last_sequence=p.last_sequence)
            for ch, p in sorted(positions.items())
        )
        return Manifest(channels=channels, children_added=tuple(children), planned_at=time.time())

    def _tunnel_starts(self, exclude: set[str], channels: Iterable | None = None
                       ) -> list[ChannelStart]:
        """Readable channels the tunnel offers that are not in ``exclude``, with their pushed
        checkpoints. Only OPEN channels: the tunnel keeps a child in WAIT until all its
        parents' FINISHED checkpoints are pushed."""
        if channels is None:
            channels = self.tunnel.describe_tunnel(self.options.table_name,
                                                   self.options.tunnel_name).channels
        starts = []
        for c in channels:
            if c.channel_id in exclude or c.status is not ChannelStatus.OPEN:
                continue
            checkpoint = self.tunnel.get_checkpoint(self.tunnel_id, c.channel_id)
            if checkpoint.finished:
                continue
            starts.append(ChannelStart(
                channel_id=c.channel_id, token=checkpoint.token,
                sequence_number=checkpoint.sequence_number,
                max_records=self.options.max_offsets_per_channel, parent_ids=c.parent_ids,
            ))
        return starts

    def _refresh_due(self) -> bool:
        interval_s = self.options.channel_refresh_interval_ms / 1000
        return self._force_refresh or time.monotonic() - self._last_refresh >= interval_s

    def _caps(self, positions: dict[str, Position], max_rows: int | None,
              end_uuid: str) -> dict[str, int]:
        """Per-channel record caps (``connector.planning.read_limits``). A ``ReadMaxRows``
        total is given where the data is, so only then is the tunnel asked for the backlog.
        The caps go into the manifest: a replay reads them from there, never recomputes them."""
        active = [ch for ch, p in positions.items() if not p.finished]
        backlog = None
        if max_rows is not None and active:
            backlog = self._backlog({ch: positions[ch].token for ch in active})
        return read_caps(active, per_channel=self.options.max_offsets_per_channel,
                         max_rows=max_rows, batch_uuid=end_uuid, backlog=backlog,
                         waiting_parents=self._waiting_parents)

    def _backlog(self, tokens: dict[str, str]) -> dict[str, int | None] | None:
        """Records behind per channel at ``tokens`` (the tunnel's ``lag``); ``None`` when the
        backend cannot tell."""
        try:
            lags = self.tunnel.lag(self.tunnel_id, tokens)
        except TunnelError as exc:  # the backlog only shapes the split: never fail a batch on it
            log.debug("no backlog figures (%s): splitting the read limit evenly", exc)
            return None
        if lags is None:
            return None
        return {ch: lag.records_behind for ch, lag in lags.items()}

    def _partition(self, end_uuid: str, start: ChannelStart) -> ChannelPartition:
        target = None
        if self._available_now_targets is not None:
            target = self._available_now_targets.get(start.channel_id)
        return ChannelPartition(
            namespace=self.namespace, meta_uri=self.options.meta_store,
            meta_credentials=tuple(sorted((self.options.meta_store_credentials or {}).items())),
            endpoint=self.options.endpoint, tunnel_id=self.tunnel_id, end_uuid=end_uuid,
            channel_id=start.channel_id, start_token=start.token,
            start_sequence_number=start.sequence_number, start_last_sequence=start.last_sequence,
            max_records=start.max_records, stop_after_sequence=target,
            fail_on_data_loss=self.options.fail_on_data_loss,
        )

    # --- commit and push -----------------------------------------------------------------------

    def commit(self, end: dict) -> None:
        """``commit(end)``: Spark durably finished the batch ending at ``end``."""
        end_uuid = self.uuid_of(end)
        fault_point("commit_start")  # Spark's commit log already holds this batch
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
        committed = self.meta.mark_committed(self.namespace, uuid)
        if committed:  # their end checkpoints in one query
            ends = self.meta.get_end_checkpoints_of(self.namespace, committed)
            for u in committed:
                self._on_committed(u, ends[u])
        self.push_if_due()
        self._committed_through = uuid

    def _on_committed(self, uuid: str, ends: dict[str, EndCheckpoint]) -> None:
        """The batch log line, and the generation marker once a batch 0 commits; keeps the
        batch and its ends for the push and the next batch's positions."""
        batch = self.meta.find_batch(self.namespace, uuid)
        if batch is None or batch.manifest is None:
            return
        self._committed[uuid] = (batch, ends)
        while len(self._committed) > max(8, self.options.commit_interval + 2):
            self._committed.popitem(last=False)
        log.info("batch %s committed: %d channel(s), %d record(s), children added %s",
                 uuid, len(ends), sum(e.records for e in ends.values()),
                 list(batch.manifest.children_added))
        # the marker is a hint (initial_offset derives the generation from the rows), so a
        # lost write here costs nothing but a look at the rows
        generation = self._marked_generation
        if batch.prev_uuid == self._initial_uuid(generation):
            self._record_generation(generation)

    def push_if_due(self, force: bool = False) -> list[str]:
        """Push the newest committed checkpoint of every channel to the tunnel when
        ``commitInterval`` committed batches are waiting, or at once when one of them finished
        a channel (its children are released only by that push). Returns pushed UUIDs."""
        pending = self.meta.committed_not_pushed(self.namespace)
        if not pending:
            return []
        newest: dict[str, EndCheckpoint] = {}
        ends = {b.uuid: self._committed[b.uuid][1] for b in pending if b.uuid in self._committed}
        missing = [b.uuid for b in pending if b.uuid not in ends]
        if missing:  # committed by an earlier process: one query for all of them
            ends.update(self.meta.get_end_checkpoints_of(self.namespace, missing))
        for batch in pending:  # oldest first: the newest end of each channel wins
            newest.update(ends[batch.uuid])
        finished = any(e.finished for e in newest.values())
        if not (force or finished or len(pending) >= self.options.commit_interval):
            return []
        for i, (channel_id, end) in enumerate(sorted(newest.items())):
            if i == 1:
                fault_point("mid_commit_push")
            position = (end.token, end.sequence_number)
            if self._pushed.get(channel_id) == position:
                continue  # this process already pushed it: an idle channel costs no call
            try:
                self.tunnel.checkpoint(self.tunnel_id, channel_id, Checkpoint(*position))
            except StaleCheckpointError:
                # the tunnel already holds a newer checkpoint (pushed before a crash)
                log.debug("channel %s: tunnel already ahead of %s", channel_id, end.summary())
            self._pushed[channel_id] = position
        uuids = [b.uuid for b in pending]
        self.meta.mark_pushed(self.namespace, uuids)
        if finished:
            self._force_refresh = True  # released children join the very next batch
        log.info("pushed checkpoints of %d channel(s) for %d batch(es)%s", len(newest),
                 len(uuids), " (a channel finished)" if finished else "")
        return uuids

    # --- Trigger.AvailableNow -----------------------------------------------------------------

    def prepare_available_now(self) -> None:
        """Fix the stopping point: every channel's newest record now. Channels created later
        are not read; channels that exist now (even waiting children) are read up to it."""
        heads = self.tunnel.head_sequences(self.tunnel_id)
        if heads is None:
            raise NotImplementedError(
                f"the tunnel backend of {self.options.safe_endpoint} cannot report channel "
                "heads, so Trigger.AvailableNow is not supported for it"
            )
        self._available_now_targets = heads
        self._force_refresh = True

    def _available_now_done(self, positions: dict[str, Position]) -> bool:
        targets = self._available_now_targets or {}
        description = self.tunnel.describe_tunnel(self.options.table_name,
                                                  self.options.tunnel_name)
        terminated = {c.channel_id for c in description.channels
                      if c.status is ChannelStatus.TERMINATED}
        for channel_id, target in targets.items():
            position = positions.get(channel_id)
            if position is None:
                # not read yet: done only if it had nothing, or it is already terminated
                if target and channel_id not in terminated:
                    return False
                continue
            if position.finished:
                if channel_id not in terminated:
                    self.push_if_due(force=True)  # release its children
                continue
            if target and (position.last_sequence or "") < target:
                return False
        return True
