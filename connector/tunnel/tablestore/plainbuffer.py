"""PlainBuffer: Tablestore's row encoding, as carried in a Tunnel ``Record.record``.

Encode and decode one row, with the CRC-8 checks (cell and row) and the extension that carries
a stream record's ``SequenceInfo``. Pure bytes in, pure values out: no SDK, no I/O. The layout
(see docs/tablestore.md and the vendor SDKs' ``PlainBufferCodedInputStream``):

- header: little-endian u32 ``0x75``; every integer below is little-endian;
- row: ``0x01 {cell}* [0x02 {cell}*] [0x08] [0x0B u32 len  0x0C u32 len  0x0D i32 epoch
  0x0E i64 ts  0x0F i32 row_index] 0x09 crc``;
- cell: ``0x03 0x04 u32 len name [0x05 u32 len VT payload] [0x06 op] [0x07 i64 ts_ms] 0x0A crc``;
  a cell timestamp is milliseconds since the epoch, 0 to ``MAX_CELL_TIMESTAMP_MS`` (9999).

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

#: the latest cell timestamp decoded: 9999-12-31T23:59:59.999Z in milliseconds (a later one
#: is no instant a timestamp column, Spark or Python can hold)
MAX_CELL_TIMESTAMP_MS = 253_402_300_799_999


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
    kind = type(value)
    if kind is int:
        return _VT_INT + _I64.pack(value)
    if kind is str:
        raw = value.encode("utf-8")
        return _VT_STR + _U32.pack(len(raw)) + raw
    if isinstance(value, Special):
        return bytes([value.value])
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, int):
        return _VT_INT + _I64.pack(value)
    if isinstance(value, float):
        return _VT_DBL + _F64.pack(value)
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return _VT_STR + _U32.pack(len(raw)) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return _VT_BLOB + _U32.pack(len(raw)) + raw
    raise TypeError(f"PlainBuffer cannot encode a {type(value).__name__}: {value!r}")


_VT_INT, _VT_DBL, _VT_STR, _VT_BLOB = (bytes([vt]) for vt in (VT_INTEGER, VT_DOUBLE, VT_STRING,
                                                                VT_BLOB))
_TRUE, _FALSE = bytes([VT_BOOLEAN, 1]), bytes([VT_BOOLEAN, 0])

#: cell name -> (``0x03 0x04 u32 len name``, CRC-8 of the name): the emulator encodes the same
#: few column names in every record (bounded: cleared when full)
_NAME_PREFIXES: dict[str, tuple[bytes, int]] = {}
_NAMES_MAX = 4096


def _encode_cell(out: bytearray, name: str, value: Any, has_value: bool, op: CellOp,
                 ts_ms: int | None) -> int:
    known = _NAME_PREFIXES.get(name)
    if known is None:
        raw_name = name.encode("utf-8")
        if len(_NAME_PREFIXES) >= _NAMES_MAX:
            _NAME_PREFIXES.clear()
        known = _NAME_PREFIXES[name] = (
            bytes([TAG_CELL, TAG_CELL_NAME]) + _U32.pack(len(raw_name)) + raw_name,
            crc8(0, raw_name))
    prefix, crc = known
    out += prefix
    table = CRC8_TABLE
    if has_value:
        vb = _value_bytes(value)
        out += _VALUE_TAG
        out += _U32.pack(len(vb))
        out += vb
        for byte in vb:
            crc = table[crc ^ byte]
    if op is not CellOp.PUT:
        out.append(TAG_CELL_TYPE)
        out.append(op.value)
    if ts_ms is not None:
        tb = _I64.pack(ts_ms)
        out.append(TAG_CELL_TIMESTAMP)
        out += tb
        for byte in tb:
            crc = table[crc ^ byte]
    if op is not CellOp.PUT:
        crc = table[crc ^ op.value]
    out.append(TAG_CELL_CHECKSUM)
    out.append(crc)
    return crc


_VALUE_TAG = bytes([TAG_CELL_VALUE])


def encode_row(row: Row, *, header: bool = True) -> bytes:
    """One row as PlainBuffer (header included unless ``header=False``). Cells with op PUT
    must carry a value; delete ops carry none (``Cell.value`` is ignored for them)."""
    out = bytearray(_U32.pack(HEADER) if header else b"")
    row_crc = 0
    out.append(TAG_ROW_PK)
    table = CRC8_TABLE
    for name, value in row.primary_key:
        row_crc = table[row_crc ^ _encode_cell(out, name, value, True, CellOp.PUT, None)]
    if row.cells:
        out.append(TAG_ROW_DATA)
        for cell in row.cells:
            op = cell.op
            has_value = op is CellOp.PUT or op is CellOp.INCREMENT
            c = _encode_cell(out, cell.name, cell.value, has_value, op, cell.timestamp_ms)
            row_crc = table[row_crc ^ c]
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


# One flat function per level with local variables: this is the executor's hot path (a
# method call per byte read costs more than the reading). Every read is bounds-checked:
# ``struct`` raises on a short buffer, indexing raises IndexError, and every slice is checked
# against ``end`` before it is taken; ``decode_row`` turns all of them into PlainBufferError.

_U32_AT = _U32.unpack_from
_I32_AT = _I32.unpack_from
_I64_AT = _I64.unpack_from
_F64_AT = _F64.unpack_from
_DEL_ALL = int(CellOp.DELETE_ALL_VERSION)
_DEL_ONE = int(CellOp.DELETE_ONE_VERSION)
_SPECIALS = {VT_INF_MIN: Special.INF_MIN, VT_INF_MAX: Special.INF_MAX,
             VT_AUTO_INCREMENT: Special.AUTO_INCREMENT}


def _tag_error(data: bytes, pos: int, tag: int, what: str) -> PlainBufferError:
    if pos >= len(data):
        return PlainBufferError(f"truncated: expected {what} tag 0x{tag:02x}", pos)
    return PlainBufferError(f"expected {what} tag 0x{tag:02x}, found 0x{data[pos]:02x}", pos)


def _read_value(data: bytes, pos: int, end: int, name: str) -> tuple[Any, int]:
    """At ``pos``: ``0x05 u32 len VT payload``. Returns (value, position after it); the
    checksum covers ``data[pos + 5:returned position]``."""
    (length,) = _U32_AT(data, pos + 1)
    start = pos + 5
    stop = start + length
    if length < 1:
        raise PlainBufferError(f"value of {name!r} has length 0", pos)
    if stop > end:
        raise PlainBufferError(f"truncated: value of {name!r} needs {length} byte(s)", start)
    vt = data[start]
    value: Any
    if vt == VT_INTEGER or vt == VT_DOUBLE:
        if length != 9:
            raise PlainBufferError(f"value of {name!r}: an 8-byte type with length {length}",
                                   start)
        value = (_I64_AT if vt == VT_INTEGER else _F64_AT)(data, start + 1)[0]
    elif vt == VT_STRING or vt == VT_BLOB:
        (n,) = _U32_AT(data, start + 1)
        if length != 5 + n:
            raise PlainBufferError(
                f"value of {name!r}: inner length {n} does not match outer {length}", start)
        raw = data[start + 5:stop]
        if vt == VT_BLOB:
            value = raw
        else:
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise PlainBufferError(f"value of {name!r}: STRING is not UTF-8", start) from None
    elif vt == VT_BOOLEAN:
        if length != 2:
            raise PlainBufferError(f"value of {name!r}: a boolean with length {length}", start)
        b = data[start + 1]
        if b > 1:
            raise PlainBufferError(f"value of {name!r}: boolean byte {b}", start + 1)
        value = b == 1
    elif vt in _SPECIALS:
        if length != 1:
            raise PlainBufferError(f"value of {name!r}: a placeholder with length {length}",
                                   start)
        value = _SPECIALS[vt]
    else:
        raise PlainBufferError(f"value of {name!r}: unknown value type 0x{vt:02x}", start)
    return value, stop


#: raw cell name -> (name, CRC-8 of the name): a page repeats the same few column names in
#: every record, so each is decoded and checksummed once per process (bounded: cleared when full)
_NAMES: dict[bytes, tuple[str, int]] = {}

#: a cell as ``_read_cell`` returns it: (name, value, op code (0 = put), timestamp in ms or None)
RawCell = tuple[str, Any, int, int | None]
#: a row as ``decode_raw`` returns it: (key as (name, value) pairs in wire order, attribute
#: cells, delete marker, sequence info as (epoch, timestamp, row index) or None)
RawRow = tuple[list[tuple[str, Any]], list[RawCell], bool, tuple[int, int, int] | None]


def _read_cell(data: bytes, pos: int, end: int, in_pk: bool) -> tuple[RawCell, int, int]:
    """At ``pos``: one cell (its TAG_CELL included). Returns (the cell as a plain tuple, its
    checksum, position after it)."""
    table = CRC8_TABLE
    if data[pos + 1] != TAG_CELL_NAME:
        raise _tag_error(data, pos + 1, TAG_CELL_NAME, "cell name")
    (n,) = _U32_AT(data, pos + 2)
    pos += 6
    if pos + n > end:
        raise PlainBufferError(f"truncated: cell name needs {n} byte(s)", pos)
    raw_name = data[pos:pos + n]
    pos += n
    known = _NAMES.get(raw_name)
    if known is None:
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise PlainBufferError("cell name is not UTF-8", pos - n) from None
        if not name:
            raise PlainBufferError("empty cell name", pos)
        name_crc = 0
        for byte in raw_name:
            name_crc = table[name_crc ^ byte]
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        _NAMES[raw_name] = known = (name, name_crc)
    name, crc = known
    value: Any = None
    has_value = False
    if pos < end and data[pos] == TAG_CELL_VALUE:
        value, stop = _read_value(data, pos, end, name)
        for byte in data[pos + 5:stop]:
            crc = table[crc ^ byte]
        pos = stop
        has_value = True
    op = 0
    if pos < end and data[pos] == TAG_CELL_TYPE:
        op = data[pos + 1]
        if op not in _OPS:
            raise PlainBufferError(f"cell {name!r}: unknown op 0x{op:02x}", pos + 1)
        pos += 2
    ts: int | None = None
    if pos < end and data[pos] == TAG_CELL_TIMESTAMP:
        (ts,) = _I64_AT(data, pos + 1)
        for byte in data[pos + 1:pos + 9]:
            crc = table[crc ^ byte]
        if ts < 0:
            raise PlainBufferError(f"cell {name!r}: negative timestamp {ts}", pos + 1)
        if ts > MAX_CELL_TIMESTAMP_MS:
            raise PlainBufferError(f"cell {name!r}: timestamp {ts} ms is after the year 9999",
                                   pos + 1)
        pos += 9
    if op:
        crc = table[crc ^ op]
    if data[pos] != TAG_CELL_CHECKSUM:
        raise _tag_error(data, pos, TAG_CELL_CHECKSUM, "cell checksum")
    stored = data[pos + 1]
    if stored != crc:
        raise PlainBufferError(f"cell {name!r}: checksum 0x{stored:02x} != computed 0x{crc:02x}",
                               pos + 1)
    pos += 2
    if in_pk:
        if not has_value or op or ts is not None:
            raise PlainBufferError(
                f"primary-key cell {name!r} must have a value and nothing else", pos)
    elif not op and not has_value:
        raise PlainBufferError(f"cell {name!r}: a put without a value", pos)
    elif (op == _DEL_ALL or op == _DEL_ONE) and has_value:
        raise PlainBufferError(f"cell {name!r}: a delete with a value", pos)
    elif op == _DEL_ALL and ts is not None:
        raise PlainBufferError(f"cell {name!r}: DELETE_ALL_VERSION with a timestamp", pos)
    if not in_pk and isinstance(value, Special):
        raise PlainBufferError(f"cell {name!r}: {value.name} is only valid in a primary key", pos)
    return (name, value, op, ts), crc, pos


def _read_extension(data: bytes, pos: int, end: int) -> tuple[tuple[int, int, int] | None,
                                                               int]:
    """At ``pos``: ``0x0B u32 len {0x0C u32 len seq-info}``; unknown inner items are skipped
    by their length."""
    (length,) = _U32_AT(data, pos + 1)
    pos += 5
    stop = pos + length
    if stop > end:
        raise PlainBufferError(f"truncated: extension needs {length} byte(s)", pos)
    seq: tuple[int, int, int] | None = None
    while pos < stop:
        tag = data[pos]
        (n,) = _U32_AT(data, pos + 1)
        pos += 5
        if pos + n > stop:
            raise PlainBufferError(
                f"extension item 0x{tag:02x} of {n} bytes overruns the extension", pos)
        if tag != TAG_SEQ_INFO:
            pos += n  # an extension this reader does not know: skip it
            continue
        if n != 19:
            raise PlainBufferError(f"sequence info of {n} bytes (expected 19)", pos)
        if data[pos] != TAG_SEQ_INFO_EPOCH:
            raise _tag_error(data, pos, TAG_SEQ_INFO_EPOCH, "sequence epoch")
        if data[pos + 5] != TAG_SEQ_INFO_TS:
            raise _tag_error(data, pos + 5, TAG_SEQ_INFO_TS, "sequence timestamp")
        if data[pos + 14] != TAG_SEQ_INFO_ROW_INDEX:
            raise _tag_error(data, pos + 14, TAG_SEQ_INFO_ROW_INDEX, "sequence row index")
        (epoch,) = _I32_AT(data, pos + 1)
        (ts,) = _I64_AT(data, pos + 6)
        (idx,) = _I32_AT(data, pos + 15)
        if epoch < 0 or ts < 0 or idx < 0:
            raise PlainBufferError(f"negative sequence info ({epoch}, {ts}, {idx})", pos)
        seq = (epoch, ts, idx)
        pos += n
    return seq, pos


def _decode(data: bytes, header: bool, allow_empty_pk: bool) -> RawRow:
    end = len(data)
    pos = 0
    table = CRC8_TABLE
    if header:
        if _U32_AT(data, 0)[0] != HEADER:
            raise PlainBufferError("bad header (not PlainBuffer 0x75)", 0)
        pos = 4
    if data[pos] != TAG_ROW_PK:
        raise _tag_error(data, pos, TAG_ROW_PK, "row primary key")
    pos += 1
    row_crc = 0
    pk: list[tuple[str, Any]] = []
    while pos < end and data[pos] == TAG_CELL:
        cell, crc, pos = _read_cell(data, pos, end, True)
        pk.append((cell[0], cell[1]))
        row_crc = table[row_crc ^ crc]
    if not pk and not allow_empty_pk:
        raise PlainBufferError("a row without primary-key columns", pos)
    cells: list[RawCell] = []
    if pos < end and data[pos] == TAG_ROW_DATA:
        pos += 1
        while pos < end and data[pos] == TAG_CELL:
            cell, crc, pos = _read_cell(data, pos, end, False)
            cells.append(cell)
            row_crc = table[row_crc ^ crc]
    marker = pos < end and data[pos] == TAG_DELETE_ROW_MARKER
    if marker:
        pos += 1
    row_crc = table[row_crc ^ (1 if marker else 0)]
    seq: tuple[int, int, int] | None = None
    if pos < end and data[pos] == TAG_EXTENSION:
        seq, pos = _read_extension(data, pos, end)
    if data[pos] != TAG_ROW_CHECKSUM:
        raise _tag_error(data, pos, TAG_ROW_CHECKSUM, "row checksum")
    stored = data[pos + 1]
    if stored != row_crc:
        raise PlainBufferError(f"row checksum 0x{stored:02x} != computed 0x{row_crc:02x}",
                               pos + 1)
    pos += 2
    if pos != end:
        raise PlainBufferError(f"{end - pos} byte(s) after the row", pos)
    return pk, cells, marker, seq


def decode_raw(data: bytes, *, header: bool = True, allow_empty_pk: bool = False) -> RawRow:
    """``decode_row`` without the dataclasses: plain tuples and lists (``RawRow``), the same
    checks and errors. The executor's page decoder (``records``) calls this."""
    if not isinstance(data, bytes):
        data = bytes(data)
    try:
        return _decode(data, header, allow_empty_pk)
    except (IndexError, struct.error):
        raise PlainBufferError("truncated: the row ends before its checksum", len(data)) from None


