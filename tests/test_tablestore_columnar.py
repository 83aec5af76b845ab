"""The wire client's columnar read path: PlainBuffer decoded straight into the page batch.

``records.decode_columns`` (what ``TablestoreTunnelService.read_page`` returns) must give
exactly the batch the default adapter builds, ``records_to_page(decode_page(...))``: schema,
values, nulls and the ``_before`` / ``_extra`` JSON text. Checked here on hand-built wire
records (every value type, UPDATE with both delete-cell ops, with and without a before-image,
DELETE, base-data records, attributes the layout does not declare), over HTTP against the
emulator, and for corrupted bytes (the typed error names channel and token). Every test runs
with each decoder: the compiled one (``columnar``, no hand-over to the Python path allowed on
these pages) and the pure-Python fallback (tests/test_decoders.py compares the two directly).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from connector.errors import MalformedRecordError
from connector.local import LocalTablestore
from connector.tunnel import open_tunnel_service
from connector.tunnel.base import FINISHED, ChannelStatus, TunnelService, TunnelType
from connector.tunnel.page import PageLayout, records_to_page
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore import records as records_module
from connector.tunnel.tablestore.columnar import compiled_available, decode_compiled
from connector.tunnel.tablestore.plainbuffer import Cell, CellOp, Row, SequenceInfo, encode_row
from connector.tunnel.tablestore.records import decode_columns, decode_page
from tablestore_emulator.server import EmulatorServer
from testkit.emulator import INSTANCE, KEY_ID, SECRET, service_uri
from testkit.page_decoders import compiled_required

TS_US = 1_750_000_000_000_000
TS_MS = TS_US // 1000


def _wire(action: int, pk: tuple[tuple[str, Any], ...], cells: tuple[Cell, ...] = (),
          before: dict[str, Any] | None = None, index: int | None = 0,
          delete_marker: bool = False) -> Any:
    seq = None if index is None else SequenceInfo(0, TS_US + index, index)
    out = m.Record(action_type=action, record=encode_row(Row(pk, cells, delete_marker, seq)))
    if before is not None:
        out.origin_record = encode_row(Row((), tuple(Cell(k, v, CellOp.PUT, TS_MS)
                                                     for k, v in before.items())))
    return out


def put(*cells: Cell) -> tuple[Cell, ...]:
    return cells


KEY = (("pk_s", "ké"), ("pk_i", -7), ("pk_b", b"\x00\xff"))
ALL_TYPES = put(Cell("i", 2**62, CellOp.PUT, TS_MS), Cell("d", -1.5e300),
                Cell("b", True, CellOp.PUT, TS_MS), Cell("s", "snow ☃ \"q\" \\"),
                Cell("x", b"\x01\x02\xfe"), Cell("zero", 0), Cell("f", False),
                Cell("empty", ""))
BEFORE = {"i": 1, "d": 0.25, "b": False, "s": "old", "x": b"\xaa", "gone": "g", "f": True}

STREAM = [
    _wire(m.ACTION_PUT_ROW, KEY, ALL_TYPES, index=1),
    _wire(m.ACTION_PUT_ROW, KEY, ALL_TYPES, before=BEFORE, index=2),
    # UPDATE with a before-image: deleted cells (both delete ops) drop out of the after image
    _wire(m.ACTION_UPDATE_ROW, KEY,
          put(Cell("i", 5, CellOp.PUT, TS_MS), Cell("s", None, CellOp.DELETE_ALL_VERSION),
              Cell("x", None, CellOp.DELETE_ONE_VERSION, TS_MS),
              Cell("undeclared", "u", CellOp.PUT, TS_MS),
              Cell("gone", None, CellOp.DELETE_ALL_VERSION)),
          before=BEFORE, index=3),
    # UPDATE without a before-image: deleted cells are nulls (and in _extra when undeclared)
    _wire(m.ACTION_UPDATE_ROW, KEY,
          put(Cell("d", 3.0), Cell("b", None, CellOp.DELETE_ALL_VERSION),
              Cell("gone", None, CellOp.DELETE_ONE_VERSION, TS_MS),
              Cell("blob_extra", b"\x10")),
          index=4),
    # UPDATE whose before-image is empty (the row did not exist)
    _wire(m.ACTION_UPDATE_ROW, KEY, put(Cell("i", 9)), before={}, index=5),
    _wire(m.ACTION_DELETE_ROW, KEY, before=BEFORE, index=6, delete_marker=True),
    _wire(m.ACTION_DELETE_ROW, KEY, index=7),
    _wire(m.ACTION_PUT_ROW, (("pk_s", "a"), ("pk_i", 0), ("pk_b", b"")), index=8),
]
BASE = [
    _wire(m.ACTION_PUT_ROW, (("pk_s", "a"), ("pk_i", 1), ("pk_b", b"z")), ALL_TYPES, index=None),
    _wire(m.ACTION_PUT_ROW, (("pk_s", "b"), ("pk_i", 2), ("pk_b", b"y")),
          put(Cell("i", 3, CellOp.PUT, TS_MS + 5), Cell("other", "o")), index=None),
    _wire(m.ACTION_PUT_ROW, (("pk_s", "c"), ("pk_i", 3), ("pk_b", b"x")), index=None),
]

KEY_COLUMNS = (("pk_s", pa.string()), ("pk_i", pa.int64()), ("pk_b", pa.binary()))
LAYOUTS = {
    "every column": PageLayout(KEY_COLUMNS + (
        ("i", pa.int64()), ("d", pa.float64()), ("b", pa.bool_()), ("s", pa.string()),
        ("x", pa.binary()), ("zero", pa.int64()), ("f", pa.bool_()), ("empty", pa.string()),
        ("undeclared", pa.string()), ("gone", pa.string()), ("blob_extra", pa.binary()),
        ("other", pa.string()))),
    "declared only (the rest in _extra)": PageLayout(KEY_COLUMNS + (
        ("i", pa.int64()), ("s", pa.string()), ("x", pa.binary()))),
    "key only, reordered, a column no record has": PageLayout(
        (("missing", pa.float64()), ("pk_b", pa.binary()), ("pk_i", pa.int64()),
         ("pk_s", pa.string()))),
}


def _compiled_only(*args: Any) -> pa.RecordBatch:
    batch = decode_compiled(*args)
    assert batch is not None, "the compiled decoder handed a well-typed page to the Python path"
    return batch


@pytest.fixture(autouse=True, params=["compiled", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which decoder ``decode_columns`` (and so the client's ``read_page``) uses."""
    if request.param == "compiled":
        if not compiled_available():
            if compiled_required():
                pytest.fail("the compiled PlainBuffer decoder is required but not built")
            pytest.skip("the compiled PlainBuffer decoder is not built")
        monkeypatch.setattr(records_module, "decode_compiled", _compiled_only)
    else:
        monkeypatch.setattr(records_module, "decode_compiled", lambda *args: None)
    return str(request.param)


