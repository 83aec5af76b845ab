"""The stop rule of one channel's read: for each page, what to keep and whether to stop.

Pure -- no I/O, no clock: given the partition's bounds, where the read stands and the page just
read, ``StopRule.decide`` says how many leading records to pass over, how many to keep, whether
the read's end is reached and whether to stop. The executor's I/O loop
(``connector.reader.fetch_pages``) reads pages and applies it, the way Spark's Kafka source
decides offset ranges (``KafkaOffsetRangeCalculator``) apart from the consumer that reads them.

What bounds a read (``ChannelPartition``, planned on the driver), in the order applied:

1. ``skip_before_us`` (``startingTimestamp``): while nothing is kept yet, leading records
   committed before it are passed over and the read's start moves after them;
2. the AvailableNow bound: records up to the channel's head sequence when the run started
   (``stop_after_sequence``), else up to its commit time (``available_now_us``);
3. ``max_bytes``, the byte budget (``record_sizes``; the last record kept may cross it);
4. ``max_records``, the cap: each page asks for at most what is left (``want``, at most
   ``PAGE_SIZE``).

When the read ends: at a cut page (a bound or the budget fell inside it; the read stops right
after its last kept record, ``Page.token_after``), at the budget or the cap, or when the tunnel
reports nothing more now (``FINISHED``, ``may_more`` false, an empty page whose token did not
move) -- then the end is *reached*: every record the partition may read is consumed, which an
AvailableNow run records in its claim. Under AvailableNow a page that catches up without
``FINISHED`` is confirmed by one more read (a closed channel's end may come only then, and its
children are released only by that end); when the cap came with that page, the confirming
read asks for one record and keeps none. ``MAX_EMPTY_PAGES`` empty pages in a row whose token
moves and that say more may follow end a read too (a service that never says it is caught up
must not keep one task reading forever).

The page arithmetic on Arrow columns (``record_sizes``, ``records_within``, ``leading_count``,
``commit_micros``) is here too; the bounded batch read (``connector.range_read``) uses the last
two for its time range.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from connector.partition import ChannelPartition
from connector.tunnel import FINISHED
from connector.tunnel.page import Page

#: records per tunnel call (one Arrow batch handed to Spark); a cap above it takes several calls
PAGE_SIZE = 8192
#: empty pages in a row whose token moves and that say more may follow, before a read stops
MAX_EMPTY_PAGES = 16


@dataclass(frozen=True)
class ReadState:
    """Where one channel's read stands, between pages."""

    #: records kept so far
    kept: int = 0
    #: bytes of the budget left (``None``: no budget)
    budget: int | None = None
    #: still passing over records older than ``skip_before_us``
    skipping: bool = False
    #: empty pages in a row whose token moved
    empty_pages: int = 0
    #: the cap is reached; the next read only confirms the AvailableNow end (keeps nothing)
    confirming: bool = False


@dataclass(frozen=True)
class Step:
    """What the read does with one page: pass over its first ``skip`` records, keep the
    ``keep`` after them, move past ``past`` of its records (the read's token becomes
    ``Page.token_after(past)``; ``None``: it stays where it was), move its start along when
    ``start_moves`` (records passed over before any was kept: the claim starts after them),
    and stop when ``stop`` (``reached``: every record the partition may read is consumed)."""

    state: ReadState
    skip: int = 0
    keep: int = 0
    past: int | None = 0
    start_moves: bool = False
    stop: bool = False
    reached: bool = False


