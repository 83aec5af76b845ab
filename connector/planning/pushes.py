"""Checkpoint pushes: telling the tunnel how far the committed batches got (driver only).

The tunnel's checkpoints are a progress report and the release signal for children; the meta
table is what restarts use. ``CheckpointPushes`` is owned by ``StreamProtocol`` in Spark's
planning process:

- ``record_commits`` marks a batch and its uncommitted ancestors committed (commits catch up:
  Spark does not re-send a commit lost in a crash) and keeps each committed batch's row and end
  checkpoints. Both are final once the batch is committed (manifests are write-once, every claim
  is in), so the push and the next batch's positions reuse them instead of decoding them again;
- ``push_if_due`` pushes every channel's newest committed end when ``commitInterval`` committed
  batches are waiting, or at once when one of them finished a channel (the tunnel releases a
  child only after its parents' FINISHED checkpoints are pushed). A position this process
  already pushed is not pushed again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from connector.errors import StaleCheckpointError
from connector.faults import fault_point
from connector.planning.logs import log
from connector.tunnel import Checkpoint, TunnelService
from meta_store import BatchRecord, EndCheckpoint, MetaStore


@dataclass(frozen=True)
class Push:
    """What ``push_if_due`` did."""

    #: the batches marked pushed (empty: nothing was due)
    uuids: list[str] = field(default_factory=list)
    #: a pushed end finished a channel: its children are released
    finished: bool = False


class CheckpointPushes:
    """Commit catch-up and checkpoint pushes of one namespace (driver only)."""

    def __init__(self, meta: MetaStore, tunnel: TunnelService, namespace: str, tunnel_id: str,
                 commit_interval: int) -> None:
        self._meta = meta
        self._tunnel = tunnel
        self._namespace = namespace
        self._tunnel_id = tunnel_id
        self._commit_interval = commit_interval
        #: committed batches' rows and end checkpoints, newest last
        self._committed: OrderedDict[str, tuple[BatchRecord, dict[str, EndCheckpoint]]] = (
            OrderedDict())
        #: what this process last pushed per channel: an unchanged position is not pushed again
        self._pushed: dict[str, tuple[str, int]] = {}

    def committed_batch(self, uuid: str) -> tuple[BatchRecord, dict[str, EndCheckpoint]] | None:
        """The row and end checkpoints of committed batch ``uuid``, if this process kept them."""
        return self._committed.get(uuid)

    def record_commits(self, uuid: str) -> Iterator[BatchRecord]:
        """Mark ``uuid`` and its uncommitted ancestors committed (their end checkpoints in one
        query) and yield each newly committed batch, oldest first, as it is recorded: the
        caller acts on one (the generation marker) before the next is read. Logs the batch
        line of each."""
        committed = self._meta.mark_committed(self._namespace, uuid)
        if not committed:
            return
        ends = self._meta.get_end_checkpoints_of(self._namespace, committed)
        for u in committed:
            batch = self._meta.find_batch(self._namespace, u)
            if batch is None or batch.manifest is None:
                continue
            self._committed[u] = (batch, ends[u])
            while len(self._committed) > max(8, self._commit_interval + 2):
                self._committed.popitem(last=False)
            log.info("batch %s committed: %d channel(s), %d record(s), children added %s",
                     u, len(ends[u]), sum(e.records for e in ends[u].values()),
                     list(batch.manifest.children_added))
            yield batch

    def push_if_due(self, force: bool = False) -> Push:
        """Push the newest committed checkpoint of every channel to the tunnel when
        ``commitInterval`` committed batches are waiting, at once when one of them finished a
        channel, or when ``force``d; then mark those batches pushed."""
        pending = self._meta.committed_not_pushed(self._namespace)
        if not pending:
            return Push()
        newest: dict[str, EndCheckpoint] = {}
        ends = {b.uuid: self._committed[b.uuid][1] for b in pending if b.uuid in self._committed}
        missing = [b.uuid for b in pending if b.uuid not in ends]
        if missing:  # committed by an earlier process: one query for all of them
            ends.update(self._meta.get_end_checkpoints_of(self._namespace, missing))
        for batch in pending:  # oldest first: the newest end of each channel wins
            newest.update(ends[batch.uuid])
        finished = any(e.finished for e in newest.values())
        if not (force or finished or len(pending) >= self._commit_interval):
            return Push()
        for i, (channel_id, end) in enumerate(sorted(newest.items())):
            if i == 1:
                fault_point("mid_commit_push")
            position = (end.token, end.sequence_number)
            if self._pushed.get(channel_id) == position:
                continue  # this process already pushed it: an idle channel costs no call
            try:
                self._tunnel.checkpoint(self._tunnel_id, channel_id, Checkpoint(*position))
            except StaleCheckpointError:
                # A refused "finished" would keep the channel's children in WAIT for good:
                # it passes only when the tunnel holds "finished" already, else it fails the
                # commit loudly (the backend has retried it after re-reading the stored number)
                if end.finished and not self._tunnel.get_checkpoint(self._tunnel_id,
                                                                    channel_id).finished:
                    raise
                # the tunnel already holds a newer checkpoint (pushed before a crash)
                log.debug("channel %s: tunnel already ahead of %s", channel_id, end.summary())
            self._pushed[channel_id] = position
        uuids = [b.uuid for b in pending]
        self._meta.mark_pushed(self._namespace, uuids)
        log.info("pushed checkpoints of %d channel(s) for %d batch(es)%s", len(newest),
                 len(uuids), " (a channel finished)" if finished else "")
        return Push(uuids, finished)
