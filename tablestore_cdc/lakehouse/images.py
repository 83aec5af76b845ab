"""Every change's image as the target stores it (driver, Arrow compute; called by
``plan.plan_batch``): each value in its column when it fits (drift.py's lattice), the others
in the target's ``_extra`` as typed JSON.

``representative_images`` gives ``drift.plan_layout`` the few changes that decide the layout —
per attribute and kind of value: its earliest change (a new column's type, an error's change),
its smallest and largest integer (range and 2^53 checks), its earliest double a float cannot
hold — so the layout is decided from a handful of values, not from every change. ``route`` then
splits every value vectorised: a mask per attribute and kind says where the value fits its
column. Only rows whose ``_extra`` must be rebuilt (some of their values went to columns,
others did not) are encoded one by one; a row whose undeclared values all stay in ``_extra``
keeps the source's JSON text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_common.schema_change import EXACT_INTEGER, type_fits
from tablestore_cdc.lakehouse.changes import NO_TIME, Attribute
from tablestore_cdc.lakehouse.drift import EXTRA_COLUMN, TargetLayout, as_stored


def representative_images(rows: pa.Table, values: Mapping[str, Attribute],
                          target: pa.Schema, widen_to_string: bool
                          ) -> list[tuple[dict[str, Any], str, str]]:
    """(image, channel, sequence) of the changes that decide the layout (module doc), in
    commit-time order, each image whole (every attribute the change carries). A declared
    column whose type fits the target's column decides nothing (``drift.plan_layout``)."""
    n = rows.num_rows
    known = {f.name: f.type for f in target}
    deciding = {name: a for name, a in values.items() if not (
        a.declared and name in known and all(type_fits(kind, known[name], widen_to_string)
                                             for kind in a.kinds))}
    if n == 0 or not deciding:
        return []
    order = pc.sort_indices(pa.table({
        "ts": pc.fill_null(rows.column("_commit_ts").cast(pa.int64()), NO_TIME),
        "ch": rows.column("_channel_id"), "seq": rows.column("_sequence")}),
        sort_keys=[("ts", "ascending"), ("ch", "ascending"), ("seq", "ascending")])
    rank = pc.sort_indices(order)  # the inverse permutation: each row's place in time order
    chosen: set[int] = set()
    for attribute in deciding.values():
        for kind, array in attribute.kinds.items():
            valid = pc.is_valid(array)
            if not pc.any(valid).as_py():
                continue
            chosen.add(_earliest(valid, rank))
            if pa.types.is_integer(kind):
                bounds = pc.min_max(array)
                chosen.add(pc.index(array, bounds["min"]).as_py())
                chosen.add(pc.index(array, bounds["max"]).as_py())
            elif kind == pa.float64():
                inexact = pc.and_(valid, pc.not_equal(array.cast(pa.float32(), safe=False)
                                                      .cast(pa.float64()), array))
                if pc.any(inexact).as_py():
                    chosen.add(_earliest(pc.fill_null(inexact, False), rank))
    channel, sequence = rows.column("_channel_id"), rows.column("_sequence")
    ranks = rank.to_pylist()
    images = []
    for i in sorted(chosen, key=ranks.__getitem__):
        image = {name: a[i].as_py() for name, attribute in values.items()
                 for a in attribute.kinds.values() if a[i].is_valid}
        images.append((image, channel[i].as_py(), sequence[i].as_py()))
    return images


def _earliest(mask: pa.Array, rank: pa.Array) -> int:
    candidates = pc.indices_nonzero(mask)
    return int(candidates[pc.index(rank.take(candidates),
                                   pc.min(rank.take(candidates))).as_py()].as_py())


# --- values into columns ------------------------------------------------------------------------


@dataclass
class Images:
    """The ordered rows' images as target values: per column an array aligned with the rows,
    the ``_extra`` JSON per row (None: the target has no ``_extra``), and per row the number of
    values kept in ``_extra``."""

    columns: dict[str, pa.Array]
    extra: pa.Array | None
    kept_in_extra: pa.Array

    def rows(self, at: pa.Array, rows: pa.Table, keys: Sequence[str], layout: TargetLayout,
             system: Mapping[str, Any]) -> pa.Table:
        """Target rows (``layout.schema``) of the ordered rows at ``at``, with ``system``'s
        columns (SCD 2 validity, soft-delete flag) given per selected row."""
        every = len(at) == rows.num_rows and (not len(at) or pc.all(pc.equal(
            at, pa.array(np.arange(len(at), dtype=np.int64)))).as_py())  # every row: no copy
        arrays = []
        for f in layout.schema:
            if every and f.name not in system:
                array = (rows.column(f.name) if f.name in keys
                         else self.extra if f.name == EXTRA_COLUMN and self.extra is not None
                         else self.columns.get(f.name, pa.nulls(rows.num_rows, f.type)))
            elif f.name in keys:
                array = rows.column(f.name).take(at)
            elif f.name in system:
                array = system[f.name]
            elif f.name == EXTRA_COLUMN and self.extra is not None:
                array = self.extra.take(at)
            elif f.name in self.columns:
                array = self.columns[f.name].take(at)
            else:
                array = pa.nulls(len(at), f.type)
            arrays.append(pa.array(array).cast(f.type) if not isinstance(
                array, pa.ChunkedArray) else array.cast(f.type))
        return pa.Table.from_arrays(arrays, schema=layout.schema)

    def in_extra(self, at: pa.Array) -> int:
        return int(pc.sum(self.kept_in_extra.take(at)).as_py() or 0)