def _same(records: list[Any], base_offset: int | None, layout: PageLayout) -> pa.RecordBatch:
    got = decode_columns(records, "ch-1", "tok-1", base_offset, layout)
    expected = records_to_page(decode_page(records, "ch-1", "tok-1", base_offset), layout)
    assert got.schema == expected.schema
    assert got.to_pylist() == expected.to_pylist()
    assert got.equals(expected)
    return got


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=list(LAYOUTS))
@pytest.mark.parametrize("base_offset", [None, 41])
def test_columns_equal_the_default_conversion(layout: PageLayout,
                                              base_offset: int | None) -> None:
    stream = _same(STREAM, base_offset, layout)
    assert stream.num_rows == len(STREAM)
    base = _same(BASE, base_offset, layout)
    assert base.column("_sequence").to_pylist() == sorted(base.column("_sequence").to_pylist())
    assert _same([], base_offset, layout).num_rows == 0


def test_what_the_columns_hold() -> None:
    """Spot checks that the shared semantics are the intended ones (not only equal)."""
    rows = _same(STREAM, None, LAYOUTS["declared only (the rest in _extra)"]).to_pylist()
    assert [r["_op"] for r in rows] == ["PUT", "PUT", "UPDATE", "UPDATE", "UPDATE", "DELETE",
                                        "DELETE", "PUT"]
    assert rows[0]["i"] == 2**62 and rows[0]["x"] == b"\x01\x02\xfe"
    assert rows[0]["_before"] is None
    update = rows[2]  # with before-image: merged, deleted cells gone
    assert (update["i"], update["s"], update["x"]) == (5, None, None)
    assert update["_extra"] == ('{"b":false,"d":0.25,"f":true,"undeclared":"u"}')
    assert update["_before"] == ('{"b":false,"d":0.25,"f":true,"gone":"g","i":1,"s":"old",'
                                 '"x":{"$binary":"qg=="}}')
    assert rows[3]["_extra"] == '{"b":null,"blob_extra":{"$binary":"EA=="},"d":3.0,"gone":null}'
    assert rows[5]["i"] is None and rows[5]["_extra"] is None and rows[5]["pk_s"] == "ké"
    assert rows[0]["_commit_ts"].timestamp() * 1_000_000 == pytest.approx(TS_US + 1)


