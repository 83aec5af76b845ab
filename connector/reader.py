"""The executor side: read one channel of one batch, deterministically.

``ChannelPartition`` is what the driver's planner sends to executors: plain picklable data only
(ids, tokens, URIs, limits), never a live client. ``read_partition`` runs inside the stream
reader's ``read()`` in a Python worker on an executor and follows one rule:

    **the end of a channel's read is claimed in the meta store before any row is handed out.**

- If an end is already recorded for (batch UUID, channel), the read replays exactly that many
  records from the recorded start (an earlier attempt, a concurrent duplicate, a second read of
  the same batch by a foreachBatch function, or a killed query's leftover worker wrote it).
- Otherwise it reads from the start checkpoint up to the cap or until nothing more is available
  right now (never sleeping per channel), claims that end with put-if-absent, and on losing the
  race to another attempt reads exactly to the winner's end instead.

So every read of a batch yields the same rows, and no task ever has to fail to be right.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from connector.errors import EndCheckpointConflictError, ReplayDivergedError, TrimmedDataError
from connector.faults import fault_point, inject_transient_errors
from connector.retry import with_retries
from connector.tunnel import FINISHED, Record, TunnelService, open_tunnel_service
from meta_store import EndCheckpoint, MetaStore, open_meta_store

log = logging.getLogger("connector.reader")

#: records per tunnel call; a cap above it takes several calls
PAGE_SIZE = 1000


@dataclass(frozen=True)
class ChannelPartition(InputPartition):
    """One channel of one batch (built on the driver, read on an executor)."""

    namespace: str
    meta_uri: str
    endpoint: str
    tunnel_id: str
    end_uuid: str
    channel_id: str
    start_token: str
    start_sequence_number: int
    start_last_sequence: str | None
    max_records: int
    #: AvailableNow: do not read records whose sequence sorts after this
    stop_after_sequence: str | None
    fail_on_data_loss: bool


# Python workers are reused across tasks: keep one client per URI per process.
_META_STORES: dict[str, MetaStore] = {}
_TUNNELS: dict[str, TunnelService] = {}


def _clients(p: ChannelPartition) -> tuple[MetaStore, TunnelService]:
    # transient errors are retried (connector.retry); the injection is inert in production
    if p.meta_uri not in _META_STORES:
        _META_STORES[p.meta_uri] = with_retries(inject_transient_errors(
            open_meta_store(p.meta_uri)))
    if p.endpoint not in _TUNNELS:
        _TUNNELS[p.endpoint] = with_retries(inject_transient_errors(
            open_tunnel_service(p.endpoint)))
    return _META_STORES[p.meta_uri], _TUNNELS[p.endpoint]


def attempt_identity() -> str:
    """host/pid/task-attempt of the running read, recorded with the claim for operators."""
    task = ""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:
            task = f"/stage{context.stageId()}.task{context.taskAttemptId()}"
    except Exception:  # outside Spark (tests): host/pid is enough
        pass
    return f"{socket.gethostname()}/{os.getpid()}{task}"


def read_partition(p: ChannelPartition) -> list[Record]:
    """Return the channel's records for this batch, identical on every call (executor)."""
    meta, tunnel = _clients(p)
    claimed = meta.get_end_checkpoint(p.namespace, p.end_uuid, p.channel_id)
    if claimed is not None:
        return _replay(tunnel, p, claimed)

    start_token, records, next_token, reached_bound = _fetch(tunnel, p)
    end = EndCheckpoint(
        channel_id=p.channel_id,
        start_token=start_token,
        token=next_token,
        sequence_number=p.start_sequence_number + len(records)
        + (1 if next_token == FINISHED else 0),
        records=len(records),
        attempt=attempt_identity(),
        written_at=time.time(),
        last_sequence=_last_sequence(p, records, reached_bound),
    )
    fault_point("read_before_claim", {"partition": p, "end": end})
    try:
        meta.put_end_checkpoint(p.namespace, p.end_uuid, end)
    except EndCheckpointConflictError as conflict:
        winner: EndCheckpoint = conflict.stored
        log.info("batch %s channel %s: another attempt claimed first (%s); following it",
                 p.end_uuid, p.channel_id, winner.summary())
        if winner.start_token == start_token and winner.records <= len(records):
            return records[: winner.records]
        return _replay(tunnel, p, winner)
    fault_point("mid_read", {"partition": p, "end": end})
    return records


def _last_sequence(p: ChannelPartition, records: list[Record], reached_bound: bool) -> str | None:
    last = records[-1].sequence if records else p.start_last_sequence
    if reached_bound and p.stop_after_sequence is not None:
        # everything up to the AvailableNow bound is consumed, even if the last record read
        # (or the pushed checkpoint we started from) sorts lower
        return max(last or "", p.stop_after_sequence)
    return last


def _fetch(tunnel: TunnelService, p: ChannelPartition
           ) -> tuple[str, list[Record], str, bool]:
    """Read from the start up to the cap, the AvailableNow bound, or what is available now.

    Returns (start token actually used, records, next token, whether the read stopped because
    nothing more is available or the bound was reached)."""
    start_token = p.start_token
    records: list[Record] = []
    token = start_token
    while len(records) < p.max_records:
        want = min(PAGE_SIZE, p.max_records - len(records))
        try:
            result = tunnel.read_records(p.tunnel_id, p.channel_id, token, want)
        except TrimmedDataError as lost:
            if p.fail_on_data_loss or records:
                raise
            log.warning("%s; continuing after the gap because failOnDataLoss=false", lost)
            start_token = token = lost.resume_token
            continue
        page = list(result.records)
        bound = p.stop_after_sequence
        if bound is not None and page and page[-1].sequence > bound:
            keep = sum(1 for r in page if r.sequence <= bound)
            # re-read exactly the kept records so the next token lands right after them
            if keep:
                exact = tunnel.read_records(p.tunnel_id, p.channel_id, token, keep)
                records.extend(exact.records)
                token = exact.next_token
            return start_token, records, token, True
        records.extend(page)
        token = result.next_token
        if token == FINISHED or not result.may_more:
            return start_token, records, token, True
    return start_token, records, token, False


def _replay(tunnel: TunnelService, p: ChannelPartition, end: EndCheckpoint) -> list[Record]:
    """Read exactly the ``end.records`` records after ``end.start_token``."""
    records: list[Record] = []
    token = end.start_token
    while len(records) < end.records:
        result = tunnel.read_records(p.tunnel_id, p.channel_id, token,
                                     min(PAGE_SIZE, end.records - len(records)))
        if not result.records:
            break
        records.extend(result.records)
        token = result.next_token
    if len(records) != end.records:  # history changed under a recorded end: never guess
        raise ReplayDivergedError(uuid=p.end_uuid, channel_id=p.channel_id,
                                  expected=end.records, expected_token=end.token,
                                  got=len(records), got_token=token)
    return records


def iter_partition_records(p: ChannelPartition) -> Iterator[Record]:
    """Records of the partition with their channel id set (executor)."""
    for record in read_partition(p):
        if record.channel_id != p.channel_id:
            yield Record(record.op, record.primary_key, record.columns, record.before,
                         record.sequence, record.commit_ts_us, p.channel_id)
        else:
            yield record
