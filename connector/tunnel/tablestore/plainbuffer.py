"""PlainBuffer: Tablestore's row encoding, as carried in a Tunnel ``Record.record``.

Encode and decode one row, with the CRC-8 checks (cell and row) and the extension that carries
a stream record's ``SequenceInfo``. Pure bytes in, pure values out: no SDK, no I/O. The layout
(see docs/tablestore.md and the vendor SDKs' ``PlainBufferCodedInputStream``):

- header: little-endian u32 ``0x75``; every integer below is little-endian;
- row: ``0x01 {cell}* [0x02 {cell}*] [0x08] [0x0B u32 len  0x0C u32 len  0x0D i32 epoch
  0x0E i64 ts  0x0F i32 row_index] 0x09 crc``;
- cell: ``0x03 0x04 u32 len name [0x05 u32 len VT payload] [0x06 op] [0x07 i64 ts_ms] 0x0A crc``.

Checksums are CRC-8 (polynomial 0x07, initial 0). A cell's covers its name, its value (type
byte, then the payload: u32 length + bytes for STRING/BLOB, 8 bytes for INTEGER/DOUBLE, one byte
for BOOLEAN), its timestamp and then its op byte -- not the wire order. The row's covers each
cell's checksum in order and then one byte, 1 with a delete marker else 0; not the extension.

Who calls it: ``connector.tunnel.tablestore.records`` (executors, decoding ReadRecords pages)
and ``tablestore_emulator.tunnel_api`` (encoding them). Every malformed input -- truncated, a
wrong tag, a checksum mismatch, a bad length, trailing bytes -- raises ``PlainBufferError``; a
decode never returns a row it did not fully verify.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

HEADER = 0x75

TAG_ROW_PK = 0x01
TAG_ROW_DATA = 0x02
TAG_CELL = 0x03
TAG_CELL_NAME = 0x04
TAG_CELL_VALUE = 0x05
TAG_CELL_TYPE = 0x06
TAG_CELL_TIMESTAMP = 0x07
TAG_DELETE_ROW_MARKER = 0x08
TAG_ROW_CHECKSUM = 0x09
TAG_CELL_CHECKSUM = 0x0A
TAG_EXTENSION = 0x0B
TAG_SEQ_INFO = 0x0C
TAG_SEQ_INFO_EPOCH = 0x0D
TAG_SEQ_INFO_TS = 0x0E
TAG_SEQ_INFO_ROW_INDEX = 0x0F

VT_INTEGER = 0x0
VT_DOUBLE = 0x1
VT_BOOLEAN = 0x2
VT_STRING = 0x3
VT_BLOB = 0x7
VT_INF_MIN = 0x9
VT_INF_MAX = 0xA
VT_AUTO_INCREMENT = 0xB


class CellOp(enum.IntEnum):
    """What a cell does. ``PUT`` has no op byte on the wire."""

    PUT = 0
    DELETE_ALL_VERSION = 0x1
    DELETE_ONE_VERSION = 0x3
    INCREMENT = 0x4


_OPS = {op.value: op for op in CellOp if op is not CellOp.PUT}


class PlainBufferError(ValueError):
    """Bytes that are not one well-formed PlainBuffer row. ``offset`` is where reading failed."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} (at byte {offset})")
        self.reason = reason
        self.offset = offset


class Special(enum.Enum):
    """Primary-key placeholders that carry no value (range bounds, auto-increment)."""

    INF_MIN = VT_INF_MIN
    INF_MAX = VT_INF_MAX
    AUTO_INCREMENT = VT_AUTO_INCREMENT


@dataclass(frozen=True, slots=True)
class SequenceInfo:
    """Where a stream record sits in its channel: ordered by (epoch, timestamp, row_index)."""

    epoch: int
    timestamp: int
    row_index: int

    def sortable(self) -> str:
        """The Go SDK's string form ``%08x:%016x:%08x``: sorts like the tuple (all >= 0)."""
        return f"{self.epoch:08x}:{self.timestamp:016x}:{self.row_index:08x}"


@dataclass(frozen=True, slots=True)
class Cell:
    """One attribute cell: ``value`` is ``None`` for the delete ops."""

    name: str
    value: Any
    op: CellOp = CellOp.PUT
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Row:
    """One decoded row. ``primary_key`` keeps the wire order of the key columns."""

    primary_key: tuple[tuple[str, Any], ...]
    cells: tuple[Cell, ...] = ()
    delete_marker: bool = False
    sequence: SequenceInfo | None = None


