"""Whether a batch's keys are all new to the table (driver, called by the Delta and Iceberg
sinks before they commit a batch).

A batch whose touched keys are all absent from the table is **appended** (the first load of a
table, a stream of new keys) instead of merged, with the same batch marker in the commit. The
sinks decide it in two steps, the second only when the first cannot tell:

1. the files' statistics of the first key column (Delta's ``minValues``/``maxValues`` of each
   ``add``, Iceberg's lower and upper bounds of each data file), which both protocols define as
   bounds of every value in the file: a key outside every file's [min, max] is not in the table
   (an empty table; keys beyond the table's, as auto-increment ids and time-ordered keys are).
   A file without statistics may hold anything;
2. the first key column itself, read by the format's own reader with the batch's keys as an
   ``isin`` filter (row groups pruned by their statistics): a read of one column where a MERGE
   would read and rewrite whole files. A key that is there sends the batch to the MERGE.

Only integer, string and binary keys are compared (their order is the same in Arrow and in the
statistics); any other key type always merges.

One writer per table (ownership.py) keeps the answer true until the commit: a zombie attempt of
the same batch carries the same batch marker, and the formats refuse the second of two commits
with one marker (Delta: the ``txn`` conflict; Iceberg: the catalog's snapshot assertion).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def comparable(typ: pa.DataType) -> bool:
    """Whether statistics of a key of this type can tell that a key is absent."""
    return (pa.types.is_integer(typ) or pa.types.is_string(typ) or pa.types.is_large_string(typ)
            or pa.types.is_binary(typ))


def candidates(keys: pa.Array, lows: Sequence[Any] | pa.Array,
               highs: Sequence[Any] | pa.Array) -> np.ndarray:
    """Per file: whether its [low, high] range may hold one of ``keys`` (the bounds as Python
    values or as Arrow arrays, such as Delta's ``add`` statistics, compared without a Python
    object per file for numeric keys)."""
    files = len(lows)
    if not len(keys) or not files:
        return np.zeros(files, bool)
    low_array, high_array = _bounds(lows), _bounds(highs)
    unknown = pc.or_(pc.is_null(low_array), pc.is_null(high_array)).to_numpy(
        zero_copy_only=False)
    if not comparable(keys.type) or unknown.all():
        return np.ones(files, bool)
    values = keys.to_numpy(zero_copy_only=False)
    # sorted, duplicates and all (searchsorted needs no distinct values); numpy sorts numbers
    # fastest (a batch's keys often come sorted: checked first), Arrow strings (numpy would
    # compare Python objects)
    if values.dtype == object:
        values = pc.unique(keys).sort().to_numpy(zero_copy_only=False)
    elif len(values) > 1 and not (values[:-1] <= values[1:]).all():
        values = np.sort(values)
    dtype = values.dtype if values.dtype != object else object
    known = ~unknown
    first = np.searchsorted(values, np.asarray(low_array.filter(pa.array(known)).to_numpy(
        zero_copy_only=False), dtype=dtype), side="left")
    after = np.searchsorted(values, np.asarray(high_array.filter(pa.array(known)).to_numpy(
        zero_copy_only=False), dtype=dtype), side="right")
    held = unknown.copy()
    held[known] = after > first
    return held


def _bounds(values: Sequence[Any] | pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    return values if isinstance(values, pa.Array) else pa.array(values)