@pytest.mark.parametrize("cut", [1, 7, 20, 33])
def test_corrupted_bytes_are_a_typed_error_naming_channel_and_token(cut: int) -> None:
    layout = LAYOUTS["every column"]
    for damage in ("truncate", "flip"):
        broken = m.Record()
        broken.CopyFrom(STREAM[2])
        data = bytearray(broken.record)
        if damage == "truncate":
            data = data[:-cut]
        else:
            data[cut] ^= 0x40
        broken.record = bytes(data)
        with pytest.raises(MalformedRecordError) as err:
            decode_columns([STREAM[0], broken], "ch-9", "tok-9", None, layout)
        assert err.value.fields["channel_id"] == "ch-9"
        assert err.value.fields["token"] == "tok-9"
        assert "record #1" in str(err.value)
    origin = m.Record()
    origin.CopyFrom(STREAM[1])
    origin.origin_record = origin.origin_record[:-cut]
    with pytest.raises(MalformedRecordError):
        decode_columns([origin], "ch-9", "tok-9", None, layout)


def test_read_page_over_http_equals_the_default_adapter(tmp_path: Path) -> None:
    """Against the emulator: PUT, UPDATE (a column deleted), DELETE, base data; pages cut at 4
    records; the client's ``read_page`` against ``TunnelService.read_page`` (the default)."""
    path = tmp_path / "store.db"
    writer = LocalTablestore(path)
    writer.create_table("t", [("id", "STRING"), ("n", "INTEGER")],
                        [("v", "INTEGER"), ("s", "STRING"), ("d", "DOUBLE"), ("b", "BOOLEAN"),
                         ("x", "BINARY")], channels=1)
    for i in range(6):
        writer.put_row("t", {"id": f"k{i}", "n": i},
                       {"v": i, "s": f"s{i}", "d": i / 3, "b": i % 2 == 0, "x": bytes([i]),
                        "loose": f"undeclared {i}"})
    emulator = EmulatorServer(str(path), INSTANCE, KEY_ID, SECRET).start()
    try:
        service = open_tunnel_service(service_uri(emulator.url))
        base_tunnel = service.create_tunnel("t", "base", TunnelType.BASE_AND_STREAM)
        writer.update_row("t", {"id": "k1", "n": 1}, {"v": 10, "s": None})
        writer.delete_row("t", {"id": "k2", "n": 2})
        writer.put_row("t", {"id": "k2", "n": 2}, {"x": b"\xff"})
        layout = PageLayout.of_table(service.table_schema("t"))
        narrow = PageLayout((("id", pa.string()), ("n", pa.int64()), ("v", pa.int64())))
        stream_tunnel = service.create_tunnel("t", "stream")
        read = 0
        for tunnel in (stream_tunnel, base_tunnel):
            desc = service.describe_tunnel("t", tunnel.tunnel_name)
            for channel in desc.channels:
                if channel.status is not ChannelStatus.OPEN:  # stream channels after the base
                    continue
                token = service.get_checkpoint(tunnel.tunnel_id, channel.channel_id).token
                while token != FINISHED:
                    for lay in (layout, narrow):
                        got = service.read_page(tunnel.tunnel_id, channel.channel_id, token,
                                                4, lay)
                        want = TunnelService.read_page(service, tunnel.tunnel_id,
                                                       channel.channel_id, token, 4, lay)
                        assert got.batch.to_pylist() == want.batch.to_pylist()
                        assert got.batch.equals(want.batch)
                        assert (got.next_token, got.may_more) == (want.next_token,
                                                                  want.may_more)
                    read += got.count
                    if not got.count:
                        break
                    token = got.next_token
        assert read == 9 + 6  # the stream's nine changes, the base data's six rows
        service.close()
    finally:
        emulator.stop()
        writer.close()
