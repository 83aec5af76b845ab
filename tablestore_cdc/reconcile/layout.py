"""How a source row and a target row are compared: one Arrow layout both sides are put into.

Both sides are turned into record batches of one schema (``CompareLayout.schema``) before they
are hashed, so equal rows give equal bytes whatever the backend or format:

- the **key columns**, with the source's declared key types (INTEGER -> int64, STRING ->
  string, BINARY -> binary; a DynamoDB ``N`` key -> float64); the target's key columns are cast
  to them;
- one **value column** per attribute that has a column: every data column of the target (but
  ``_extra``, the soft-delete column, the SCD 2 validity columns and ``--ignore-column``s), and
  every attribute the source declares; its type is the target column's (integers as int64,
  floating point as float64, strings, binaries, booleans, timestamps), else the declared one;
- ``__rest``: the attributes without a column of their own, as canonical JSON (sorted keys,
  bytes as ``{"$binary": base64}``; ``connector.tunnel.page.to_json``, the encoding of the
  stream's and the target's ``_extra``), null when there are none. On the source these are
  the undeclared attributes the target has no column for; on the target the content of its
  ``_extra`` column (``schema_drift=keep``).

Value rules (what "equal" means):

- a null and a missing attribute are the same thing: an attribute only one side has, or a
  column only one side has, is equal when it is null or absent on the other;
- values are equal when they have the same type and value after one conversion the apply sink
  itself makes: an integer into a floating-point column (``5`` equals ``5.0`` there); a value
  that does not fit its column's type (a string where the target has an integer column, a
  bool where it has an integer) is kept, with its own type, in ``__rest``, so it never equals
  the other side's column value;
- in ``__rest``, JSON keeps a number's kind: ``5`` and ``5.0`` differ there, as they differ in
  the source (the apply keeps them as written);
- bytes equal bytes only (never a string with the same characters); ``-0.0`` and ``0.0``
  differ, as their bits do; a NaN equals a NaN.

Called in the CLI's process by ``tablestore_cdc.reconcile.compare``, a page or batch at a time.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from connector.tunnel import TableSchema
from connector.tunnel.page import TABLESTORE_TO_ARROW, to_json
from tablestore_cdc.lakehouse import END_AT, START_AT
from tablestore_cdc.lakehouse.changes import from_json
from tablestore_cdc.lakehouse.plan import EXTRA_COLUMN
from tablestore_cdc.reconcile.errors import TargetLayoutError
from tablestore_cdc.reconcile.source import Row

#: the compared attributes without a column of their own (canonical JSON)
REST = "__rest"
TIMESTAMP = pa.timestamp("us", tz="UTC")

Key = tuple[Any, ...]


def compared_type(typ: pa.DataType) -> pa.DataType:
    """The type a target column's values are compared in."""
    t = pa.types
    if t.is_integer(typ):
        return pa.int64()
    if t.is_floating(typ):
        return pa.float64()
    if t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ):
        return pa.string()
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_binary_view(typ):
        return pa.binary()
    if t.is_timestamp(typ):
        return TIMESTAMP
    return typ


#: compared column type -> the Python types of the values it takes (the module's rules)
_FITTING: dict[pa.DataType, tuple[type, ...]] = {
    pa.int64(): (int,), pa.float64(): (float, int), pa.bool_(): (bool,), pa.string(): (str,),
    pa.binary(): (bytes,)}


def fits(value: Any, typ: pa.DataType) -> bool:
    """Whether ``value`` goes into a compared column of ``typ`` (the module's rules)."""
    if typ == TIMESTAMP:
        return isinstance(value, dt.datetime)
    return type(value) in _FITTING.get(typ, ())


