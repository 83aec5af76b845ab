"""The page: the columnar shape every tunnel backend fills for the executor's read path.

A ``Page`` is what ``TunnelService.read_page`` returns: up to ``limit`` consecutive change
records of one channel as one Arrow record batch, plus the token to continue from. The reader
(``connector.reader``) claims a channel's end from page counts and end tokens and hands the
batches on to Spark; it never builds a Python object per record.

Columns of a page batch, in this order (``page_schema``):

- the ``PageLayout``'s columns, typed: the row *after* the change (key columns and attribute
  values), null where the row has no such value (for a DELETE only the key is set);
- ``_op`` (string), ``_sequence`` (string, sortable within the channel), ``_commit_ts``
  (timestamp, microseconds, UTC);
- ``_before``: the attribute columns before the change as canonical JSON text (sorted keys,
  compact, ASCII; bytes as ``{"$binary": base64}``), null when unknown;
- ``_extra``: the after-image values the layout has no column for, as the same JSON, else null.

``_channel_id`` is not in a page: the reader adds it (one constant per partition).

Who builds pages: a backend that stores changes columnar overrides ``read_page`` (the local
store seals changes into Arrow segments, ``connector.tunnel.local.segments``); any other
backend gets the default ``TunnelService.read_page``, which converts ``read_records`` with
``records_to_page``.
Runs on executors (and in the local store's writer, which seals segments).
"""

from __future__ import annotations

import base64
import decimal
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from connector.errors import MalformedRecordError
from connector.tunnel.column_values import ColumnValueError, column_array
from connector.tunnel.types import Op, Record, TableSchema

#: Tablestore type name -> Arrow type of a page column (the Spark type's Arrow form)
TABLESTORE_TO_ARROW: dict[str, pa.DataType] = {
    "INTEGER": pa.int64(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "STRING": pa.string(),
    "BINARY": pa.binary(),
}

#: the metadata columns every page carries after the layout's columns
PAGE_METADATA: tuple[pa.Field, ...] = (
    pa.field("_op", pa.string(), False),
    pa.field("_sequence", pa.string(), False),
    pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_before", pa.string()),
    pa.field("_extra", pa.string()),
)
PAGE_METADATA_NAMES = frozenset(f.name for f in PAGE_METADATA)


@dataclass(frozen=True)
class PageLayout:
    """Which value columns a page carries, with their Arrow types (the reader's output schema
    minus the metadata columns). Values the layout has no column for go to ``_extra``."""

    columns: tuple[tuple[str, pa.DataType], ...]

    @classmethod
    def of_table(cls, table: TableSchema) -> PageLayout:
        """Every declared column of ``table`` (keys first): the default output schema's."""
        return cls(tuple((c.name, TABLESTORE_TO_ARROW[c.type])
                         for c in (*table.primary_key, *table.columns)))

    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.columns)

    def same_columns(self, other: PageLayout) -> bool:
        """Same names and types, in any order (a page of one serves the other by name)."""
        return dict(self.columns) == dict(other.columns)


def page_schema(layout: PageLayout) -> pa.Schema:
    return pa.schema([pa.field(n, t) for n, t in layout.columns] + list(PAGE_METADATA))


def empty_page_batch(layout: PageLayout) -> pa.RecordBatch:
    schema = page_schema(layout)
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


@dataclass(frozen=True)
class EncodedBatch:
    """Rows ``offset .. offset + count`` of an Arrow IPC stream holding one record batch
    (compressed or not), decoded only when asked: a page can be held compactly until the
    reader's claim is recorded. ``columns``: pick these columns (by name) after decoding."""

    data: bytes
    offset: int
    count: int
    last_sequence: str
    columns: tuple[str, ...] | None = None

    def decode(self) -> pa.RecordBatch:
        batch = pa.ipc.open_stream(self.data).read_next_batch().slice(self.offset, self.count)
        return batch.select(list(self.columns)) if self.columns is not None else batch

    def head(self, n: int) -> EncodedBatch:
        return self.part(0, n)

    def part(self, skip: int, n: int) -> EncodedBatch:
        """Rows ``skip .. skip + n`` of these (no copy, still encoded)."""
        if skip == 0 and n >= self.count:
            return self
        last = self.last_sequence if skip + n >= self.count else ""
        return EncodedBatch(self.data, self.offset + skip, min(n, self.count - skip), last,
                            self.columns)


