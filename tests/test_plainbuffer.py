"""The PlainBuffer codec on bytes alone (connector/tunnel/tablestore/plainbuffer.py).

- Round trips of every value type, cell op, delete marker and sequence info.
- Byte-for-byte agreement with the official ``tablestore`` SDK's own PlainBuffer writer, and the
  SDK's reader accepting what this encoder writes (rows without the extension, which the SDK's
  reader does not know).
- Every truncation of a valid row, and every single-bit flip in it, is refused with
  ``PlainBufferError`` -- or decodes to exactly the original row (a flip the format cannot see,
  e.g. inside a skipped unknown extension); never a different row.
"""

from __future__ import annotations

import random
import struct

import pytest

from connector.tunnel.tablestore.plainbuffer import (
    CRC8_TABLE,
    Cell,
    CellOp,
    PlainBufferError,
    Row,
    SequenceInfo,
    Special,
    crc8,
    decode_row,
    decode_value,
    encode_row,
)

pytest.importorskip("tablestore")

from tablestore.plainbuffer.plain_buffer_builder import PlainBufferBuilder  # noqa: E402
from tablestore.plainbuffer.plain_buffer_coded_stream import (  # noqa: E402
    PlainBufferCodedInputStream,
)
from tablestore.plainbuffer.plain_buffer_crc8 import PlainBufferCrc8  # noqa: E402
from tablestore.plainbuffer.plain_buffer_stream import PlainBufferInputStream  # noqa: E402

PK = (("id", "k1"), ("n", -5), ("b", b"\x00\xff"))
FULL = Row(
    PK,
    (
        Cell("i", 2**63 - 1, CellOp.PUT, 1_700_000_000_000),
        Cell("d", -2.5, CellOp.PUT, 1),
        Cell("t", True, CellOp.PUT, 2),
        Cell("f", False, CellOp.PUT, 3),
        Cell("s", "héllo ✓", CellOp.PUT, 4),
        Cell("e", "", CellOp.PUT, 5),
        Cell("x", b"\x01\x02", CellOp.PUT, 6),
        Cell("gone", None, CellOp.DELETE_ALL_VERSION),
        Cell("old", None, CellOp.DELETE_ONE_VERSION, 7),
    ),
    False,
    SequenceInfo(0, 1_700_000_000_123_456, 42),
)


def test_crc8_matches_the_sdk() -> None:
    data = bytes(range(256)) * 3
    assert crc8(0, data) == PlainBufferCrc8.crc_bytes(0, data)
    assert CRC8_TABLE[1] == 0x07


@pytest.mark.parametrize(
    "row",
    [
        FULL,
        Row(PK),
        Row((("id", 1),), (), True, SequenceInfo(3, 9, 1)),
        Row((("id", Special.INF_MIN), ("k", Special.INF_MAX))),
        Row((("id", "x"),), (Cell("v", 1, CellOp.PUT, None),)),
    ],
)
def test_round_trip(row: Row) -> None:
    assert decode_row(encode_row(row)) == row


def test_origin_record_with_empty_key_section() -> None:
    before = Row((), (Cell("v", 3, CellOp.PUT, 10),))
    data = encode_row(before)
    assert data[4] == 0x01  # a leading ROW_PK tag, as the Go SDK requires
    assert decode_row(data, allow_empty_pk=True) == before
    with pytest.raises(PlainBufferError, match="without primary-key"):
        decode_row(data)


def test_identical_bytes_to_the_sdk_writer() -> None:
    pk = [("id", "k1"), ("n", 5)]
    cols = [("a", 1, 1000), ("b", "héllo", 1001), ("c", 2.5, 1002), ("d", True, 1003),
            ("e", bytearray(b"\x00\xff"), 1004)]
    sdk = bytes(PlainBufferBuilder.serialize_for_put_row(pk, cols))
    ours = encode_row(Row(tuple(pk), tuple(
        Cell(n, bytes(v) if isinstance(v, bytearray) else v, CellOp.PUT, ts)
        for n, v, ts in cols)))
    assert ours == sdk
    update = bytes(PlainBufferBuilder.serialize_for_update_row(
        pk, {"PUT": [("a", 3)], "DELETE": [("b", None, 1001)], "DELETE_ALL": ["c"]}))
    assert decode_row(update).cells == (
        Cell("a", 3, CellOp.PUT, None),
        Cell("b", None, CellOp.DELETE_ONE_VERSION, 1001),
        Cell("c", None, CellOp.DELETE_ALL_VERSION, None),
    )


def test_sdk_reader_accepts_our_rows() -> None:
    row = Row(PK[:2], (Cell("a", 1, CellOp.PUT, 5), Cell("s", "x", CellOp.PUT, 6)))
    pk, attrs = PlainBufferCodedInputStream(PlainBufferInputStream(encode_row(row))).read_row()
    assert pk == [("id", "k1"), ("n", -5)]
    assert attrs == [("a", 1, 5), ("s", "x", 6)]


