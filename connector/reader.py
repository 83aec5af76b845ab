"""The executor side: read one channel of one batch, deterministically.

``ChannelPartition`` (``connector.partition``) is what the driver's planner sends to executors:
plain picklable data only (ids, tokens, URIs, limits), never a live client. ``claim_and_read``
runs inside the stream reader's ``read()`` in a Python worker on an executor and follows one
rule:

    **the end of a channel's read is claimed in the meta store before any row is handed out.**

- If an end is already recorded for (batch UUID, channel), the read replays exactly that many
  records from the recorded start (an earlier attempt, a concurrent duplicate, a second read of
  the same batch by a foreachBatch function, or a killed query's leftover worker wrote it).
- Otherwise it reads from the start checkpoint up to the cap or until nothing more is available
  right now (never sleeping per channel), claims that end with put-if-absent, and on losing the
  race to another attempt reads exactly to the winner's end instead.

So every read of a batch yields the same rows, and no task ever has to fail to be right.

The rows travel as columnar pages (``TunnelService.read_page``, ``connector.tunnel.page``):
Arrow batches from the tunnel to Spark, held until the claim is recorded and then yielded. The
claim needs only the record count, the end token and the last ``_sequence`` (read from the
Arrow column), so no Python object is built per record; the AvailableNow bound is applied on the
``_sequence`` column too.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from connector.errors import EndCheckpointConflictError, ReplayDivergedError, TrimmedDataError
from connector.faults import fault_point, inject_transient_errors
from connector.partition import ChannelPartition
from connector.retry import with_retries
from connector.tunnel import FINISHED, Record, TableSchema, TunnelService, open_tunnel_service
from connector.tunnel.page import Page, PageLayout, page_to_records
from meta_store import EndCheckpoint, MetaStore, open_meta_store

log = logging.getLogger("connector.reader")

#: records per tunnel call (one Arrow batch handed to Spark); a cap above it takes several calls
PAGE_SIZE = 8192


# Python workers are reused across tasks: keep one client per URI per process.
_META_STORES: dict[tuple[str, tuple[tuple[str, str], ...]], MetaStore] = {}
_TUNNELS: dict[str, TunnelService] = {}


def _clients(p: ChannelPartition) -> tuple[MetaStore, TunnelService]:
    # transient errors are retried (connector.retry); the injection is inert in production
    meta_key = (p.meta_uri, p.meta_credentials)
    if meta_key not in _META_STORES:
        _META_STORES[meta_key] = with_retries(inject_transient_errors(
            open_meta_store(p.meta_uri, dict(p.meta_credentials) or None)))
    if p.endpoint not in _TUNNELS:
        _TUNNELS[p.endpoint] = with_retries(inject_transient_errors(
            open_tunnel_service(p.endpoint)))
    return _META_STORES[meta_key], _TUNNELS[p.endpoint]


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


@dataclass
class ClaimedRead:
    """One channel's rows of one batch, claimed: ``end`` is recorded in the meta store and
    ``pages`` (``connector.tunnel.page``) hold exactly ``end.records`` rows."""

    end: EndCheckpoint
    pages: list[Page]

    @property
    def count(self) -> int:
        return sum(page.count for page in self.pages)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The page batches in order, each page dropped once handed on (memory shrinks as the
        consumer takes them; an encoded page is decoded only here)."""
        self.pages.reverse()
        while self.pages:
            yield self.pages.pop().batch


def claim_and_read(p: ChannelPartition, layout: PageLayout) -> ClaimedRead:
    """Read the channel's pages for this batch, claim their end, return them (executor).

    Identical rows on every call. The pages stay Arrow from the tunnel to the caller: the claim
    needs only the record count and the end token, so no Python object per record is made.
    """
    meta, tunnel = _clients(p)
    claimed = meta.get_end_checkpoint(p.namespace, p.end_uuid, p.channel_id)
    if claimed is not None:
        return ClaimedRead(claimed, _replay(tunnel, p, claimed, layout))

    start_token, pages, next_token, reached_bound = _fetch(tunnel, p, layout)
    count = sum(page.count for page in pages)
    end = EndCheckpoint(
        channel_id=p.channel_id,
        start_token=start_token,
        token=next_token,
        sequence_number=p.start_sequence_number + count + (1 if next_token == FINISHED else 0),
        records=count,
        attempt=attempt_identity(),
        written_at=time.time(),
        last_sequence=_last_sequence(p, pages, reached_bound),
    )
    fault_point("read_before_claim", {"partition": p, "end": end})
    try:
        meta.put_end_checkpoint(p.namespace, p.end_uuid, end)
    except EndCheckpointConflictError as conflict:
        winner: EndCheckpoint = conflict.stored
        log.info("batch %s channel %s: another attempt claimed first (%s); following it",
                 p.end_uuid, p.channel_id, winner.summary())
        if winner.start_token == start_token and winner.records <= count:
            return ClaimedRead(winner, _head(pages, winner.records))
        return ClaimedRead(winner, _replay(tunnel, p, winner, layout))
    fault_point("mid_read", {"partition": p, "end": end})
    return ClaimedRead(end, pages)