@dataclass(frozen=True)
class CompareLayout:
    """The compared columns of one source/target pair (module docstring)."""

    key_columns: tuple[str, ...]
    key_types: tuple[pa.DataType, ...]
    #: (name, compared type) of every value column
    value_columns: tuple[tuple[str, pa.DataType], ...]
    #: the value columns the target has (the others are null on its side)
    target_has: frozenset[str]
    #: whether the target has an ``_extra`` column to read
    target_extra: bool
    #: attributes left out on both sides (``--ignore-column``)
    ignored: frozenset[str] = frozenset()

    @classmethod
    def build(cls, source: TableSchema, target: pa.Schema, *,
              soft_delete_column: str | None = None, ignore: Iterable[str] = (),
              target_name: str = "target") -> CompareLayout:
        keys = tuple(c.name for c in source.primary_key)
        missing = [k for k in keys if k not in target.names]
        if missing:
            raise TargetLayoutError(target=target_name, problem=f"no key column(s) {missing} "
                                    f"(the source's key is {list(keys)})",
                                    hint="check --target and --table")
        skipped = {*keys, EXTRA_COLUMN, START_AT, END_AT, *ignore}
        if soft_delete_column:
            skipped.add(soft_delete_column)
        columns: dict[str, pa.DataType] = {}
        for f in target:
            if f.name not in skipped:
                columns[f.name] = compared_type(f.type)
        for c in source.columns:
            if c.name not in skipped and c.name not in columns:
                columns[c.name] = TABLESTORE_TO_ARROW[c.type]
        return cls(key_columns=keys,
                   key_types=tuple(TABLESTORE_TO_ARROW[c.type] for c in source.primary_key),
                   value_columns=tuple(columns.items()),
                   target_has=frozenset(n for n in columns if n in target.names),
                   target_extra=EXTRA_COLUMN in target.names,
                   ignored=frozenset(ignore))

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([*zip(self.key_columns, self.key_types, strict=True),
                          *self.value_columns, (REST, pa.string())])

    @property
    def target_columns(self) -> list[str]:
        """The target columns to read."""
        names = [*self.key_columns, *(n for n, _ in self.value_columns if n in self.target_has)]
        return [*names, EXTRA_COLUMN] if self.target_extra else names

    # --- one side into the layout ---------------------------------------------------------------

    def from_source(self, rows: Sequence[Row]) -> pa.RecordBatch:
        """A page of source rows in the layout."""
        arrays = [pa.array([pk.get(k) for pk, _ in rows], typ)
                  for k, typ in zip(self.key_columns, self.key_types, strict=True)]
        skip = {n for n, _ in self.value_columns} | self.ignored
        rests: list[dict[str, Any]] = [
            {k: v for k, v in attrs.items() if v is not None and k not in skip}
            for _, attrs in rows]
        for name, typ in self.value_columns:
            values = [attrs.get(name) for _, attrs in rows]
            arrays.append(_column(values, typ, name, rests))
        arrays.append(pa.array([to_json(r) if r else None for r in rests], pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def from_target(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A batch of target rows (``target_columns``) in the layout."""
        n = batch.num_rows
        arrays = [batch.column(k).cast(typ)
                  for k, typ in zip(self.key_columns, self.key_types, strict=True)]
        rests: list[dict[str, Any]] = [{} for _ in range(n)] if self.target_extra else []
        from_extra: dict[str, dict[int, Any]] = {}
        if self.target_extra:
            named = {name for name, _ in self.value_columns}
            for i, text in enumerate(batch.column(EXTRA_COLUMN).to_pylist()):
                if not text:
                    continue
                for k, v in json.loads(text).items():
                    if v is None or k in self.ignored:
                        continue
                    if k in named:
                        from_extra.setdefault(k, {})[i] = from_json(v)
                    else:
                        rests[i][k] = from_json(v)
        for name, typ in self.value_columns:
            if name not in self.target_has:
                column = pa.nulls(n, typ)
            else:
                column = batch.column(name)
                column = column.cast(typ) if column.type != typ else column
            patch = from_extra.get(name)
            if patch:  # an _extra attribute that has a column on this pair: into it
                values = column.to_pylist()
                for i, v in patch.items():
                    if values[i] is None:
                        values[i] = v
                column = _column(values, typ, name, rests)
            arrays.append(column)
        rest = ([to_json(r) if r else None for r in rests] if self.target_extra
                else [None] * n)
        arrays.append(pa.array(rest, pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _column(values: list[Any], typ: pa.DataType, name: str,
            rests: list[dict[str, Any]]) -> pa.Array:
    """``values`` as a column of ``typ``; a value that does not fit goes to its row's rest."""
    if not all(v is None or fits(v, typ) for v in values):
        for i, v in enumerate(values):
            if v is not None and not fits(v, typ):
                rests[i][name] = v
                values[i] = None
    return pa.array(values, typ)


def row_attributes(row: Mapping[str, Any], layout: CompareLayout) -> dict[str, Any]:
    """One laid-out row's compared attributes (non-null columns and ``__rest``), for reports."""
    out = {n: row[n] for n, _ in layout.value_columns if row.get(n) is not None}
    if row.get(REST):
        out.update({k: from_json(v) for k, v in json.loads(row[REST]).items()})
    return out
