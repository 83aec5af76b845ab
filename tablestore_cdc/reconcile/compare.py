"""Compare a source table with a target table: buckets of row hashes first, rows only where a
bucket differs.

Pass 1 streams each side once, a page or record batch at a time, puts it into the compared
layout (``layout.CompareLayout``) and hashes it column-wise (polars' ``hash_rows``, one seeded
64-bit hash per row over every compared column, and one over the key columns). The key hash
picks one of ``BUCKETS`` buckets; a bucket keeps the count of its rows and the sum (mod 2**64)
of their row hashes. Two equal tables give equal buckets: one pass over each side, and memory
for the buckets only (a few MB), whatever the tables' size.

Pass 2 runs only when buckets differ: both sides are read again, and the rows of unequal
buckets (their laid-out values and row hash) are kept and joined by key: a source key the
target lacks is MISSING, a target key the source lacks is EXTRA, a key on both sides whose row
hashes differ is DIFFERENT, and a key the target holds more than once is EXTRA too. Memory is
bounded by ``ROUND_ROWS``: when the unequal buckets hold more rows (a target far from its
source), pass 2 takes them in rounds, each reading both sides again.

Given a key range (``span``), both sides read only that range (the readers push it into their
reads: ``source``, ``target``), and the comparison is of the range's rows.

A row hash collision would hide a difference with a probability of about 2**-64 per row pair.
Called in the CLI's process by ``tablestore_cdc.reconcile.run``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tablestore_cdc.reconcile.layout import CompareLayout, Key, row_attributes
from tablestore_cdc.reconcile.source import SourceTable
from tablestore_cdc.reconcile.target import TargetTable

if TYPE_CHECKING:
    from tablestore_cdc.reconcile.keyrange import KeyRange

#: buckets of pass 1 (a power of two: the bucket is the key hash's low bits)
BUCKETS = 1 << 16
#: rows of unequal buckets pass 2 holds per side at once
ROUND_ROWS = 2_000_000
#: rows per source page and target batch
PAGE_ROWS = 10_000
#: differences kept with their attributes for the report (all are counted and classified)
DETAILED = 10_000
KEY_SEED, ROW_SEED = 0x7ABE5, 0xC0FFEE
HASH = "__row_hash"


class Progress:
    """Where the comparison reports its progress: nothing here; the CLI's progress bar
    (``command.BarProgress``) and a repair's signal (``resnapshot.repair.SignalProgress``)."""

    def begin(self, what: str, total: int | None) -> None:
        pass

    def advance(self, rows: int) -> None:
        pass

    def end(self) -> None:
        pass


@dataclass
class Difference:
    """One key whose rows differ. ``source`` / ``target``: the compared attributes of each
    side's row (None: no row there, or not kept for the report)."""

    kind: str  # MISSING, EXTRA or DIFFERENT
    key: Key
    source: dict[str, Any] | None = None
    target: dict[str, Any] | None = None
    #: the attributes whose values differ (DIFFERENT)
    columns: list[str] = field(default_factory=list)
    #: the source row changed after the position the target is known to hold
    in_flight: bool = False
    note: str = ""

    @property
    def label(self) -> str:
        return "IN-FLIGHT" if self.in_flight else self.kind


@dataclass
class Comparison:
    source_rows: int = 0
    target_rows: int = 0
    unequal_buckets: int = 0
    #: rows of unequal buckets compared key by key in pass 2 (both sides)
    drill_rows: int = 0
    #: rounds of pass 2 (each reads both sides again)
    rounds: int = 0
    differences: list[Difference] = field(default_factory=list)


def hashes(batch: pa.RecordBatch, layout: CompareLayout) -> tuple[np.ndarray, np.ndarray]:
    """(bucket, row hash) of every row of a laid-out batch."""
    import polars as pl

    frame = pl.from_arrow(batch)
    assert isinstance(frame, pl.DataFrame)
    key_hash = frame.select(layout.key_columns).hash_rows(seed=KEY_SEED).to_numpy()
    row_hash = frame.hash_rows(seed=ROW_SEED).to_numpy()
    return (key_hash & np.uint64(BUCKETS - 1)).astype(np.int64), row_hash


