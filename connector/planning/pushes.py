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

The pushes of one round are independent calls, one per channel: over a network each is a round
trip, so they run ``tunnel.concurrent_calls`` at a time (1 for the embedded store: one after
another, as threads would only add cost, and the first failure stops the round): first through
the tunnel's ``checkpoint_many`` (the Tablestore client keeps that many requests in flight from
this one thread), then whatever it did not push on a bounded pool of that many threads, each
through ``checkpoint`` with its every rule and error. Every push is waited for; one that fails
(after the tunnel's own retries) fails the round with the first failed channel's error, and the
batches are not marked pushed, so the next round pushes again (a channel whose push succeeded
is recorded and not pushed twice). The fault point ``mid_commit_push`` still comes after the
first channel's push and before the others.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from connector.crash_hook import crash_point
from connector.errors import StaleCheckpointError
from connector.planning.logs import log
from connector.tunnel import ChannelPositions, Checkpoint
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

    def __init__(self, meta: MetaStore, tunnel: ChannelPositions, namespace: str, tunnel_id: str,
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
        #: pushes at once (``ChannelPositions.concurrent_calls``); the pool is made on first use
        self._concurrency = max(1, int(getattr(tunnel, "concurrent_calls", 1)))
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the push pool's threads (``StreamProtocol.close``)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

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
        channels = sorted(newest.items())
        errors: dict[str, BaseException] = {}
        for i, (channel_id, end) in enumerate(channels):
            if i == 1:
                crash_point("mid_commit_push")  # some channels pushed, others not
                if self._concurrency > 1 and len(channels) > 2:
                    self._push_all(channels[1:], errors)
                    break
            self._push(channel_id, end, errors)
            if errors:
                break  # one after another: the first failure stops the round, as it always did
        if errors:
            raise errors[min(errors)]  # the first failed channel's error
        uuids = [b.uuid for b in pending]
        self._meta.mark_pushed(self._namespace, uuids)
        log.info("pushed checkpoints of %d channel(s) for %d batch(es)%s", len(newest),
                 len(uuids), " (a channel finished)" if finished else "")
        return Push(uuids, finished)

    def _push_all(self, channels: list[tuple[str, EndCheckpoint]],
                  errors: dict[str, BaseException]) -> None:
        """Push ``channels`` at once: those the tunnel's ``checkpoint_many`` takes, then the
        rest (all of them on a backend without it) on the pool, ``concurrent_calls`` at a time;
        waits for all."""
        todo = [(channel_id, end) for channel_id, end in channels
                if self._pushed.get(channel_id) != (end.token, end.sequence_number)]
        left = set(self._tunnel.checkpoint_many(self._tunnel_id, [
            (channel_id, Checkpoint(end.token, end.sequence_number)) for channel_id, end in todo]))
        for channel_id, end in todo:
            if channel_id not in left:
                self._pushed[channel_id] = (end.token, end.sequence_number)
        channels = [(channel_id, end) for channel_id, end in todo if channel_id in left]
        if not channels:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="checkpoint-push")
        for future in [self._pool.submit(self._push, channel_id, end, errors)
                       for channel_id, end in channels]:
            future.result()

    def _push(self, channel_id: str, end: EndCheckpoint,
              errors: dict[str, BaseException]) -> None:
        """Push one channel's end (a pool thread, or the caller's); a failure goes to
        ``errors`` and leaves the channel unrecorded."""
        position = (end.token, end.sequence_number)
        if self._pushed.get(channel_id) == position:
            return  # this process already pushed it: an idle channel costs no call
        try:
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
        except Exception as error:  # noqa: BLE001 - raised by push_if_due, in channel order
            errors[channel_id] = error
            return
        self._pushed[channel_id] = position
