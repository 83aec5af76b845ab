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

How far a read goes is the stop rule's to say (``connector.stop_rule``: pure, tested on its
own); ``fetch_pages`` is its I/O loop. The clients come from the process's pool
(``connector.clients.executor_clients``: the meta store and the tunnel's reading role only,
``ChannelReader``), opened once per endpoint and retried there. ``read_rows`` is the
executor read of both stream readers: the claimed pages projected onto the output schema.

The rows travel as columnar pages (``ChannelReader.read_page``, ``connector.tunnel.page``):
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from connector.clients import executor_clients
from connector.crash_hook import crash_point
from connector.data_loss import resnapshot_on_gap
from connector.errors import EndCheckpointConflictError, ReplayDivergedError, TrimmedDataError
from connector.partition import ChannelPartition
from connector.schema import READ_OP, RecordBatchBuilder, mark_snapshot_reads
from connector.stop_rule import MAX_EMPTY_PAGES, PAGE_SIZE, StopRule, commit_micros
from connector.tunnel import FINISHED, ChannelReader
from connector.tunnel.page import Page, PageLayout
from meta_store import EndCheckpoint

log = logging.getLogger("connector.reader")


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


def read_rows(p: ChannelPartition, builder: RecordBatchBuilder,
              snapshot_op: str = "PUT") -> Iterator[pa.RecordBatch]:
    """The output rows of one channel of one batch (executor): the one read both stream
    readers' ``read`` go through (``connector.source`` for one table, ``connector.multiplex``
    for each table of a selection). The channel's end is claimed (``claim_and_read``) before
    any row is yielded, so a refusal while projecting (``SchemaChangeError``) replays the batch
    exactly; each page is dropped once handed on, so memory shrinks as Spark consumes.
    ``snapshot_op``: READ marks the rows of base data (``snapshot.op``)."""
    # snapshot.op=READ: the backend tells base-data rows from the channel and the rows
    snapshots = executor_clients().reader(p.endpoint) if snapshot_op == READ_OP else None
    for page in claim_and_read(p, builder.layout).batches():
        rows = builder.project(page, p.channel_id)
        if snapshots is not None:
            rows = mark_snapshot_reads(rows, snapshots.snapshot_rows(
                p.channel_id, page.column("_sequence")))
        yield rows


def claim_and_read(p: ChannelPartition, layout: PageLayout) -> ClaimedRead:
    """Read the channel's pages for this batch, claim their end, return them (executor).

    Identical rows on every call. The pages stay Arrow from the tunnel to the caller: the claim
    needs only the record count and the end token, so no Python object per record is made.
    """
    clients = executor_clients()
    meta = clients.meta_store(p.meta_uri, dict(p.meta_credentials))
    tunnel = clients.reader(p.endpoint)
    claimed = meta.get_end_checkpoint(p.namespace, p.end_uuid, p.channel_id)
    if claimed is not None:
        return ClaimedRead(claimed, _replay(tunnel, p, claimed, layout))

    fetched = fetch_pages(tunnel, p, layout)
    start_token, pages, next_token = fetched.start_token, fetched.pages, fetched.token
    count = sum(page.count for page in pages)
    end = EndCheckpoint(
        channel_id=p.channel_id,
        start_token=start_token,
        token=next_token,
        sequence_number=p.start_sequence_number + count + (1 if next_token == FINISHED else 0),
        records=count,
        attempt=attempt_identity(),
        written_at=time.time(),
        last_sequence=_last_sequence(p, pages),
        bound_reached_us=p.available_now_us if fetched.reached else None,
    )
    crash_point("read_before_claim", {"partition": p, "end": end})
    try:
        meta.put_end_checkpoint(p.namespace, p.end_uuid, end)
    except EndCheckpointConflictError as conflict:
        winner: EndCheckpoint = conflict.stored
        log.info("batch %s channel %s: another attempt claimed first (%s); following it",
                 p.end_uuid, p.channel_id, winner.summary())
        if winner.start_token == start_token and winner.records <= count:
            return ClaimedRead(winner, _head(pages, winner.records))
        return ClaimedRead(winner, _replay(tunnel, p, winner, layout))
    crash_point("mid_read", {"partition": p, "end": end})
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


def _last_sequence(p: ChannelPartition, pages: list[Page]) -> str | None:
    return next((pg.last_sequence for pg in reversed(pages) if pg.count), p.start_last_sequence)


# --- how far a read goes (the rule: connector.stop_rule) ------------------------------------------