def _head(pages: list[Page], n: int) -> list[Page]:
    """The first ``n`` rows of ``pages`` (slices, no copy)."""
    out = []
    for page in pages:
        if n <= 0:
            break
        out.append(page if page.count <= n else page.head(n))
        n -= page.count
    return out


def _last_sequence(p: ChannelPartition, pages: list[Page], reached_bound: bool) -> str | None:
    last = p.start_last_sequence
    for page in reversed(pages):
        if page.count:
            last = page.last_sequence
            break
    if reached_bound and p.stop_after_sequence is not None:
        # everything up to the AvailableNow bound is consumed, even if the last record read
        # (or the pushed checkpoint we started from) sorts lower
        return max(last or "", p.stop_after_sequence)
    return last


def _fetch(tunnel: TunnelService, p: ChannelPartition, layout: PageLayout
           ) -> tuple[str, list[Page], str, bool]:
    """Read from the start up to the cap, the AvailableNow bound, or what is available now.

    Returns (start token actually used, page batches, next token, whether the read stopped
    because nothing more is available or the bound was reached)."""
    start_token = p.start_token
    pages: list[Page] = []
    count = 0
    token = start_token
    while count < p.max_records:
        want = min(PAGE_SIZE, p.max_records - count)
        try:
            page = tunnel.read_page(p.tunnel_id, p.channel_id, token, want, layout)
        except TrimmedDataError as lost:
            if p.fail_on_data_loss or pages:
                raise
            log.warning("%s; continuing after the gap because failOnDataLoss=false", lost)
            start_token = token = lost.resume_token
            continue
        bound = p.stop_after_sequence
        if bound is not None and page.count and (page.last_sequence or "") > bound:
            # sequences increase within a channel: the kept rows are a prefix
            keep = pc.sum(pc.less_equal(page.batch.column("_sequence"), bound)).as_py() or 0
            # re-read exactly the kept records so the next token lands right after them
            if keep:
                exact = tunnel.read_page(p.tunnel_id, p.channel_id, token, keep, layout)
                pages.append(exact)
                token = exact.next_token
            return start_token, pages, token, True
        if page.count:
            pages.append(page)
            count += page.count
        token = page.next_token
        if token == FINISHED or not page.may_more:
            return start_token, pages, token, True
    return start_token, pages, token, False


def _replay(tunnel: TunnelService, p: ChannelPartition, end: EndCheckpoint,
            layout: PageLayout) -> list[Page]:
    """Read exactly the ``end.records`` records after ``end.start_token``."""
    pages: list[Page] = []
    count = 0
    token = end.start_token
    while count < end.records:
        page = tunnel.read_page(p.tunnel_id, p.channel_id, token,
                                min(PAGE_SIZE, end.records - count), layout)
        if not page.count:
            break
        pages.append(page)
        count += page.count
        token = page.next_token
    if count != end.records:  # history changed under a recorded end: never guess
        raise ReplayDivergedError(uuid=p.end_uuid, channel_id=p.channel_id,
                                  expected=end.records, expected_token=end.token,
                                  got=count, got_token=token)
    return pages


def read_partition(p: ChannelPartition, table: TableSchema | None = None) -> list[Record]:
    """The claimed records of the partition as ``Record`` objects, channel id set (tests and
    the fault harness, to compare reads record by record; the source reads pages with
    ``claim_and_read``). Values are the declared columns plus undeclared ones; an UPDATE's
    ``columns`` is the whole row after it (see ``page_to_records``)."""
    _, tunnel = _clients(p)
    if table is None:
        name = next(t.table_name for t in tunnel.list_tunnels() if t.tunnel_id == p.tunnel_id)
        table = tunnel.table_schema(name)
    read = claim_and_read(p, PageLayout.of_table(table))
    return [r for batch in read.batches() for r in page_to_records(batch, table, p.channel_id)]