def test_sequence_info_sorts_like_the_tuple() -> None:
    infos = [SequenceInfo(e, t, i)
             for e in (0, 1) for t in (0, 5, 2**40) for i in (0, 7, 2**31 - 1)]
    assert sorted(infos, key=lambda s: s.sortable()) == sorted(
        infos, key=lambda s: (s.epoch, s.timestamp, s.row_index))
    assert SequenceInfo(1, 2, 3).sortable() == "00000001:0000000000000002:00000003"


def test_every_truncation_is_refused() -> None:
    data = encode_row(FULL)
    for n in range(len(data)):
        with pytest.raises(PlainBufferError):
            decode_row(data[:n])


def test_a_bare_value_reads_as_a_cell_s_and_a_cut_one_is_refused() -> None:
    """``decode_value``: a condition's ``column_value`` (type byte + payload, no cell tag)."""
    integer = b"\x00" + struct.pack("<q", -7)
    text = b"\x03" + struct.pack("<I", 2) + "é".encode()
    assert decode_value(integer) == -7 and decode_value(text) == "é"
    for cut in (b"", integer[:5], text[:4], text[:-1]):
        with pytest.raises(PlainBufferError, match="column_value"):
            decode_value(cut, "column_value")


def test_bit_flips_are_refused_or_harmless() -> None:
    data = encode_row(FULL)
    rng = random.Random(7)
    refused = 0
    positions = list(range(len(data)))
    for pos in positions:
        for bit in rng.sample(range(8), 3):
            bad = bytearray(data)
            bad[pos] ^= 1 << bit
            try:
                got = decode_row(bytes(bad))
            except PlainBufferError:
                refused += 1
                continue
            # The extension is outside every checksum: a flip there may change the sequence
            # info, which is all it can change. Anything else must be refused.
            assert got.primary_key == FULL.primary_key and got.cells == FULL.cells, pos
            assert got.delete_marker == FULL.delete_marker
    assert refused > 0.8 * 3 * len(positions)


def test_specific_corruptions_have_clear_reasons() -> None:
    data = encode_row(Row((("id", "a"),), (Cell("v", 1, CellOp.PUT, 1),)))
    with pytest.raises(PlainBufferError, match="header"):
        decode_row(b"\x76\x00\x00\x00" + data[4:])
    with pytest.raises(PlainBufferError, match="after the row"):
        decode_row(data + b"\x00")
    with pytest.raises(PlainBufferError, match="row checksum"):
        decode_row(data[:-1] + bytes([data[-1] ^ 0xFF]))
    # an INTEGER whose declared length is wrong
    bad = data.replace(b"\x05\x09\x00\x00\x00\x00", b"\x05\x0a\x00\x00\x00\x00")
    with pytest.raises(PlainBufferError):
        decode_row(bad)
    # a STRING whose inner length overruns
    s = encode_row(Row((("id", "abc"),)))
    with pytest.raises(PlainBufferError):
        decode_row(s.replace(struct.pack("<I", 3) + b"abc", struct.pack("<I", 9) + b"abc"))


def test_unknown_extension_items_are_skipped() -> None:
    row = Row((("id", "a"),), (), False, SequenceInfo(0, 1, 2))
    data = encode_row(row)
    ext_at = data.index(bytes([0x0B]) + struct.pack("<I", 24))
    extra = bytes([0x10]) + struct.pack("<I", 2) + b"zz"
    patched = (data[:ext_at] + bytes([0x0B]) + struct.pack("<I", 24 + len(extra)) + extra
               + data[ext_at + 5:])
    assert decode_row(patched) == row


def _row_with_cell(cell_body: bytes, cell_crc: int) -> bytes:
    """A row ``id="a"`` whose one attribute cell is ``cell_body`` (name etc.), checksums right."""
    key = encode_row(Row((("id", "a"),)))[4:-2]  # ROW_PK and the key cell
    key_crc = key[-1]
    row_crc = crc8(crc8(0, bytes([key_crc, cell_crc])), b"\x00")
    return (struct.pack("<I", 0x75) + key + b"\x02\x03" + cell_body
            + bytes([0x0A, cell_crc, 0x09, row_crc]))


def test_invalid_cell_shapes_with_valid_checksums() -> None:
    name = b"\x04" + struct.pack("<I", 1) + b"v"
    with pytest.raises(PlainBufferError, match="a put without a value"):
        decode_row(_row_with_cell(name, crc8(0, b"v")))
    value = b"\x05" + struct.pack("<I", 9) + b"\x00" + struct.pack("<q", 1)
    vcrc = crc8(crc8(0, b"v"), b"\x00" + struct.pack("<q", 1))
    with pytest.raises(PlainBufferError, match="a delete with a value"):
        decode_row(_row_with_cell(name + value + b"\x06\x01", crc8(vcrc, b"\x01")))
    with pytest.raises(PlainBufferError, match="unknown op"):
        decode_row(_row_with_cell(name + b"\x06\x09", crc8(crc8(0, b"v"), b"\x09")))
    ok = _row_with_cell(name + value, vcrc)
    assert decode_row(ok).cells == (Cell("v", 1, CellOp.PUT, None),)
    with pytest.raises(TypeError):
        encode_row(Row((("id", object()),)))