@dataclass(frozen=True)
class StopRule:
    """The bounds of one partition's read (module docstring); ``decide`` applies them."""

    max_records: int
    max_bytes: int | None = None
    stop_after_sequence: str | None = None
    available_now_us: int | None = None
    skip_before_us: int | None = None

    @classmethod
    def of(cls, p: ChannelPartition) -> StopRule:
        return cls(p.max_records, p.max_bytes, p.stop_after_sequence, p.available_now_us,
                   p.skip_before_us)

    def start(self) -> ReadState:
        """The state before the first page."""
        return ReadState(budget=self.max_bytes, skipping=self.skip_before_us is not None)

    def want(self, state: ReadState) -> int:
        """Records to ask the next page for (0: ask for none, the read is over)."""
        if state.confirming:
            return 1
        return max(0, min(PAGE_SIZE, self.max_records - state.kept))

    def decide(self, state: ReadState, page: Page, token: str) -> Step:
        """The step for ``page``, read at ``token`` in ``state`` (module docstring)."""
        caught_up = page.next_token == FINISHED or not page.may_more
        if state.confirming:  # one record past the cap: only whether the end is there
            at_end = not page.count and (page.next_token == token or caught_up)
            return Step(state, past=0 if at_end else None, stop=True, reached=at_end)
        if not page.count:
            if page.next_token == token or caught_up:
                return Step(state, stop=True, reached=True)
            empty = replace(state, empty_pages=state.empty_pages + 1)
            stop = empty.empty_pages >= MAX_EMPTY_PAGES
            return Step(empty, start_moves=state.skipping, stop=stop,
                        reached=stop and self.available_now_us is not None)
        state = replace(state, empty_pages=0)
        # the Arrow batch only when a bound looks at the records: an encoded page (the local
        # store's sealed segments) is otherwise decoded only when the reader hands it on
        by_time = self.available_now_us is not None and self.stop_after_sequence is None
        batch = page.batch if state.skipping or state.budget is not None or by_time else None
        skip = 0
        if state.skipping:
            assert batch is not None and self.skip_before_us is not None
            skip = leading_count(pc.less(commit_micros(batch.column("_commit_ts")),
                                         self.skip_before_us))
            if skip == page.count:  # the whole page is older than startingTimestamp
                return Step(state, skip=skip, past=skip, start_moves=True, stop=caught_up,
                            reached=caught_up)
            state = replace(state, skipping=False)
            batch = batch.slice(skip)
        rest = page.count - skip
        keep, at_bound = self._within_bound(page, batch, skip)
        if state.budget is not None and keep:
            assert batch is not None
            within = records_within(batch.slice(0, keep) if keep < rest else batch,
                                    state.budget)
            keep, at_bound = (within, False) if within < keep else (keep, at_bound)
        moved = Step(state, skip=skip, keep=keep, past=(skip + keep) or None,
                     start_moves=skip > 0)
        if keep < rest:  # a bound or the budget fell inside the page
            return replace(moved, stop=True, reached=at_bound)
        budget = None
        if state.budget is not None:
            assert batch is not None
            budget = state.budget - page_bytes(batch)
        state = replace(state, kept=state.kept + keep, budget=budget)
        moved = replace(moved, state=state)
        # AvailableNow: a page that ends a channel's records without "finished" is confirmed
        # by one more read -- a closed channel's end may come only then
        ended = caught_up and (page.next_token == FINISHED or self.available_now_us is None)
        if (budget is not None and budget <= 0) or ended:
            return replace(moved, stop=True, reached=ended)
        if state.kept < self.max_records:
            return moved
        if caught_up and self.available_now_us is not None and self.stop_after_sequence is None:
            # AvailableNow by commit time: the cap came with the page that caught up; its
            # confirming read, made now, spares the run a batch planned only to make it
            return replace(moved, state=replace(state, confirming=True))
        return replace(moved, stop=True)

    def _within_bound(self, page: Page, rest: pa.RecordBatch | None,
                      skip: int) -> tuple[int, bool]:
        """How many leading records of the page after its first ``skip`` (``rest``: their
        batch, when a bound needed it) the AvailableNow bound lets the read take, and whether
        the bound cut them (sequences and commit times increase within a channel, so the kept
        records are a prefix)."""
        count = page.count - skip
        if self.stop_after_sequence is not None:
            bound = self.stop_after_sequence
            if (page.last_sequence or "") <= bound:
                return count, False
            sequences = (rest if rest is not None else page.batch).column("_sequence")
            return leading_count(pc.less_equal(sequences, bound)), True
        if self.available_now_us is not None:
            assert rest is not None  # decide() takes the batch for a bound by time
            stamps = commit_micros(rest.column("_commit_ts"))
            if stamps[-1].as_py() <= self.available_now_us:
                return count, False
            return leading_count(pc.less_equal(stamps, self.available_now_us)), True
        return count, False


# --- page arithmetic ----------------------------------------------------------------------------


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


def commit_micros(column: pa.Array) -> pa.Array:
    """``_commit_ts`` as integer microseconds since the epoch."""
    return column.cast(pa.int64())


__all__ = ["MAX_EMPTY_PAGES", "PAGE_SIZE", "ReadState", "Step", "StopRule", "commit_micros",
           "leading_count", "page_bytes", "record_sizes", "records_within"]
