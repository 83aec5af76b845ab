"""Schema change: the policy names and the type lattice that the source and the targets share.

Tablestore attributes (and DynamoDB's) have no declared type: the same attribute may hold an
INTEGER in one row and a STRING in the next, and new attributes appear whenever an application
writes one. What happens to a value that has no column it fits is one policy, named as Flink
CDC names its ``schema.change.behavior``:

- the source (``connector``: the reader option ``schema.change.behavior``, executors) decides
  where a value read from the tunnel goes in the query's fixed output columns
  (``connector.tunnel.column_values``, ``connector.schema``; docs/schema.md);
- the apply sink (``tablestore_cdc.lakehouse.drift``, driver) decides where it is stored in a
  Delta or Iceberg table, whose columns may grow and widen (docs/lakehouse.md).

Defined once here, below both: the policy names with the aliases of earlier versions
(``canonical_policy``), and the **lattice** of lossless widening: int8 ⊂ int16 ⊂ int32 ⊂ int64;
float32 ⊂ float64; int8, int16 and int32 ⊂ float64 (every value exact). int64 is *not* below
float64 (a double holds integers exactly only up to 2^53): an integer **value** fits a double
column when its magnitude is at most 2^53 (2^24 for float32). A fraction never goes into an
integer column, a boolean never into a number column; ``widen_to_string=True`` (off by
default) lets any value into a string column as its text.

Pure functions over values and Arrow types; no I/O. Imports pyarrow (both callers already do).
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa

EXCEPTION, EVOLVE, TRY_EVOLVE, LENIENT, IGNORE = (
    "exception", "evolve", "try_evolve", "lenient", "ignore")
POLICIES = (EXCEPTION, EVOLVE, TRY_EVOLVE, LENIENT, IGNORE)
#: the names of earlier versions (the apply sink's ``schema_drift``), kept working
ALIASES = {"fail": EXCEPTION, "add": EVOLVE, "keep": IGNORE}
#: the default of schemaless sources (Tablestore, the embedded store, DynamoDB) and of the sink
DEFAULT_POLICY = LENIENT
#: what an error shows as the allowed policy names
POLICIES_ALLOWED = (", ".join(POLICIES) + " (aliases: "
                    + ", ".join(f"{a}={p}" for a, p in ALIASES.items()) + ")")

INTEGERS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
#: the largest magnitude of an integer every float type holds exactly (its mantissa)
EXACT_INTEGER = {pa.float32(): 2 ** 24, pa.float64(): 2 ** 53}
TIMESTAMP = pa.timestamp("us", tz="UTC")


def policy_named(name: str) -> str | None:
    """The policy ``name`` stands for (an alias resolved, any case, surrounding blanks
    ignored); None when it names none (the caller raises its own option error)."""
    key = name.strip().lower()
    policy = ALIASES.get(key, key)
    return policy if policy in POLICIES else None


def adds_columns(policy: str) -> bool:
    """Whether a new attribute becomes a new column (where the columns can change)."""
    return policy in (EVOLVE, TRY_EVOLVE, LENIENT)


def keeps_misfits(policy: str) -> bool:
    """Whether a value with no column it fits is kept in ``_extra`` (else it fails the batch;
    the source under ``ignore`` drops it instead: docs/schema.md)."""
    return policy in (TRY_EVOLVE, LENIENT, IGNORE)


# --- values ----------------------------------------------------------------------------------

#: a Python value's type as Tablestore names it (errors and typed ``_extra`` say these)
TABLESTORE_KINDS: dict[type, str] = {
    bool: "BOOLEAN", int: "INTEGER", float: "DOUBLE", str: "STRING", bytes: "BINARY",
    bytearray: "BINARY",
}


def tablestore_kind(value: Any) -> str:
    """``value``'s type as Tablestore names it (INTEGER, DOUBLE, ...; else its Python name)."""
    return TABLESTORE_KINDS.get(type(value), type(value).__name__)


def type_name(value: Any) -> str:
    """A value's type as the lattice names it (Arrow's names: int64, double, string, ...)."""
    return str(natural_type(value))


def natural_type(value: Any) -> pa.DataType:
    """The column type a value of a new attribute makes (Tablestore's INTEGER is int64)."""
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, bytes):
        return pa.binary()
    if isinstance(value, dt.datetime):
        return TIMESTAMP
    if isinstance(value, dt.date):
        return pa.date32()
    if isinstance(value, decimal.Decimal):
        return pa.decimal128(38, 18)
    return pa.string()