def lost_before(tunnel: ChannelReader, tunnel_id: str, channel_id: str, lost: TrimmedDataError,
                layout: PageLayout, instant_us: int | None) -> bool:
    """Were all the records ``lost`` names committed before ``instant_us``? Yes when the first
    record still held was (commit times increase within a channel): a read that starts at that
    instant lost nothing it would have read."""
    if instant_us is None or lost.resume_token == FINISHED:
        return False
    first = tunnel.read_page(tunnel_id, channel_id, lost.resume_token, 1, layout)
    if not first.count:
        return False
    return bool(commit_micros(first.batch.column("_commit_ts"))[0].as_py() < instant_us)


def resume_after_trim(tunnel: ChannelReader, tunnel_id: str, channel_id: str,
                      lost: TrimmedDataError, layout: PageLayout, *, before_us: int | None,
                      before_what: str, kept_any: bool, fail_on_data_loss: bool,
                      on_gap: Callable[[TrimmedDataError], None] | None = None) -> str:
    """The token a read goes on from after ``lost`` (executor; ``fetch_pages`` and the bounded
    batch read, ``connector.range_read``), or ``lost`` raised. Passed over quietly when every
    lost record was committed before ``before_us`` (the read would have skipped them: what
    ``before_what`` names); raised when ``failOnDataLoss`` holds or the read already kept
    records (a gap inside what it delivers); else passed over with a warning, and ``on_gap``
    told (``onDataLoss=resnapshot``: ``connector.data_loss``)."""
    if not kept_any and lost_before(tunnel, tunnel_id, channel_id, lost, layout, before_us):
        log.info("%s; all of them were committed before %s", lost, before_what)
    elif fail_on_data_loss or kept_any:
        raise lost
    else:
        log.warning("%s; continuing after the gap because failOnDataLoss=false", lost)
        if on_gap is not None:
            on_gap(lost)
    return lost.resume_token


@dataclass
class Fetched:
    """What ``fetch_pages`` read: the pages from ``start_token`` (the partition's start, or
    past records a ``startingTimestamp`` or a data-loss skip passed) to ``token``.

    ``reached``: every record of the channel committed by the partition's AvailableNow bound
    (or, outside such a run, available now) is consumed -- the read passed the bound, or the
    tunnel reported nothing more (``may_more`` false, an empty page whose token did not move,
    ``FINISHED``; after a cap, one more read at the end says so). False when a cap or the byte
    budget stopped it.
    """

    start_token: str
    pages: list[Page]
    token: str
    reached: bool


def fetch_pages(tunnel: ChannelReader, p: ChannelPartition, layout: PageLayout) -> Fetched:
    """Read from the start up to what the partition allows (executor): the I/O loop of the
    stop rule (``connector.stop_rule``), which decides what each page gives. A page the read
    stops inside is cut after its last kept record (``Page.token_after``): no record is read
    twice."""
    rule = StopRule.of(p)
    state = rule.start()
    start_token = token = p.start_token
    pages: list[Page] = []
    while want := rule.want(state):
        try:
            page = tunnel.read_page(p.tunnel_id, p.channel_id, token, want, layout)
        except TrimmedDataError as lost:
            if state.confirming:
                return Fetched(start_token, pages, token, False)  # the next batch resumes
            start_token = token = resume_after_trim(
                tunnel, p.tunnel_id, p.channel_id, lost, layout,
                before_us=p.skip_before_us if state.skipping else None,
                before_what="startingTimestamp", kept_any=bool(pages),
                fail_on_data_loss=p.fail_on_data_loss, on_gap=resnapshot_on_gap(p))
            continue
        step = rule.decide(state, page, token)
        state = step.state
        if step.start_moves:  # records passed over before any was kept: the claim starts after
            start_token = page.token_after(step.skip)
        if step.keep:
            pages.append(page.part(step.skip, step.keep))
        if step.past is not None:
            token = page.token_after(step.past)
        if step.stop:
            if state.empty_pages >= MAX_EMPTY_PAGES:
                log.warning("batch %s channel %s: %d empty pages in a row whose token moved and "
                            "that said more may follow; ending this read there%s", p.end_uuid,
                            p.channel_id, state.empty_pages,
                            " and counting the channel as caught up for the AvailableNow bound"
                            if p.available_now_us is not None else "")
            return Fetched(start_token, pages, token, step.reached)
    return Fetched(start_token, pages, token, False)


def _replay(tunnel: ChannelReader, p: ChannelPartition, end: EndCheckpoint,
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