def route(rows: pa.Table, values: Mapping[str, Attribute], layout: TargetLayout) -> Images:
    """Split every value between its column and ``_extra`` (module doc)."""
    n = rows.num_rows
    types, wide = layout.types, layout.widen_to_string
    parts: dict[str, list[pa.Array]] = {}
    kept: list[tuple[str, pa.Array]] = []
    extra_in_column = pa.repeat(False, n)
    declared_kept = pa.repeat(False, n)
    for name, attribute in values.items():
        typ = types.get(name)
        if typ is not None and name in layout.checked and not wide:
            (array,) = attribute.kinds.values()  # a declared column that fits: as it is
            parts[name] = [array.cast(typ)]
            continue
        for kind, array in attribute.kinds.items():
            valid = pc.is_valid(array)
            fit = (valid if typ is not None and name in layout.checked
                   else _fits(array, kind, typ, wide) if typ is not None
                   else pa.repeat(False, n))
            if typ is not None:
                # a kind none of whose values fits adds only nulls (Arrow casts no bool to
                # binary, even an all-null one)
                parts.setdefault(name, []).append(_as_column(
                    pc.if_else(fit, array, pa.nulls(n, kind)), kind, typ, wide)
                    if pc.any(fit).as_py() else pa.nulls(n, typ))
                if not attribute.declared or kind in attribute.extra_kinds:
                    extra_in_column = pc.or_(extra_in_column, fit)
            rest = pc.and_(valid, pc.invert(fit))
            if pc.any(rest).as_py():
                kept.append((name, pc.if_else(rest, array, pa.nulls(n, kind))))
                if attribute.declared:
                    declared_kept = pc.or_(declared_kept, rest)
    columns = {name: pc.coalesce(*arrays) if len(arrays) > 1 else arrays[0]
               for name, arrays in parts.items()}
    counts = pa.repeat(0, n).cast(pa.int64())
    for _, array in kept:
        counts = pc.add(counts, pc.is_valid(array).cast(pa.int64()))
    if not layout.keeps_extra:
        if kept:  # drift.plan_layout adds _extra whenever a value needs it
            raise AssertionError(f"values of {sorted({k for k, _ in kept})} have no column "
                                 "and no _extra")
        return Images(columns, None, counts)
    return Images(columns, _extra_texts(rows, kept, counts, extra_in_column, declared_kept),
                  counts)


def _fits(array: pa.Array, kind: pa.DataType, typ: pa.DataType, wide: bool) -> pa.Array:
    """Per value: whether it fits a column of ``typ`` (``schema_change.fits``, vectorised)."""
    valid = pc.is_valid(array)
    if type_fits(kind, typ, wide):
        return valid
    if pa.types.is_integer(kind) and pa.types.is_integer(typ):
        bits = typ.bit_width - (1 if pa.types.is_signed_integer(typ) else 0)
        low = -(2 ** bits) if pa.types.is_signed_integer(typ) else 0
        inside = pc.and_(pc.greater_equal(array, low), pc.less_equal(array, 2 ** bits - 1))
    elif pa.types.is_integer(kind) and pa.types.is_floating(typ):
        limit = EXACT_INTEGER.get(typ, 0)
        inside = pc.and_(pc.greater_equal(array, -limit), pc.less_equal(array, limit))
    elif kind == pa.float64() and typ == pa.float32():
        inside = pc.or_(pc.equal(array.cast(pa.float32(), safe=False).cast(pa.float64()),
                                 array), pc.is_nan(array))
    else:
        return pa.repeat(False, len(array))
    return pc.fill_null(pc.and_(valid, inside), False)


def _as_column(array: pa.Array, kind: pa.DataType, typ: pa.DataType, wide: bool) -> pa.Array:
    """Values that fit ``typ`` as a column of ``typ`` (text only with ``widen_to_string``)."""
    if wide and pa.types.is_string(typ) and not pa.types.is_string(kind):
        return pa.array([as_stored(v, typ) for v in array.to_pylist()], typ)
    return array.cast(typ)


def _extra_texts(rows: pa.Table, kept: list[tuple[str, pa.Array]], counts: pa.Array,
                 extra_in_column: pa.Array, declared_kept: pa.Array) -> pa.Array:
    """The target's ``_extra`` per row: null with nothing kept, the source's own text when
    every undeclared value of the row is kept and nothing else is, else encoded here."""
    n = rows.num_rows
    any_kept = pc.greater(counts, 0)
    texts = pa.nulls(n, pa.string())
    if "_extra" in rows.column_names:
        source = rows.column("_extra").combine_chunks()
        unchanged = pc.and_(pc.and_(any_kept, pc.invert(extra_in_column)),
                            pc.invert(declared_kept))
        unchanged = pc.and_(unchanged, pc.invert(pc.fill_null(
            pc.match_substring(source, ":null"), False)))
        texts = pc.if_else(unchanged, source, texts)
    else:
        unchanged = pa.repeat(False, n)
    encode = pc.and_(any_kept, pc.invert(unchanged))
    at = pc.indices_nonzero(encode)
    if not len(at):
        return texts
    from connector.schema import to_json

    picked = [(name, array.take(at).to_pylist()) for name, array in kept]
    encoded = [to_json({name: values[i] for name, values in picked if values[i] is not None})
               for i in range(len(at))]
    return pc.replace_with_mask(texts, encode, pa.array(encoded, pa.string()))