class Page:
    """Up to ``limit`` records of one channel, columnar (see the module docstring).

    ``next_token`` and ``may_more`` mean what they mean in ``ReadResult``. A backend builds a
    page from an Arrow batch, ``Page(batch, next_token, may_more, tokens=...)``; one that stores
    pages serialized may pass ``encoded=`` instead, and the batch is then decoded on each
    access of ``batch`` (the reader accesses it once, when it hands the page on). ``tokens(n)``
    is the token after the page's first ``n`` records (``0 < n < count``), made without a
    request -- each backend knows how its tokens count records -- so a read can stop inside a
    page (``token_after``).
    """

    __slots__ = ("_batch", "_encoded", "_tokens", "next_token", "may_more")

    def __init__(self, batch: pa.RecordBatch | None, next_token: str, may_more: bool, *,
                 encoded: EncodedBatch | None = None,
                 tokens: Callable[[int], str] | None = None) -> None:
        if (batch is None) == (encoded is None):
            raise ValueError("a page holds either a batch or an encoded batch")
        self._batch, self._encoded, self._tokens = batch, encoded, tokens
        self.next_token, self.may_more = next_token, may_more

    @property
    def batch(self) -> pa.RecordBatch:
        if self._batch is not None:
            return self._batch
        assert self._encoded is not None
        return self._encoded.decode()

    @property
    def count(self) -> int:
        if self._encoded is not None:
            return self._encoded.count
        assert self._batch is not None
        return int(self._batch.num_rows)

    @property
    def last_sequence(self) -> str | None:
        if not self.count:
            return None
        if self._encoded is not None and self._encoded.last_sequence:
            return self._encoded.last_sequence
        return str(self.batch.column("_sequence")[-1].as_py())

    def head(self, n: int) -> Page:
        """The page's first ``n`` records (no copy; the tokens are not adjusted)."""
        if self._encoded is not None:
            return Page(None, self.next_token, self.may_more, encoded=self._encoded.head(n))
        assert self._batch is not None
        return Page(self._batch.slice(0, n), self.next_token, self.may_more)

    def token_after(self, n: int) -> str:
        """The token after the page's first ``n`` records, without asking the service again:
        ``next_token`` for all of them (an empty page's too), else what the backend's
        ``tokens`` says. ``ValueError`` for a page whose backend gave no ``tokens``."""
        if n == self.count:
            return self.next_token
        if not 0 < n < self.count:
            raise ValueError(f"no token after {n} record(s) of a page of {self.count}")
        if self._tokens is None:
            raise ValueError("this page cannot tell a token inside it (no tokens given)")
        return self._tokens(n)

    def part(self, skip: int, n: int) -> Page:
        """Records ``skip .. skip + n`` of the page (no copy), ending at the token after them;
        ``may_more`` as the page's when they end it, else true."""
        if skip == 0 and n >= self.count:
            return self
        ends = skip + n >= self.count
        tokens = None if self._tokens is None else (lambda k: self.token_after(skip + k))
        next_token = self.token_after(min(skip + n, self.count))
        may_more = self.may_more if ends else True
        if self._encoded is not None:
            return Page(None, next_token, may_more, encoded=self._encoded.part(skip, n),
                        tokens=tokens)
        assert self._batch is not None
        return Page(self._batch.slice(skip, n), next_token, may_more, tokens=tokens)

    def __repr__(self) -> str:
        return f"Page(count={self.count}, next_token={self.next_token!r}, " \
               f"may_more={self.may_more})"


# --- JSON text of the _before / _extra columns -------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"$binary": base64.b64encode(value).decode()}
    if isinstance(value, decimal.Decimal) and value.is_finite():
        # a DynamoDB number read as a Decimal (numbers=decimal) that no column took: a JSON
        # number, an integer exactly (as the codec writes the numbers it sends to JSON)
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


#: ``json.dumps(value, default=_json_default, sort_keys=True, separators=(",", ":"))``, built
#: once (``json.dumps`` with options builds a new encoder on every call)
ENCODE_JSON = json.JSONEncoder(default=_json_default, sort_keys=True,
                               separators=(",", ":")).encode


