"""A change batch as columns (driver, called by ``plan.plan_batch``): each key's changes in the
source's order, and every attribute's values split by their type — with Arrow compute, no
Python object per change.

``ordered(batch)`` sorts the rows so that each key's changes are contiguous and in the source's
order: within a channel by ``_sequence``; a key's channels (a split or merge within the batch)
by the commit time of their first change, then of their last, then by channel id (the rule in
plan.py's docstring). ``attributes(batch)`` gives the declared attribute columns and the
undeclared attributes of ``_extra`` (JSON), each as ``Attribute``: its values by kind (int64,
double, string, bool, binary, ...), one array per kind aligned with the rows.

``_extra`` is parsed by pyarrow's JSON reader; an attribute whose values are all integers, or
all fractions, or all strings, stays columnar. Where the reader merges integers and fractions
into one double column, the integer literals are found again in the JSON text (the source
writes sorted, compact JSON: ``{"qty":3}``) and kept as integers. A batch the reader cannot
take as columns (an attribute that is a number in one row and a string in another, nested
values) is parsed row by row (``json.loads``): the exception, not the rule.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from cdc_common.schema_change import natural_type

#: the source's metadata columns (docs/schema.md); never target columns
META_COLUMNS = ("_op", "_channel_id", "_sequence", "_commit_ts", "_before", "_extra")
#: a null commit time sorts first (as the per-change rule's datetime.min)
NO_TIME = -(2 ** 63)


def ordered(batch: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """The batch's rows in per-key source order (module doc)."""
    if _strictly_increasing(batch.column(key_columns[0])):
        return batch  # every key once and in order (a first load read by key ranges): as is
    by_key = [(k, "ascending") for k in key_columns]
    rows = batch.take(pc.sort_indices(batch, sort_keys=by_key))
    if not pc.any(pc.invert(key_boundaries(rows, key_columns))).as_py():
        return rows  # every key once (a first load): nothing else to order
    by_channel = [*by_key, ("_channel_id", "ascending"), ("_sequence", "ascending")]
    rows = batch.take(pc.sort_indices(batch, sort_keys=by_channel))
    if not _moves_channel(rows, key_columns):
        return rows  # no key in two channels: the channels' order does not matter
    keys = [*key_columns, "_channel_id"]
    times = pc.fill_null(rows.column("_commit_ts").cast(pa.int64()), NO_TIME)
    runs = (rows.select(keys).append_column("__ts", times)
            .group_by(keys, use_threads=False).aggregate([("__ts", "first"), ("__ts", "last")]))
    ranked = runs.take(pc.sort_indices(runs, sort_keys=[
        *[(k, "ascending") for k in key_columns], ("__ts_first", "ascending"),
        ("__ts_last", "ascending"), ("_channel_id", "ascending")]))
    ranked = ranked.select(keys).append_column(
        "__rank", pa.array(np.arange(ranked.num_rows, dtype=np.int64)))
    joined = rows.join(ranked, keys=keys, join_type="inner")
    joined = joined.take(pc.sort_indices(joined, sort_keys=[("__rank", "ascending"),
                                                            ("_sequence", "ascending")]))
    return joined.select(rows.column_names)


def _strictly_increasing(column: pa.ChunkedArray) -> bool:
    """Whether each value is greater than the one before (no null): then the rows' keys are
    distinct and sorted whatever the other key columns hold, and sorting would not move a row."""
    n = len(column)
    if column.null_count or not (pa.types.is_integer(column.type)
                                 or pa.types.is_string(column.type)):
        return False
    values = column.combine_chunks()
    return n < 2 or bool(pc.all(pc.less(values.slice(0, n - 1), values.slice(1))).as_py())


def _moves_channel(rows: pa.Table, key_columns: Sequence[str]) -> bool:
    """Whether a key of the rows (sorted by key and channel) is in two channels: two
    neighbouring rows of one key with different channels."""
    last = key_boundaries(rows, key_columns)
    n = rows.num_rows
    if n < 2:
        return False
    channels = rows.column("_channel_id").combine_chunks()
    other_channel = pc.not_equal(channels.slice(0, n - 1), channels.slice(1))
    return bool(pc.any(pc.and_(pc.invert(last.slice(0, n - 1)), other_channel)).as_py())


def key_boundaries(rows: pa.Table, key_columns: Sequence[str]) -> pa.BooleanArray:
    """``last[i]``: row i is its key's last change (rows in ``ordered`` order)."""
    n = rows.num_rows
    if n == 0:
        return pa.array([], pa.bool_())
    columns = [rows.column(name).combine_chunks() for name in key_columns]
    differs = [pc.not_equal(column.slice(0, n - 1), column.slice(1)) for column in columns]
    return pa.concat_arrays([functools.reduce(pc.or_, differs), pa.array([True])])


# --- attribute values -------------------------------------------------------------------------


@dataclass
class Attribute:
    """One attribute's values in the batch: kind (Arrow type) -> values of that kind, aligned
    with the rows (null where the row holds another kind or nothing)."""

    name: str
    kinds: dict[pa.DataType, pa.Array] = field(default_factory=dict)
    #: a declared column of the reader's schema (else from ``_extra``)
    declared: bool = False
    #: of a declared column: the kinds its values of another type had in ``_extra`` (the
    #: source keeps a value that does not fit its column there: docs/schema.md)
    extra_kinds: frozenset[pa.DataType] = frozenset()


