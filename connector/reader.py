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


def _last_sequence(p: ChannelPartition, pages: list[Page]) -> str | None:
    for page in reversed(pages):
        if page.count:
            return page.last_sequence
    return p.start_last_sequence


# --- how far a read goes ------------------------------------------------------------------------


def record_sizes(batch: pa.RecordBatch) -> pa.Array:
    """Each record's size in bytes, as ``maxBytesPerTrigger`` counts it: its share of the Arrow
    page -- fixed-width values at their width (a boolean as one byte), strings and binaries
    (the ``_before`` / ``_extra`` JSON included) at their length plus a 4-byte offset; nulls
    count their width (fixed) or 4 (variable). Validity bitmaps are left out."""
    fixed = 0
    variable: pa.Array | None = None
    for column in batch.columns:
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_binary(kind) \
                or pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
            lengths = pc.fill_null(pc.binary_length(column), 0).cast(pa.int64())
            variable = lengths if variable is None else pc.add(variable, lengths)
            fixed += 4
        elif pa.types.is_boolean(kind):
            fixed += 1
        else:
            fixed += max(1, kind.bit_width // 8)
    if variable is None:
        return pa.array([fixed] * batch.num_rows, pa.int64())
    return pc.add(variable, fixed)


def records_within(batch: pa.RecordBatch, budget: int) -> int:
    """How many leading records of ``batch`` a byte ``budget`` takes: each record whose
    preceding records total less than the budget (so the last one may cross it)."""
    if budget <= 0 or batch.num_rows == 0:
        return 0
    sizes = record_sizes(batch)
    before = pc.subtract(pc.cumulative_sum(sizes), sizes)
    return int(pc.sum(pc.less(before, budget)).as_py() or 0)


def page_bytes(batch: pa.RecordBatch) -> int:
    """The bytes of a whole page, as ``record_sizes`` counts them."""
    return int(pc.sum(record_sizes(batch)).as_py() or 0) if batch.num_rows else 0


def leading_count(flags: pa.Array) -> int:
    """How many leading elements of the boolean array ``flags`` are true (null counts as
    true)."""
    first_false = pc.index(flags, False).as_py()
    return len(flags) if first_false is None or first_false < 0 else int(first_false)


def lost_before(tunnel: TunnelService, tunnel_id: str, channel_id: str, lost: TrimmedDataError,
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


def resume_after_trim(tunnel: TunnelService, tunnel_id: str, channel_id: str,
                      lost: TrimmedDataError, layout: PageLayout, *, before_us: int | None,
                      before_what: str, kept_any: bool, fail_on_data_loss: bool) -> str:
    """The token a read goes on from after ``lost`` (executor; ``fetch_pages`` and the bounded
    batch read, ``connector.range_read``), or ``lost`` raised. Passed over quietly when every
    lost record was committed before ``before_us`` (the read would have skipped them: what
    ``before_what`` names); raised when ``failOnDataLoss`` holds or the read already kept
    records (a gap inside what it delivers); else passed over with a warning."""
    if not kept_any and lost_before(tunnel, tunnel_id, channel_id, lost, layout, before_us):
        log.info("%s; all of them were committed before %s", lost, before_what)
    elif fail_on_data_loss or kept_any:
        raise lost
    else:
        log.warning("%s; continuing after the gap because failOnDataLoss=false", lost)
    return lost.resume_token


def commit_micros(column: pa.Array) -> pa.Array:
    """``_commit_ts`` as integer microseconds since the epoch."""
    return column.cast(pa.int64())


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


#: empty pages in a row whose token moves and that say more may follow, before a read stops
#: (a service that never says it is caught up must not keep one task reading forever)
MAX_EMPTY_PAGES = 16


def fetch_pages(tunnel: TunnelService, p: ChannelPartition, layout: PageLayout) -> Fetched:
    """Read from the start up to what the partition allows (executor): its record cap, its byte
    budget (``max_bytes``: the last record may cross it), its AvailableNow bound (a head
    sequence, else the bound's commit time), or what is available now. Leading records
    committed before ``skip_before_us`` (``startingTimestamp``) are passed over first: the
    claim's start token then points after them. Where a page holds more than may be kept, the
    kept records are read again exactly, so the next token lands right after them."""
    start_token = token = p.start_token
    pages: list[Page] = []
    count = 0
    budget = p.max_bytes
    empty_pages = 0
    skipping = p.skip_before_us is not None
    caught_up = False
    while count < p.max_records:
        want = min(PAGE_SIZE, p.max_records - count)
        try:
            page = tunnel.read_page(p.tunnel_id, p.channel_id, token, want, layout)
        except TrimmedDataError as lost:
            start_token = token = resume_after_trim(
                tunnel, p.tunnel_id, p.channel_id, lost, layout,
                before_us=p.skip_before_us if skipping else None,
                before_what="startingTimestamp", kept_any=bool(pages),
                fail_on_data_loss=p.fail_on_data_loss)
            continue
        caught_up = _caught_up(page)
        if not page.count:
            if page.next_token == token or caught_up:
                return Fetched(start_token, pages, page.next_token, True)
            empty_pages += 1
            token = page.next_token
            if skipping:
                start_token = token
            if empty_pages >= MAX_EMPTY_PAGES:
                log.warning("batch %s channel %s: %d empty pages in a row whose token moved and "
                            "that said more may follow; ending this read there%s", p.end_uuid,
                            p.channel_id, empty_pages,
                            " and counting the channel as caught up for the AvailableNow bound"
                            if p.available_now_us is not None else "")
                return Fetched(start_token, pages, token, p.available_now_us is not None)
            continue
        empty_pages = 0
        if skipping:
            assert p.skip_before_us is not None
            skip = leading_count(pc.less(commit_micros(page.batch.column("_commit_ts")),
                                         p.skip_before_us))
            if skip == page.count:  # the whole page is older than startingTimestamp
                start_token = token = page.next_token
                if caught_up:
                    return Fetched(start_token, pages, token, True)
                continue
            skipping = False
            if skip:  # the token right after the skipped records, then read on from there
                start_token = token = tunnel.read_page(p.tunnel_id, p.channel_id, token, skip,
                                                       layout).next_token
                continue
        keep, at_bound = _keep(p, page)
        if budget is not None and keep:
            within = records_within(page.batch.slice(0, keep) if keep < page.count
                                    else page.batch, budget)
            keep, at_bound = (within, False) if within < keep else (keep, at_bound)
        if keep < page.count:
            # read exactly the kept records again, so the next token lands right after them
            if keep:
                exact = tunnel.read_page(p.tunnel_id, p.channel_id, token, keep, layout)
                pages.append(exact)
                token = exact.next_token
            return Fetched(start_token, pages, token, at_bound)
        pages.append(page)
        count += page.count
        token = page.next_token
        # AvailableNow: a page that ends a channel's records without "finished" is confirmed
        # by one more read -- a closed channel's end may come only then, and its children
        # (changes before the bound too) are released only by that end
        ended = caught_up and (token == FINISHED or p.available_now_us is None)
        if budget is not None:
            budget -= page_bytes(page.batch)
            if budget <= 0:
                return Fetched(start_token, pages, token, ended)
        if ended:
            return Fetched(start_token, pages, token, True)
    if caught_up and p.available_now_us is not None and p.stop_after_sequence is None \
            and token != FINISHED:
        # AvailableNow by commit time: the cap came with the page that caught up, before its
        # confirming read; made now, it spares the run a batch planned only to make it
        return Fetched(start_token, pages, *_confirm_caught_up(tunnel, p, token, layout))
    return Fetched(start_token, pages, token, False)


def _confirm_caught_up(tunnel: TunnelService, p: ChannelPartition, token: str,
                       layout: PageLayout) -> tuple[str, bool]:
    """(end token, bound reached) after a capped read whose last page caught up: one read of
    at most a record at ``token``; an empty answer that is still caught up (the loop's rule)
    reaches the bound, and its token -- ``FINISHED`` for a closed channel -- ends the read.
    Anything else leaves both for the next batch."""
    try:
        page = tunnel.read_page(p.tunnel_id, p.channel_id, token, 1, layout)
    except TrimmedDataError:
        return token, False  # the next batch's read resumes after the trim
    if not page.count and (page.next_token == token or _caught_up(page)):
        return page.next_token, True
    return token, False


def _caught_up(page: Page) -> bool:
    """The tunnel says nothing more follows ``page`` now: ``FINISHED``, or ``may_more`` false."""
    return page.next_token == FINISHED or not page.may_more


def _keep(p: ChannelPartition, page: Page) -> tuple[int, bool]:
    """How many leading records of ``page`` the AvailableNow bound lets the read take, and
    whether the bound cut the page (sequences and commit times increase within a channel, so
    the kept records are a prefix)."""
    if p.stop_after_sequence is not None:
        bound = p.stop_after_sequence
        if (page.last_sequence or "") <= bound:
            return page.count, False
        return leading_count(pc.less_equal(page.batch.column("_sequence"), bound)), True
    if p.available_now_us is not None:
        until = p.available_now_us
        stamps = commit_micros(page.batch.column("_commit_ts"))
        if stamps[-1].as_py() <= until:
            return page.count, False
        return leading_count(pc.less_equal(stamps, until)), True
    return page.count, False


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