# --- CRC-8 ---------------------------------------------------------------------------------


def _crc_table() -> bytes:
    table = bytearray(256)
    for i in range(256):
        c = i
        for _ in range(8):
            c = ((c << 1) ^ 0x07) & 0xFF if c & 0x80 else (c << 1) & 0xFF
        table[i] = c
    return bytes(table)


CRC8_TABLE = _crc_table()


def crc8(crc: int, data: bytes | bytearray | memoryview) -> int:
    """CRC-8 (polynomial 0x07) of ``data`` continuing from ``crc``."""
    table = CRC8_TABLE
    for byte in data:
        crc = table[crc ^ byte]
    return crc


# --- encoding --------------------------------------------------------------------------------

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


def _value_bytes(value: Any) -> bytes:
    """The value's type byte and payload, which is also exactly what its checksum covers."""
    if isinstance(value, Special):
        return bytes([value.value])
    if isinstance(value, bool):
        return bytes([VT_BOOLEAN, 1 if value else 0])
    if isinstance(value, int):
        return bytes([VT_INTEGER]) + _I64.pack(value)
    if isinstance(value, float):
        return bytes([VT_DOUBLE]) + _F64.pack(value)
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return bytes([VT_STRING]) + _U32.pack(len(raw)) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return bytes([VT_BLOB]) + _U32.pack(len(raw)) + raw
    raise TypeError(f"PlainBuffer cannot encode a {type(value).__name__}: {value!r}")


def _encode_cell(out: bytearray, name: str, value: Any, has_value: bool, op: CellOp,
                 ts_ms: int | None) -> int:
    raw_name = name.encode("utf-8")
    out += bytes([TAG_CELL, TAG_CELL_NAME]) + _U32.pack(len(raw_name)) + raw_name
    crc = crc8(0, raw_name)
    if has_value:
        vb = _value_bytes(value)
        out += bytes([TAG_CELL_VALUE]) + _U32.pack(len(vb)) + vb
        crc = crc8(crc, vb)
    if op is not CellOp.PUT:
        out += bytes([TAG_CELL_TYPE, op.value])
    if ts_ms is not None:
        out += bytes([TAG_CELL_TIMESTAMP]) + _I64.pack(ts_ms)
        crc = crc8(crc, _I64.pack(ts_ms))
    if op is not CellOp.PUT:
        crc = crc8(crc, bytes([op.value]))
    out += bytes([TAG_CELL_CHECKSUM, crc])
    return crc


def encode_row(row: Row, *, header: bool = True) -> bytes:
    """One row as PlainBuffer (header included unless ``header=False``). Cells with op PUT
    must carry a value; delete ops carry none (``Cell.value`` is ignored for them)."""
    out = bytearray(_U32.pack(HEADER) if header else b"")
    row_crc = 0
    out.append(TAG_ROW_PK)
    for name, value in row.primary_key:
        row_crc = crc8(row_crc, bytes([_encode_cell(out, name, value, True, CellOp.PUT, None)]))
    if row.cells:
        out.append(TAG_ROW_DATA)
        for cell in row.cells:
            has_value = cell.op in (CellOp.PUT, CellOp.INCREMENT)
            c = _encode_cell(out, cell.name, cell.value, has_value, cell.op, cell.timestamp_ms)
            row_crc = crc8(row_crc, bytes([c]))
    if row.delete_marker:
        out.append(TAG_DELETE_ROW_MARKER)
    row_crc = crc8(row_crc, b"\x01" if row.delete_marker else b"\x00")
    if row.sequence is not None:
        s = row.sequence
        seq = (bytes([TAG_SEQ_INFO_EPOCH]) + _I32.pack(s.epoch) + bytes([TAG_SEQ_INFO_TS])
               + _I64.pack(s.timestamp) + bytes([TAG_SEQ_INFO_ROW_INDEX]) + _I32.pack(s.row_index))
        inner = bytes([TAG_SEQ_INFO]) + _U32.pack(len(seq)) + seq
        out += bytes([TAG_EXTENSION]) + _U32.pack(len(inner)) + inner
    out += bytes([TAG_ROW_CHECKSUM, row_crc])
    return bytes(out)


# --- decoding ------------------------------------------------------------------------------