def attributes(rows: pa.Table, key_columns: Sequence[str]) -> dict[str, Attribute]:
    """The attributes of every change's image (a DELETE's image is empty: its values are
    masked), declared columns first in the schema's order, then ``_extra``'s by name."""
    live = pc.not_equal(rows.column("_op"), "DELETE").combine_chunks()
    if pc.all(live).as_py():
        live = None  # no DELETE: nothing to mask
    out: dict[str, Attribute] = {}
    for f in rows.schema:
        if f.name in META_COLUMNS or f.name in key_columns:
            continue
        values = _masked(rows.column(f.name).combine_chunks(), live)
        out[f.name] = Attribute(f.name, {f.type: values}, declared=True)
    if "_extra" in rows.column_names:
        extra = _masked(rows.column("_extra").combine_chunks(), live)
        for name, attribute in sorted(extra_attributes(extra).items()):
            if name in out:  # values of another type than the declared column: one attribute
                declared = out[name]
                for kind, array in attribute.kinds.items():
                    known = declared.kinds.get(kind)
                    declared.kinds[kind] = array if known is None else pc.coalesce(known, array)
                declared.extra_kinds = frozenset(attribute.kinds)
                continue
            out[name] = attribute
    return out


def declared_columns(batch: pa.Schema, extra: pa.Array | pa.ChunkedArray | None) -> pa.Schema:
    """The batch's columns whose values are all in the column (``drift.plan_layout`` checks
    them by their type alone): a column whose name is also a key of ``_extra`` (the source
    keeps a value of another type there) is left out, and its values are checked one by one.
    Found with one substring scan per column (a false hit only costs that check)."""
    names = [f.name for f in batch if f.name not in META_COLUMNS]
    if extra is None or not names or extra.null_count == len(extra):
        return batch
    texts = extra.combine_chunks() if isinstance(extra, pa.ChunkedArray) else extra
    mixed = {name for name in names if pc.any(pc.match_substring(
        texts, json.dumps(name) + ":")).as_py()}
    return pa.schema([f for f in batch if f.name not in mixed]) if mixed else batch


def _masked(values: pa.Array, live: pa.Array | None) -> pa.Array:
    return values if live is None else pc.if_else(live, values, pa.nulls(len(values),
                                                                           values.type))


def extra_attributes(extra: pa.Array) -> dict[str, Attribute]:
    """``_extra``'s JSON objects as attributes (module doc), aligned with ``extra``."""
    if not pc.any(pc.is_valid(extra)).as_py():
        return {}
    texts = pc.fill_null(extra, "{}")
    lines = pa.py_buffer("\n".join(texts.to_pylist()).encode())
    try:
        parsed = pa_json.read_json(lines)
        dated = [f.name for f in parsed.schema if pa.types.is_timestamp(f.type)]
        if dated:  # the reader takes date-like strings for timestamps: they are strings
            parsed = pa_json.read_json(lines, parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema([(name, pa.string()) for name in dated])))
    except (pa.ArrowInvalid, ValueError):
        return _rows_parsed(extra)
    out: dict[str, Attribute] = {}
    for name, column in zip(parsed.column_names, parsed.columns, strict=True):
        kinds = _kinds(name, column.combine_chunks(), texts)
        if kinds is None:
            return _rows_parsed(extra)
        if kinds:
            out[name] = Attribute(name, kinds)
    return out


def _kinds(name: str, values: pa.Array, texts: pa.Array) -> dict[pa.DataType, pa.Array] | None:
    """The values of one ``_extra`` attribute by kind, or None (row by row then)."""
    typ = values.type
    if pa.types.is_null(typ):
        return {}
    if typ in (pa.int64(), pa.string(), pa.bool_()):
        return {typ: values}
    if typ == pa.float64():  # integers and fractions merged by the reader: split them again
        literal = re.escape(json.dumps(name))
        number = f'[{{,]\\s*{literal}\\s*:\\s*(?P<v>-?[0-9]+)\\s*[,}}]'
        integers = pc.match_substring_regex(texts, number)
        if not pc.any(integers).as_py():
            return {typ: values}
        exact = pc.extract_regex(texts, number)
        ints = pc.struct_field(exact, [0]).cast(pa.int64())
        ints = pc.if_else(integers, ints, pa.nulls(len(ints), pa.int64()))
        return {pa.int64(): ints, typ: pc.if_else(integers, pa.nulls(len(values), typ), values)}
    if pa.types.is_struct(typ) and [f.name for f in typ] == ["$binary"]:
        b64 = pc.struct_field(values, [0]).to_pylist()
        return {pa.binary(): pa.array([None if v is None else base64.b64decode(v) for v in b64],
                                      pa.binary())}
    return None


def _rows_parsed(extra: pa.Array) -> dict[str, Attribute]:
    """``_extra`` parsed row by row (the reader could not take it as columns)."""
    by_name: dict[str, dict[pa.DataType, dict[int, Any]]] = {}
    texts = extra.to_pylist()
    for i, text in enumerate(texts):
        for name, raw in (json.loads(text) if text else {}).items():
            value = from_json(raw)
            if value is not None:
                by_name.setdefault(name, {}).setdefault(natural_type(value), {})[i] = value
    return {name: Attribute(name, {typ: pa.array([values.get(i) for i in range(len(texts))],
                                                 typ) for typ, values in kinds.items()})
            for name, kinds in by_name.items()}


def from_json(value: Any) -> Any:
    """A value of ``_extra`` as Python: ``{"$binary": b64}`` is bytes; nested values stay JSON."""
    if isinstance(value, dict):
        if set(value) == {"$binary"}:
            return base64.b64decode(value["$binary"])
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return value