def to_json(values: dict[str, Any] | None) -> str | None:
    return None if values is None else ENCODE_JSON(values)


# --- records -> page (backends without a columnar store) ---------------------------------------


def records_to_page(records: Sequence[Record], layout: PageLayout, *,
                    token: str = "") -> pa.RecordBatch:
    """The page batch of ``records`` (Python objects, e.g. from ``read_records`` after
    ``token``).

    Per record only the merged row (key + after image) is made; every column is then one list
    comprehension and one array (``layout_arrays``: a value of another type than its column is
    kept in ``_extra``); ``_commit_ts`` is cast from integer microseconds.
    """
    names = layout.names()
    rows: list[Any] = []
    extras: list[str | None] = []
    for r in records:
        op = r.op
        pk = r.primary_key
        # the row after the change: key columns + ``Record.after_image()``
        if op is Op.DELETE:
            values = pk if type(pk) is dict else dict(pk)
        elif op is Op.UPDATE and r.before is not None:
            values = dict(pk)
            after = r.after_image()
            if after:
                values.update(after)
        else:  # PUT, or UPDATE without before-image: after_image() is the columns
            values = {**pk, **r.columns}
        rows.append(values)
        if values.keys() <= names:
            extras.append(None)
        else:
            extras.append(ENCODE_JSON({k: v for k, v in values.items() if k not in names}))
    schema = page_schema(layout)
    channel_id = records[0].channel_id if records else ""
    arrays = layout_arrays(rows, layout, extras, channel_id=channel_id, token=token)
    arrays.append(pa.array([r.op.value for r in records], type=pa.string()))
    arrays.append(pa.array([r.sequence for r in records], type=pa.string()))
    arrays.append(pa.array([r.commit_ts_us for r in records], type=pa.int64())
                  .cast(schema.field("_commit_ts").type))
    arrays.append(pa.array([None if r.before is None else ENCODE_JSON(
        r.before if type(r.before) is dict else dict(r.before)) for r in records],
        type=pa.string()))
    arrays.append(pa.array(extras, type=pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def layout_arrays(rows: Sequence[dict[str, Any]], layout: PageLayout,
                  extras: list[str | None], *, channel_id: str, token: str) -> list[pa.Array]:
    """The layout's columns of a page, one array each, from the rows after each change
    (executor; ``records_to_page`` and the PlainBuffer decoder's Python path).

    A value that does not fit its column (``column_values``) is null there and kept in the row's
    ``_extra`` with its own type, beside the undeclared values (``extras`` is rewritten for
    those rows): the page never fails on a value, and the reader applies the query's
    ``schema.change.behavior`` after the batch's end is claimed (``connector.schema``)."""
    arrays: list[pa.Array] = []
    misfits: dict[int, dict[str, Any]] = {}
    try:
        for name, typ in layout.columns:
            array, refused = column_array([v.get(name) for v in rows], name, typ)
            arrays.append(array)
            for row, value in refused.items():
                misfits.setdefault(row, {})[name] = value
    except ColumnValueError as exc:
        raise MalformedRecordError(channel_id=channel_id, token=token, reason=str(exc)) from None
    if misfits:
        names = layout.names()
        for row, kept in misfits.items():
            undeclared = {k: v for k, v in rows[row].items() if k not in names}
            try:
                extras[row] = ENCODE_JSON({**undeclared, **kept})
            except (TypeError, ValueError) as exc:
                raise MalformedRecordError(channel_id=channel_id, token=token,
                                           reason=f"record #{row}: {exc}") from None
    return arrays


def json_value(value: Any) -> Any:
    """One value of a ``_before`` / ``_extra`` JSON object as it was read (bytes for a
    ``{"$binary": ...}`` object, else the JSON value)."""
    if isinstance(value, dict) and set(value) == {"$binary"}:
        return base64.b64decode(value["$binary"])
    return value


__all__ = [
    "ENCODE_JSON",
    "EncodedBatch",
    "PAGE_METADATA",
    "PAGE_METADATA_NAMES",
    "TABLESTORE_TO_ARROW",
    "Page",
    "PageLayout",
    "empty_page_batch",
    "json_value",
    "layout_arrays",
    "page_schema",
    "records_to_page",
    "to_json",
]