def fits(value: Any, typ: pa.DataType, widen_to_string: bool = False) -> bool:
    """Whether ``value`` can be stored in a column of ``typ`` without losing anything."""
    if widen_to_string and is_string(typ):
        return True
    if isinstance(value, bool):
        return pa.types.is_boolean(typ)
    if isinstance(value, int):
        if pa.types.is_integer(typ):
            bits = typ.bit_width - (1 if pa.types.is_signed_integer(typ) else 0)
            low = -(2 ** bits) if pa.types.is_signed_integer(typ) else 0
            return low <= value < 2 ** bits
        if pa.types.is_floating(typ):
            return abs(value) <= EXACT_INTEGER.get(typ, 0)
        if pa.types.is_decimal(typ):
            return abs(value) < 10 ** (typ.precision - typ.scale)
        return False
    if isinstance(value, float):
        if typ == pa.float64():
            return True
        if typ == pa.float32():
            return pa.scalar(value, pa.float32()).as_py() == value or value != value
        return False
    if isinstance(value, str):
        return is_string(typ)
    if isinstance(value, bytes | bytearray):
        return is_binary(typ)
    if isinstance(value, dt.datetime):
        return pa.types.is_timestamp(typ)
    if isinstance(value, dt.date):
        return pa.types.is_date(typ)
    return True  # other Arrow values (decimals, ...): Arrow's own conversion decides


def type_fits(source: pa.DataType, target: pa.DataType, widen_to_string: bool = False) -> bool:
    """Whether every value of a column of type ``source`` fits a column of type ``target``
    (a declared column checked by its type, without looking at its values)."""
    if source == target or (widen_to_string and is_string(target)):
        return True
    if pa.types.is_integer(source) and pa.types.is_integer(target):
        return (pa.types.is_signed_integer(source) == pa.types.is_signed_integer(target)
                and source.bit_width <= target.bit_width)
    if pa.types.is_integer(source) and pa.types.is_floating(target):
        return 2 ** source.bit_width <= EXACT_INTEGER.get(target, 0) * 2
    if pa.types.is_floating(source) and pa.types.is_floating(target):
        return source.bit_width <= target.bit_width
    if pa.types.is_timestamp(source) and pa.types.is_timestamp(target):
        return True
    return (is_string(source) and is_string(target)) or (
        is_binary(source) and is_binary(target))


def promotion(value: Any, column: pa.DataType) -> pa.DataType | None:
    """The narrowest type of the lattice above ``column`` that ``value`` fits (None: none)."""
    if isinstance(value, bool):
        return None
    if pa.types.is_integer(column) and pa.types.is_signed_integer(column):
        if isinstance(value, int):
            return next((t for t in INTEGERS if t.bit_width > column.bit_width
                         and fits(value, t)), None)
        if isinstance(value, float) and column.bit_width <= 32:
            return pa.float64()  # int8/16/32 are exact in a double
        return None
    if column == pa.float32() and isinstance(value, int | float) and fits(value, pa.float64()):
        return pa.float64()
    return None


def join(types: list[pa.DataType]) -> pa.DataType | None:
    """The narrowest lattice type every one of ``types`` fits by type (None: none)."""
    joined = types[0]
    for typ in types[1:]:
        if type_fits(typ, joined):
            continue
        if type_fits(joined, typ):
            joined = typ
        elif {joined, typ} == {pa.int64(), pa.float64()}:
            joined = pa.float64()  # integers then fit value by value (up to 2^53)
        else:
            return None
    return joined


def is_string(typ: pa.DataType) -> bool:
    return pa.types.is_string(typ) or pa.types.is_large_string(typ)


def is_binary(typ: pa.DataType) -> bool:
    return pa.types.is_binary(typ) or pa.types.is_large_binary(typ)


__all__ = [
    "ALIASES",
    "DEFAULT_POLICY",
    "EVOLVE",
    "EXACT_INTEGER",
    "EXCEPTION",
    "IGNORE",
    "INTEGERS",
    "LENIENT",
    "POLICIES",
    "POLICIES_ALLOWED",
    "TABLESTORE_KINDS",
    "TIMESTAMP",
    "TRY_EVOLVE",
    "adds_columns",
    "fits",
    "is_binary",
    "is_string",
    "join",
    "keeps_misfits",
    "natural_type",
    "policy_named",
    "promotion",
    "tablestore_kind",
    "type_fits",
    "type_name",
]