def compare(source: SourceTable, target: TargetTable, layout: CompareLayout,
            progress: Progress | None = None, page_rows: int = PAGE_ROWS,
            span: KeyRange | None = None) -> Comparison:
    """Pass 1, then pass 2 where buckets differ (module docstring); only ``span``'s rows when
    given (the tables' row counts are then no progress total)."""
    progress = progress or Progress()
    whole = span is None
    sides: list[tuple[str, Callable[[], Iterator[pa.RecordBatch]], int | None]] = [
        ("source", lambda: (layout.from_source(p) for p in source.pages(page_rows, span)),
         source.estimated_rows() if whole else None),
        ("target", lambda: (layout.from_target(b)
                            for b in target.batches(layout.target_columns, page_rows, span)),
         target.estimated_rows() if whole else None),
    ]
    result = Comparison()
    sums, counts = np.zeros((2, BUCKETS), np.uint64), np.zeros((2, BUCKETS), np.int64)
    for side, (name, batches, total) in enumerate(sides):  # a bucket's rows and hash sum
        progress.begin(f"{name}: hashing rows", total)
        for batch in batches():
            bucket, row_hash = hashes(batch, layout)
            np.add.at(sums[side], bucket, row_hash)
            counts[side] += np.bincount(bucket, minlength=BUCKETS)
            progress.advance(batch.num_rows)
        progress.end()
    result.source_rows, result.target_rows = (int(n) for n in counts.sum(axis=1))
    unequal = np.flatnonzero((sums[0] != sums[1]) | (counts[0] != counts[1]))
    result.unequal_buckets = len(unequal)
    for chosen in _rounds(unequal, counts.max(axis=0)):
        mask = np.zeros(BUCKETS, bool)
        mask[chosen] = True
        kept = []
        for name, batches, _ in sides:
            progress.begin(f"{name}: reading {len(chosen)} unequal bucket(s)",
                           result.source_rows if name == "source" else result.target_rows)
            kept.append(_rows_in(batches(), mask, layout, progress))
            progress.end()
        result.rounds += 1
        result.drill_rows += kept[0].num_rows + kept[1].num_rows
        result.differences += classify(kept[0], kept[1], layout,
                                       detailed=DETAILED - len(result.differences))
    return result


def _rounds(unequal: np.ndarray, rows: np.ndarray) -> Iterator[np.ndarray]:
    """The unequal buckets in groups holding at most about ``ROUND_ROWS`` rows each."""
    if len(unequal) == 0:
        return
    cumulative = np.cumsum(rows[unequal])
    groups = max(1, math.ceil(int(cumulative[-1]) / ROUND_ROWS))
    edges = np.searchsorted(cumulative, [ROUND_ROWS * g for g in range(1, groups)])
    yield from (g for g in np.split(unequal, edges) if len(g))


def _rows_in(batches: Iterator[pa.RecordBatch], mask: np.ndarray, layout: CompareLayout,
             progress: Progress) -> pa.Table:
    """The laid-out rows whose bucket is in ``mask``, with their row hash."""
    schema = layout.schema.append(pa.field(HASH, pa.uint64()))
    kept = []
    for batch in batches:
        bucket, row_hash = hashes(batch, layout)
        keep = mask[bucket]
        if keep.any():
            chosen = pa.array(keep)
            columns = [*batch.filter(chosen).columns, pa.array(row_hash[keep], pa.uint64())]
            kept.append(pa.RecordBatch.from_arrays(columns, schema=schema))
        progress.advance(batch.num_rows)
    return pa.Table.from_batches(kept, schema=schema)


def classify(source: pa.Table, target: pa.Table, layout: CompareLayout,
             detailed: int = DETAILED) -> list[Difference]:
    """The differences between the kept rows of both sides (module docstring); the first
    ``detailed`` keep both rows' attributes."""
    import polars as pl

    keys = list(layout.key_columns)
    s = pl.from_arrow(source)
    t = pl.from_arrow(target)
    assert isinstance(s, pl.DataFrame) and isinstance(t, pl.DataFrame)
    out: list[Difference] = []
    doubled = t.group_by(keys).len().filter(pl.col("len") > 1)
    if doubled.height:
        for row in doubled.iter_rows(named=True):
            out.append(Difference("EXTRA", tuple(row[k] for k in keys),
                                  note=f"the target holds {row['len']} rows with this key"))
        t = t.join(doubled.select(keys), on=keys, how="anti")
        s = s.join(doubled.select(keys), on=keys, how="anti")
    joined = s.join(t, on=keys, how="full", coalesce=True, suffix="__t")
    there_s, there_t = pl.col(HASH).is_not_null(), pl.col(HASH + "__t").is_not_null()
    unequal = joined.filter(~there_s | ~there_t | (pl.col(HASH) != pl.col(HASH + "__t")))
    names = [n for n in layout.schema.names if n not in keys]
    for row in unequal.iter_rows(named=True):
        key = tuple(row[k] for k in keys)
        has_s, has_t = row[HASH] is not None, row[HASH + "__t"] is not None
        kind = "DIFFERENT" if has_s and has_t else "MISSING" if has_s else "EXTRA"
        difference = Difference(kind, key)
        if len(out) < detailed:
            side_s = row_attributes({n: row[n] for n in names}, layout) if has_s else None
            side_t = (row_attributes({n: row[n + "__t"] for n in names}, layout)
                      if has_t else None)
            difference.source, difference.target = side_s, side_t
            if side_s is not None and side_t is not None:
                difference.columns = sorted(n for n in {*side_s, *side_t}
                                            if not same_value(side_s.get(n), side_t.get(n)))
        out.append(difference)
    return out


def same_value(a: Any, b: Any) -> bool:
    """Equal by the layout's rules (same type and value; a NaN equals a NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)