def decode_value(data: bytes, name: str = "value") -> Any:
    """A bare value, its type byte then its payload (a condition's ``column_value``), read as
    a cell's value is; ``PlainBufferError`` when it is malformed or cut short."""
    cell = bytes([TAG_CELL_VALUE]) + struct.pack("<I", len(data)) + data
    try:
        return _read_value(cell, 0, len(cell), name)[0]
    except (IndexError, struct.error):
        raise PlainBufferError(f"truncated: {name}", len(data)) from None


def decode_row(data: bytes, *, header: bool = True, allow_empty_pk: bool = False) -> Row:
    """Decode exactly one row (the whole of ``data``). ``PlainBufferError`` on anything
    malformed. ``allow_empty_pk`` accepts a row with no key cells (an ``origin_record``)."""
    pk, cells, marker, seq = decode_raw(data, header=header, allow_empty_pk=allow_empty_pk)
    return Row(tuple(pk),
               tuple(Cell(name, value, _OPS[op] if op else CellOp.PUT, ts)
                     for name, value, op, ts in cells),
               marker, None if seq is None else SequenceInfo(*seq))


__all__ = [
    "CRC8_TABLE",
    "MAX_CELL_TIMESTAMP_MS",
    "Cell",
    "CellOp",
    "PlainBufferError",
    "RawCell",
    "RawRow",
    "Row",
    "SequenceInfo",
    "Special",
    "crc8",
    "decode_raw",
    "decode_row",
    "encode_row",
]
