"""PlainBuffer, Tablestore's row encoding inside protobuf messages: read requests, write replies.

Used by ``table_api`` (and usable by ``tunnel_api`` for record payloads). Writing reuses the
SDK's own ``PlainBufferBuilder`` (the codec the client decodes with). Reading is done here: the
SDK's reader cannot read what its own writer sends to the server (``INF_MIN``/``INF_MAX``/
auto-increment key values, and update cells with a cell type fail in it).

Layout (little-endian): a 4-byte header 0x75, then per row ``TAG_ROW_PK`` + key cells,
optionally ``TAG_ROW_DATA`` + attribute cells, optionally ``TAG_DELETE_ROW_MARKER``, then
``TAG_ROW_CHECKSUM`` + a CRC-8 byte. A cell is ``TAG_CELL``, ``TAG_CELL_NAME`` + u32 length +
name, optionally ``TAG_CELL_VALUE`` + u32 length + type byte + value, optionally
``TAG_CELL_TYPE`` + op byte, optionally ``TAG_CELL_TIMESTAMP`` + i64, then ``TAG_CELL_CHECKSUM``
+ a byte. Checksums are not verified on the way in (the protobuf body is already MD5-checked).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tablestore_emulator.errors import parameter_invalid

HEADER = 0x75
TAG_ROW_PK, TAG_ROW_DATA, TAG_CELL, TAG_CELL_NAME, TAG_CELL_VALUE = 1, 2, 3, 4, 5
TAG_CELL_TYPE, TAG_CELL_TIMESTAMP, TAG_DELETE_ROW_MARKER, TAG_ROW_CHECKSUM = 6, 7, 8, 9
TAG_CELL_CHECKSUM = 10
VT_INTEGER, VT_DOUBLE, VT_BOOLEAN, VT_STRING, VT_NULL, VT_BLOB = 0, 1, 2, 3, 6, 7
VT_INF_MIN, VT_INF_MAX, VT_AUTO_INCREMENT = 9, 10, 11
#: Update cell ops (TAG_CELL_TYPE): delete one version, delete all versions, increment.
DELETE_ALL_VERSION, DELETE_ONE_VERSION, INCREMENT = 1, 3, 4


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Key values with no Python counterpart: the range bounds and "let the server allocate".
INF_MIN, INF_MAX, AUTO_INCREMENT = _Marker("INF_MIN"), _Marker("INF_MAX"), _Marker("AUTO_INCR")


@dataclass
class Cell:
    """An attribute cell: ``value`` is None for a delete; ``op`` is a cell op or None (= put)."""

    name: str
    value: Any
    op: int | None = None
    timestamp: int | None = None


@dataclass
class PlainRow:
    primary_key: list[tuple[str, Any]]
    cells: list[Cell]
    delete_marker: bool = False


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def need(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise parameter_invalid("Invalid PlainBuffer: unexpected end of data.")

    def byte(self) -> int:
        self.need(1)
        b = self.data[self.pos]
        self.pos += 1
        return b

    def peek(self) -> int | None:
        return self.data[self.pos] if self.pos < len(self.data) else None

    def u32(self) -> int:
        self.need(4)
        (v,) = struct.unpack_from("<I", self.data, self.pos)
        self.pos += 4
        return int(v)

    def i64(self) -> int:
        self.need(8)
        (v,) = struct.unpack_from("<q", self.data, self.pos)
        self.pos += 8
        return int(v)

    def raw(self, n: int) -> bytes:
        self.need(n)
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(b)

    def expect(self, tag: int, what: str) -> None:
        got = self.byte()
        if got != tag:
            raise parameter_invalid(f"Invalid PlainBuffer: expected {what}, got tag {got}.")

    def value(self) -> Any:
        size = self.u32()
        end = self.pos + size
        vt = self.byte()
        if vt == VT_INTEGER:
            v: Any = self.i64()
        elif vt == VT_DOUBLE:
            self.need(8)
            (v,) = struct.unpack_from("<d", self.data, self.pos)
            self.pos += 8
        elif vt == VT_BOOLEAN:
            v = self.byte() != 0
        elif vt == VT_STRING:
            try:
                v = self.raw(self.u32()).decode("utf-8")
            except UnicodeDecodeError:
                raise parameter_invalid("Invalid PlainBuffer: a string is not UTF-8.") from None
        elif vt == VT_BLOB:
            v = self.raw(self.u32())
        elif vt == VT_INF_MIN:
            v = INF_MIN
        elif vt == VT_INF_MAX:
            v = INF_MAX
        elif vt == VT_AUTO_INCREMENT:
            v = AUTO_INCREMENT
        elif vt == VT_NULL:
            v = None
        else:
            raise parameter_invalid(f"Invalid PlainBuffer: unknown value type {vt}.")
        if self.pos != end:
            raise parameter_invalid("Invalid PlainBuffer: a value's length does not match.")
        return v

    def cell(self) -> Cell:
        self.expect(TAG_CELL, "TAG_CELL")
        self.expect(TAG_CELL_NAME, "TAG_CELL_NAME")
        try:
            name = self.raw(self.u32()).decode("utf-8")
        except UnicodeDecodeError:
            raise parameter_invalid("Invalid PlainBuffer: a column name is not UTF-8.") from None
        cell = Cell(name, None)
        if self.peek() == TAG_CELL_VALUE:
            self.pos += 1
            cell.value = self.value()
        if self.peek() == TAG_CELL_TYPE:
            self.pos += 1
            cell.op = self.byte()
        if self.peek() == TAG_CELL_TIMESTAMP:
            self.pos += 1
            cell.timestamp = self.i64()
        self.expect(TAG_CELL_CHECKSUM, "TAG_CELL_CHECKSUM")
        self.byte()
        return cell

    def row(self) -> PlainRow:
        self.expect(TAG_ROW_PK, "TAG_ROW_PK")
        pk: list[tuple[str, Any]] = []
        while self.peek() == TAG_CELL:
            c = self.cell()
            pk.append((c.name, c.value))
        cells: list[Cell] = []
        if self.peek() == TAG_ROW_DATA:
            self.pos += 1
            while self.peek() == TAG_CELL:
                cells.append(self.cell())
        marker = False
        if self.peek() == TAG_DELETE_ROW_MARKER:
            self.pos += 1
            marker = True
        self.expect(TAG_ROW_CHECKSUM, "TAG_ROW_CHECKSUM")
        self.byte()
        return PlainRow(pk, cells, marker)


def read_row(data: bytes) -> PlainRow:
    """Decode one PlainBuffer row (a request's ``row``, ``row_change`` or ``primary_key``)."""
    r = _Reader(data)
    if r.u32() != HEADER:
        raise parameter_invalid("Invalid PlainBuffer: bad header.")
    row = r.row()
    if r.pos != len(data):
        raise parameter_invalid("Invalid PlainBuffer: trailing bytes after the row.")
    return row


def read_value(data: bytes) -> Any:
    """Decode a bare value (type byte + value; a column condition's ``column_value``)."""
    r = _Reader(struct.pack("<I", len(data)) + data)
    return r.value()


def _wire_value(value: Any) -> Any:
    # The SDK's writer sends ``bytes`` as STRING; BINARY needs a bytearray.
    return bytearray(value) if isinstance(value, bytes) else value


def write_row(
    primary_key: Sequence[tuple[str, Any]],
    columns: Iterable[tuple[str, Any]] = (),
    timestamp_ms: int | None = None,
) -> bytes:
    """Encode a row (key and attributes, each attribute stamped ``timestamp_ms``)."""
    from tablestore.plainbuffer.plain_buffer_builder import PlainBufferBuilder

    pk = [(n, _wire_value(v)) for n, v in primary_key]
    attrs: list[tuple[Any, ...]] = [
        (n, _wire_value(v)) if timestamp_ms is None else (n, _wire_value(v), timestamp_ms)
        for n, v in columns
    ]
    return bytes(PlainBufferBuilder.serialize_for_put_row(pk, attrs))


def write_rows(rows: Iterable[bytes]) -> bytes:
    """Concatenate encoded rows under one header (GetRange's ``rows``)."""
    parts = [r[4:] for r in rows]
    if not parts:
        return b""
    return struct.pack("<I", HEADER) + b"".join(parts)
