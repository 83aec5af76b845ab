"""Values into a page's typed columns: what fits a column, and the error when one does not.

A page's layout columns are typed (``PageLayout``: the table's declared key, the ``catalog``
option, or a schema the user gave). ``column_array(values, name, typ)`` makes one column's Arrow
array from the values records hold for it, and refuses a value of the wrong type with
``ColumnValueError`` naming the column and the record's index in the page, which the caller
turns into its ``MalformedRecordError`` (with the channel and the token). Never a value
converted with a loss: pyarrow alone would turn a DOUBLE 1.5 into the bigint 1, a BOOLEAN into
the double 1.0, or fail with its own error types.

What fits the five column types a tunnel declares: bigint -- an INTEGER, or a DOUBLE holding a
whole number in range; double -- a DOUBLE, or an INTEGER the double holds exactly; boolean -- a
BOOLEAN; string -- a STRING; binary -- a BINARY. Any other Arrow type (a schema given by the
user: int, decimal, timestamp ...) takes what pyarrow converts, and its refusal is a
``ColumnValueError`` too.

Called where a page is built on executors: ``page.records_to_page`` (backends without a
columnar store) and ``tunnel.tablestore.records.decode_columns_python`` (the PlainBuffer
decoder; the compiled one hands a page with a value of another type than its column over to
it, so both decide alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

#: the Python types each of the five column types takes as they are (None is a null)
_TAKES: dict[pa.DataType, frozenset[type]] = {
    pa.int64(): frozenset({int}),
    pa.float64(): frozenset({float, int}),
    pa.bool_(): frozenset({bool}),
    pa.string(): frozenset({str}),
    pa.binary(): frozenset({bytes, bytearray}),
}
_NONE = type(None)
#: what the errors call a Python value's type: the tunnel's type names
_KIND = {int: "INTEGER", float: "DOUBLE", bool: "BOOLEAN", str: "STRING", bytes: "BINARY",
         bytearray: "BINARY"}
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                 OverflowError, TypeError, ValueError)


class ColumnValueError(ValueError):
    """A value that does not fit its page column: ``row`` is its record's index in the page
    (None when pyarrow refused the column but no single value alone), ``column`` the name."""

    def __init__(self, row: int | None, column: str, reason: str) -> None:
        where = f"record #{row}: " if row is not None else ""
        super().__init__(f"{where}column {column!r}: {reason}")
        self.row, self.column, self.reason = row, column, reason


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _refusal(value: Any, typ: pa.DataType, detail: str = "") -> str:
    kind = _KIND.get(type(value), type(value).__name__)
    more = f" ({detail})" if detail else ""
    return f"{kind} value {_shown(value)} does not fit the column's declared type {typ}{more}"


def _fits(value: Any, typ: pa.DataType, takes: frozenset[type]) -> bool:
    kind = type(value)
    if kind is float and typ == pa.int64():
        return value.is_integer() and -2.0**63 <= value < 2.0**63
    return kind in takes


def column_array(values: Sequence[Any], name: str, typ: pa.DataType) -> pa.Array:
    """``values`` (one per record of the page, None for a null) as an Arrow array of ``typ``;
    ``ColumnValueError`` for the first value that does not fit (module docstring)."""
    takes = _TAKES.get(typ)
    if takes is not None:
        kinds = set(map(type, values))
        kinds.discard(_NONE)
        if not kinds <= takes or (float in kinds and typ == pa.int64()):
            for row, value in enumerate(values):
                if value is not None and not _fits(value, typ, takes):
                    raise ColumnValueError(row, name, _refusal(value, typ))
    try:
        return pa.array(values, type=typ)
    except _ARROW_ERRORS as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for row, value in enumerate(values):
            try:
                pa.array([value], type=typ)
            except _ARROW_ERRORS:
                raise ColumnValueError(row, name, _refusal(value, typ, detail)) from None
        raise ColumnValueError(None, name, f"pyarrow refused the column: {detail}") from None


__all__ = ["ColumnValueError", "column_array"]