class _Reader:
    """A cursor over the bytes; every read checks the bounds."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.end = len(data)

    def fail(self, reason: str) -> PlainBufferError:
        return PlainBufferError(reason, self.pos)

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.end:
            raise self.fail(f"truncated: {what} needs {n} byte(s), {self.end - self.pos} left")

    def peek(self) -> int:
        return self.data[self.pos] if self.pos < self.end else -1

    def byte(self, what: str) -> int:
        self.need(1, what)
        b = self.data[self.pos]
        self.pos += 1
        return b

    def expect(self, tag: int, what: str) -> None:
        got = self.byte(what)
        if got != tag:
            self.pos -= 1
            raise self.fail(f"expected {what} tag 0x{tag:02x}, found 0x{got:02x}")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(v)

    def i32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _I32.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(v)

    def i64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _I64.unpack_from(self.data, self.pos)
        self.pos += 8
        return int(v)

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b


def _read_value(r: _Reader, name: str) -> tuple[Any, int]:
    """``0x05 u32 len VT payload`` -> (value, crc over VT+payload continuing from 0 handled by
    the caller). Returns the value and the raw bytes' span for the checksum."""
    r.expect(TAG_CELL_VALUE, "cell value")
    length = r.u32("value length")
    start = r.pos
    r.need(length, f"value of {name!r}")
    if length < 1:
        raise r.fail(f"value of {name!r} has length 0")
    vt = r.byte("value type")
    value: Any
    if vt == VT_INTEGER or vt == VT_DOUBLE:
        if length != 9:
            raise r.fail(f"value of {name!r}: an 8-byte type with length {length}")
        value = r.i64("integer") if vt == VT_INTEGER else _F64.unpack(r.take(8, "double"))[0]
    elif vt == VT_BOOLEAN:
        if length != 2:
            raise r.fail(f"value of {name!r}: a boolean with length {length}")
        b = r.byte("boolean")
        if b > 1:
            raise r.fail(f"value of {name!r}: boolean byte {b}")
        value = b == 1
    elif vt == VT_STRING or vt == VT_BLOB:
        n = r.u32("string length")
        if length != 5 + n:
            raise r.fail(f"value of {name!r}: inner length {n} does not match outer {length}")
        raw = r.take(n, "string bytes")
        if vt == VT_BLOB:
            value = raw
        else:
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise r.fail(f"value of {name!r}: STRING is not UTF-8") from None
    elif vt in (VT_INF_MIN, VT_INF_MAX, VT_AUTO_INCREMENT):
        if length != 1:
            raise r.fail(f"value of {name!r}: a placeholder with length {length}")
        value = Special(vt)
    else:
        raise r.fail(f"value of {name!r}: unknown value type 0x{vt:02x}")
    return value, start


def _read_cell(r: _Reader, in_pk: bool) -> tuple[Cell, int]:
    r.expect(TAG_CELL, "cell")
    r.expect(TAG_CELL_NAME, "cell name")
    n = r.u32("cell name length")
    raw_name = r.take(n, "cell name")
    try:
        name = raw_name.decode("utf-8")
    except UnicodeDecodeError:
        raise r.fail("cell name is not UTF-8") from None
    if not name:
        raise r.fail("empty cell name")
    crc = crc8(0, raw_name)
    value: Any = None
    has_value = False
    if r.peek() == TAG_CELL_VALUE:
        value, start = _read_value(r, name)
        crc = crc8(crc, memoryview(r.data)[start:r.pos])
        has_value = True
    op = CellOp.PUT
    if r.peek() == TAG_CELL_TYPE:
        r.pos += 1
        code = r.byte("cell op")
        if code not in _OPS:
            raise r.fail(f"cell {name!r}: unknown op 0x{code:02x}")
        op = _OPS[code]
    ts: int | None = None
    if r.peek() == TAG_CELL_TIMESTAMP:
        r.pos += 1
        ts = r.i64("cell timestamp")
        crc = crc8(crc, _I64.pack(ts))
        if ts < 0:
            raise r.fail(f"cell {name!r}: negative timestamp {ts}")
    if op is not CellOp.PUT:
        crc = crc8(crc, bytes([op.value]))
    r.expect(TAG_CELL_CHECKSUM, "cell checksum")
    stored = r.byte("cell checksum")
    if stored != crc:
        raise r.fail(f"cell {name!r}: checksum 0x{stored:02x} != computed 0x{crc:02x}")
    if in_pk:
        if not has_value or op is not CellOp.PUT or ts is not None:
            raise r.fail(f"primary-key cell {name!r} must have a value and nothing else")
    elif op is CellOp.PUT and not has_value:
        raise r.fail(f"cell {name!r}: a put without a value")
    elif op in (CellOp.DELETE_ALL_VERSION, CellOp.DELETE_ONE_VERSION) and has_value:
        raise r.fail(f"cell {name!r}: a delete with a value")
    elif op is CellOp.DELETE_ALL_VERSION and ts is not None:
        raise r.fail(f"cell {name!r}: DELETE_ALL_VERSION with a timestamp")
    if isinstance(value, Special) and not in_pk:
        raise r.fail(f"cell {name!r}: {value.name} is only valid in a primary key")
    return Cell(name, value, op, ts), crc


