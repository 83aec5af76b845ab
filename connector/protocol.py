"""The driver side of the UUID-offset protocol (docs/protocol.md).

``StreamProtocol`` is owned by the stream reader in Spark's planning process on the driver; it is
never pickled to executors (``ChannelPartition``s are). Spark calls, per micro-batch::

    latestOffset(start)  -> latest_offset   mint a UUID (or return start: nothing new)
    commit(end of N-1)   -> commit          mark committed; push checkpoints when due
    partitions(start,end)-> plan            reuse or write the batch manifest; one partition
                                            per readable channel
    read(partition)      -> connector.reader.read_partition (executors)

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

import logging
import os
import time
import uuid as uuid_lib
from collections.abc import Iterable
from dataclasses import dataclass

from connector.errors import CheckpointMismatchError, OptionError, StaleCheckpointError
from connector.faults import fault_point, inject_transient_errors
from connector.options import SourceOptions
from connector.reader import ChannelPartition
from connector.retry import with_retries
from connector.tunnel import (
    FINISHED,
    ChannelStatus,
    Checkpoint,
    TunnelService,
    open_tunnel_service,
)
from meta_store import (
    BatchState,
    ChannelStart,
    EndCheckpoint,
    Manifest,
    MetaStore,
    open_meta_store,
)

log = logging.getLogger("connector.protocol")

#: minted-but-never-planned UUIDs older than this are garbage-collected
ORPHAN_RETENTION_S = 3600.0


@dataclass(frozen=True)
class Position:
    """Where a channel stands at the end of a batch (or the start of the next)."""

    token: str
    sequence_number: int
    last_sequence: str | None
    parent_ids: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        return self.token == FINISHED


@dataclass
class BatchStats:
    """What the last planned batch looked like (for the batch log line and tests)."""

    uuid: str
    channels: int
    children_added: tuple[str, ...]
    replay: bool
    plan_ms: float


LOG_LEVEL_ENV = "TABLESTORE_CDC_LOG_LEVEL"


def configure_planner_logging() -> None:
    """Spark's planning process starts with no logging configured, which would drop the
    per-batch INFO line: log this package to stderr (Spark's driver log) at the level in
    ``TABLESTORE_CDC_LOG_LEVEL`` (default INFO), unless the process already configured logging."""
    package = logging.getLogger("connector")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(os.environ.get(LOG_LEVEL_ENV, "INFO").upper())


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
            open_meta_store(options.meta_store)))
        info = self.tunnel.ensure_tunnel(
            options.table_name, options.tunnel_name, options.tunnel_type,
            options.starting_position,
        )
        if info.tunnel_type is not options.tunnel_type:
            raise OptionError(option="tunnel.type", value=options.tunnel_type.value,
                              problem=f"tunnel {options.tunnel_name!r} already exists with type "
                              f"{info.tunnel_type.value}",
                              allowed=f"{info.tunnel_type.value}, or another tunnel.name")
        self.tunnel_id = info.tunnel_id
        self._info = {
            **(self.meta.get_namespace_info(self.namespace) or {}),
            "endpoint": options.safe_endpoint, "table": options.table_name,
            "tunnel": options.tunnel_name, "tunnel_id": self.tunnel_id,
        }
        self.meta.set_namespace_info(self.namespace, self._info)
        self._committed_through: str | None = None
        self._last_refresh = 0.0
        self._force_refresh = True
        self._available_now_targets: dict[str, str] | None = None
        self.last_batch: BatchStats | None = None

    def close(self) -> None:
        self.tunnel.close()
        self.meta.close()

    # --- offsets -----------------------------------------------------------------------------

    def offset(self, uuid: str) -> dict[str, str]:
        return {"uuid": uuid, "source": self.namespace}

    def uuid_of(self, offset: dict) -> str:
        """The UUID of an offset from Spark's log; refuses an offset of another source."""
        found = offset.get("source")
        if found != self.namespace:
            raise CheckpointMismatchError(expected=self.namespace, found=found)
        return str(offset["uuid"])

    def _initial_uuid(self, generation: int) -> str:
        return str(uuid_lib.uuid5(uuid_lib.NAMESPACE_URL,
                                  f"{self.namespace}#{self.tunnel_id}#{generation}"))

    @property
    def _open_generation(self) -> int:
        """The generation whose batch 0 has not committed yet (recorded durably in the
        namespace info by ``_commit_through``, so retention cannot change it)."""
        return int(self._info.get("committed_generation", "-1")) + 1

    def initial_offset(self) -> dict[str, str]:
        """``initialOffset``: the same UUID every time until batch 0 of this query commits.

        The UUID is derived from the source identity, the tunnel id and a generation number.
        Once a generation's batch 0 commits, the generation is recorded as used: a later query
        (a new checkpoint directory) starts the next generation from the tunnel's pushed
        checkpoints, while a restart of the same query never calls ``initialOffset`` again.
        """
        uuid = self._initial_uuid(self._open_generation)
        existing = self.meta.find_batch(self.namespace, uuid)
        if existing is None:
            manifest = Manifest(channels=tuple(self._tunnel_starts(exclude=set())),
                                planned_at=time.time())
            existing = self.meta.create_batch(self.namespace, uuid, None,
                                              state=BatchState.PUSHED, manifest=manifest)
        log.info("initial offset %s (%d channels)", uuid,
                 len(existing.manifest.channels) if existing.manifest else 0)
        return self.offset(uuid)

    def latest_offset(self, start: dict, max_rows: int | None) -> dict[str, str]:
        """``latestOffset(start, limit)``: mint the end UUID of the next batch, or return
        ``start`` when nothing is new (``skipEmptyBatches``) or an AvailableNow run is done."""
        start_uuid = self.uuid_of(start)
        fault_point("latest_offset_start")
        # Spark asks for a new batch only once the batch ending at `start` is in its commit
        # log: catch up a commit lost in a crash before anything else.
        self._commit_through(start_uuid)
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
        return self.offset(end_uuid)

    # --- planning ------------------------------------------------------------------------------

    def positions_after(self, uuid: str) -> dict[str, Position]:
        """Every channel's position at the end of batch ``uuid``: its end checkpoint, or its
        manifest start for a channel that wrote none."""
        batch = self.meta.get_batch(self.namespace, uuid)
        ends = self.meta.get_end_checkpoints(self.namespace, uuid)
        positions: dict[str, Position] = {}
        for start in batch.manifest.channels if batch.manifest else ():
            end: EndCheckpoint | None = ends.get(start.channel_id)
            if end is not None:
                positions[start.channel_id] = Position(end.token, end.sequence_number,
                                                       end.last_sequence, start.parent_ids)
            else:
                positions[start.channel_id] = Position(start.token, start.sequence_number,
                                                       start.last_sequence, start.parent_ids)
        return positions

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
            max_rows = batch.max_rows if batch is not None else None
            manifest = self.meta.put_manifest(self.namespace, end_uuid, start_uuid,
                                              self._new_manifest(start_uuid, end_uuid, max_rows))
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
            # a finished channel leaves the manifests once the tunnel confirms the push
            for channel_id in [ch for ch, p in positions.items() if p.finished]:
                if status.get(channel_id) is ChannelStatus.TERMINATED:
                    del positions[channel_id]
            for start in self._tunnel_starts(exclude=set(positions), channels=description.channels):
                positions[start.channel_id] = Position(start.token, start.sequence_number,
                                                       start.last_sequence, start.parent_ids)
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
        """Per-channel record caps: ``maxOffsetsPerChannel``, and a ``ReadMaxRows`` total split
        evenly (the remainder rotates by batch so no channel starves)."""
        active = sorted(ch for ch, p in positions.items() if not p.finished)
        per_channel = self.options.max_offsets_per_channel
        if max_rows is None or not active:
            return dict.fromkeys(active, per_channel)
        share, remainder = divmod(max_rows, len(active))
        offset = uuid_lib.UUID(end_uuid).int % len(active)
        rotated = active[offset:] + active[:offset]
        return {ch: min(per_channel, share + (1 if i < remainder else 0))
                for i, ch in enumerate(rotated)}

    def _partition(self, end_uuid: str, start: ChannelStart) -> ChannelPartition:
        target = None
        if self._available_now_targets is not None:
            target = self._available_now_targets.get(start.channel_id)
        return ChannelPartition(
            namespace=self.namespace, meta_uri=self.options.meta_store,
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
        for committed in self.meta.mark_committed(self.namespace, uuid):
            self._on_committed(committed)
        self.push_if_due()
        self._committed_through = uuid

    def _on_committed(self, uuid: str) -> None:
        """The batch log line, and the generation marker once a batch 0 commits."""
        batch = self.meta.find_batch(self.namespace, uuid)
        if batch is None or batch.manifest is None:
            return
        ends = self.meta.get_end_checkpoints(self.namespace, uuid)
        log.info("batch %s committed: %d channel(s), %d record(s), children added %s",
                 uuid, len(ends), sum(e.records for e in ends.values()),
                 list(batch.manifest.children_added))
        generation = self._open_generation
        if batch.prev_uuid == self._initial_uuid(generation):
            self._info["committed_generation"] = str(generation)
            self.meta.set_namespace_info(self.namespace, self._info)

    def push_if_due(self, force: bool = False) -> list[str]:
        """Push the newest committed checkpoint of every channel to the tunnel when
        ``commitInterval`` committed batches are waiting, or at once when one of them finished
        a channel (its children are released only by that push). Returns pushed UUIDs."""
        pending = self.meta.committed_not_pushed(self.namespace)
        if not pending:
            return []
        newest: dict[str, EndCheckpoint] = {}
        for batch in pending:
            newest.update(self.meta.get_end_checkpoints(self.namespace, batch.uuid))
        finished = any(e.finished for e in newest.values())
        if not (force or finished or len(pending) >= self.options.commit_interval):
            return []
        for i, (channel_id, end) in enumerate(sorted(newest.items())):
            if i == 1:
                fault_point("mid_commit_push")
            try:
                self.tunnel.checkpoint(self.tunnel_id, channel_id,
                                       Checkpoint(end.token, end.sequence_number))
            except StaleCheckpointError:
                # the tunnel already holds a newer checkpoint (pushed before a crash)
                log.debug("channel %s: tunnel already ahead of %s", channel_id, end.summary())
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
