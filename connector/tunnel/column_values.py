"""Values into a page's typed columns: what fits a column, and where a value that does not goes.

A page's layout columns are typed (``PageLayout``: the table's declared key, the ``catalog``
option, or a schema the user gave); Tablestore attributes are not (the same attribute may hold
an INTEGER in one row and a STRING in the next). ``column_array(values, name, typ)`` makes one
column's Arrow array from the values records hold for it and hands back, apart, every value that
does not fit: its cell is null and the page keeps the value in ``_extra`` with its own type
(``page.layout_arrays``), where the reader's ``schema.change.behavior`` finds it after the
batch's end is claimed (``connector.schema``). Never a value converted with a loss: pyarrow
alone would turn a DOUBLE 1.5 into the bigint 1, a BOOLEAN into the double 1.0, or fail with
its own error types.

What fits the five column types a tunnel declares is the shared lattice's rule
(``cdc_common.schema_change.fits``: an INTEGER into a double column up to 2^53, never a
fraction into an integer column, a BOOLEAN, STRING or BINARY into its own type only), with one
addition of the source's: a DOUBLE holding a whole number in range fits a bigint column
(DynamoDB's numbers arrive as doubles; the value is unchanged). Any other Arrow type (a schema
given by the user: int, decimal, timestamp ...) takes what pyarrow converts; what it refuses
does not fit.

Called where a page is built on executors: ``page.records_to_page`` (backends without a
columnar store) and ``tunnel.tablestore.records.decode_columns_python`` (the PlainBuffer
decoder; the compiled one hands a page with a value of another type than its column over to
it, so both decide alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cdc_common.schema_change import fits

#: the Python types each of the five column types takes as they are (None is a null): a page
#: whose values are all of these is built without a look at any single value
_TAKES: dict[pa.DataType, frozenset[type]] = {
    pa.int64(): frozenset({int}),
    pa.float64(): frozenset({float}),
    pa.bool_(): frozenset({bool}),
    pa.string(): frozenset({str}),
    pa.binary(): frozenset({bytes}),
}
_NONE = type(None)
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                 OverflowError, TypeError, ValueError)


class ColumnValueError(ValueError):
    """pyarrow refused a column although every value alone converts (``column`` the name):
    the caller turns it into its ``MalformedRecordError``."""

    def __init__(self, column: str, reason: str) -> None:
        super().__init__(f"column {column!r}: {reason}")
        self.column, self.reason = column, reason


def value_fits(value: Any, typ: pa.DataType) -> bool:
    """Whether a value read from a tunnel fits a page column of one of the five types
    (module docstring)."""
    if type(value) is float and typ == pa.int64():
        return value.is_integer() and -2.0**63 <= value < 2.0**63
    return fits(value, typ)


def column_array(values: Sequence[Any], name: str,
                 typ: pa.DataType) -> tuple[pa.Array, dict[int, Any]]:
    """``values`` (one per record of the page, None for a null) as an Arrow array of ``typ``,
    and the values that do not fit it by their record's index in the page (null in the array).

    Per column first: a column whose values are all of the types it takes is one ``pa.array``
    call; only a column holding another type looks at its values one by one."""
    misfits: dict[int, Any] = {}
    takes = _TAKES.get(typ)
    if takes is not None:
        kinds = set(map(type, values))
        kinds.discard(_NONE)
        if not kinds <= takes:
            values = list(values)
            for row, value in enumerate(values):
                if value is not None and not value_fits(value, typ):
                    misfits[row] = value
                    values[row] = None
    try:
        return pa.array(values, type=typ), misfits
    except _ARROW_ERRORS as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    values = list(values)
    for row, value in enumerate(values):  # pyarrow decides value by value
        if value is not None:
            try:
                pa.array([value], type=typ)
            except _ARROW_ERRORS:
                misfits[row] = value
                values[row] = None
    try:
        return pa.array(values, type=typ), misfits
    except _ARROW_ERRORS:
        raise ColumnValueError(name, f"pyarrow refused the column: {detail}") from None


__all__ = ["ColumnValueError", "column_array", "value_fits"]