def _read_extension(r: _Reader) -> SequenceInfo | None:
    """``0x0B u32 len {0x0C u32 len seq-info}``; unknown inner tags are skipped by length."""
    r.expect(TAG_EXTENSION, "extension")
    length = r.u32("extension length")
    r.need(length, "extension")
    end = r.pos + length
    seq: SequenceInfo | None = None
    while r.pos < end:
        tag = r.byte("extension item")
        n = r.u32("extension item length")
        if r.pos + n > end:
            raise r.fail(f"extension item 0x{tag:02x} of {n} bytes overruns the extension")
        if tag != TAG_SEQ_INFO:
            r.pos += n  # an extension this reader does not know: skip it
            continue
        if n != 19:
            raise r.fail(f"sequence info of {n} bytes (expected 19)")
        r.expect(TAG_SEQ_INFO_EPOCH, "sequence epoch")
        epoch = r.i32("sequence epoch")
        r.expect(TAG_SEQ_INFO_TS, "sequence timestamp")
        ts = r.i64("sequence timestamp")
        r.expect(TAG_SEQ_INFO_ROW_INDEX, "sequence row index")
        idx = r.i32("sequence row index")
        if epoch < 0 or ts < 0 or idx < 0:
            raise r.fail(f"negative sequence info ({epoch}, {ts}, {idx})")
        seq = SequenceInfo(epoch, ts, idx)
    return seq


def decode_row(data: bytes, *, header: bool = True, allow_empty_pk: bool = False) -> Row:
    """Decode exactly one row (the whole of ``data``). ``PlainBufferError`` on anything
    malformed. ``allow_empty_pk`` accepts a row with no key cells (an ``origin_record``)."""
    if not isinstance(data, bytes):
        data = bytes(data)
    r = _Reader(data)
    if header:
        if r.u32("header") != HEADER:
            r.pos = 0
            raise r.fail("bad header (not PlainBuffer 0x75)")
    r.expect(TAG_ROW_PK, "row primary key")
    row_crc = 0
    pk: list[tuple[str, Any]] = []
    while r.peek() == TAG_CELL:
        cell, crc = _read_cell(r, in_pk=True)
        pk.append((cell.name, cell.value))
        row_crc = CRC8_TABLE[row_crc ^ crc]
    if not pk and not allow_empty_pk:
        raise r.fail("a row without primary-key columns")
    cells: list[Cell] = []
    if r.peek() == TAG_ROW_DATA:
        r.pos += 1
        while r.peek() == TAG_CELL:
            cell, crc = _read_cell(r, in_pk=False)
            cells.append(cell)
            row_crc = CRC8_TABLE[row_crc ^ crc]
    marker = r.peek() == TAG_DELETE_ROW_MARKER
    if marker:
        r.pos += 1
    row_crc = CRC8_TABLE[row_crc ^ (1 if marker else 0)]
    seq = _read_extension(r) if r.peek() == TAG_EXTENSION else None
    r.expect(TAG_ROW_CHECKSUM, "row checksum")
    stored = r.byte("row checksum")
    if stored != row_crc:
        raise r.fail(f"row checksum 0x{stored:02x} != computed 0x{row_crc:02x}")
    if r.pos != r.end:
        raise r.fail(f"{r.end - r.pos} byte(s) after the row")
    return Row(tuple(pk), tuple(cells), marker, seq)


def encode_values(primary_key: Sequence[tuple[str, Any]]) -> bytes:
    """A key-only row (used for base-data token positions)."""
    return encode_row(Row(tuple(primary_key)))


__all__ = [
    "CRC8_TABLE",
    "Cell",
    "CellOp",
    "PlainBufferError",
    "Row",
    "SequenceInfo",
    "Special",
    "crc8",
    "decode_row",
    "encode_row",
    "encode_values",
]
