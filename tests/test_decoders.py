"""The compiled PlainBuffer page decoder against the pure-Python one: identical batches, errors.

``columnar.decode_compiled`` (C, ``_columnar.c``) and ``records.decode_columns_python`` must
turn the same wire records into the same page batch -- schema, values, nulls, float bits, the
``_before`` / ``_extra`` JSON text byte for byte -- and refuse the same malformed input with the
same ``MalformedRecordError`` (same message) -- and so must the compiled decoder reading the
records straight from a scanned ReadRecords answer's bytes (``read_answer``, the client's
``read_page`` path). Checked on generated pages (hypothesis: every
value type incl. NaN / infinities / -0.0, non-ASCII and empty strings, every cell op, before-
images, base records, layouts declaring some columns, mismatched column types), on every
truncation and every bit flip of a record and of its before-image, and on corrupted bytes of
generated pages. Also: ``make test`` requires the compiled decoder, and without it the
fallback is announced once per process, at the first decode.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from connector.errors import MalformedRecordError
from connector.tunnel.page import PageLayout, json_value
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.columnar import compiled_available, decode_compiled
from connector.tunnel.tablestore.plainbuffer import (
    Cell,
    CellOp,
    Row,
    SequenceInfo,
    Special,
    encode_row,
)
from connector.tunnel.tablestore.records import (
    decode_columns,
    decode_columns_python,
    decode_page,
)
from testkit.page_decoders import REQUIRE_COMPILED_ENV, assert_same, compiled_required

REPO = Path(__file__).resolve().parents[1]
TS_US = 1_750_000_000_000_000

needs_compiled = pytest.mark.skipif(
    not compiled_available() and not compiled_required(),
    reason="the compiled decoder is not installed (make test requires it)")


def test_the_compiled_decoder_is_installed_where_required() -> None:
    """``make test`` sets TABLESTORE_CDC_REQUIRE_COMPILED_DECODER=1: a build that silently fell
    back to the pure-Python decoder must fail the suite, not pass it untested."""
    if not compiled_required():
        pytest.skip(f"{REQUIRE_COMPILED_ENV} is not set")
    assert compiled_available(), (
        "the compiled PlainBuffer decoder (connector.tunnel.tablestore._columnar) is not "
        "built: reinstall with a C compiler (make .venv/.installed-stamp)")


# --- generated pages ------------------------------------------------------------------------

TYPES = {"INTEGER": pa.int64(), "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(),
         "STRING": pa.string(), "BINARY": pa.binary()}
#: a few names, so cells, keys and before-images collide; non-ASCII and astral ones included
NAMES = ["id", "n", "a", "b", "é", "☃", "\U0001f600x", "Z", "a\"\\\n", "long_column_name"]
#: each name's usual type (a generated value of another type is a declared-type mismatch)
NAME_TYPE = dict(zip(NAMES, ["STRING", "INTEGER", "INTEGER", "DOUBLE", "STRING", "BOOLEAN",
                             "BINARY", "STRING", "INTEGER", "DOUBLE"], strict=True))

VALUES: dict[str, st.SearchStrategy[Any]] = {
    "INTEGER": st.integers(-2**63, 2**63 - 1),
    "DOUBLE": st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 1e16, 1e-7, 0.1]),
    "BOOLEAN": st.booleans(),
    "STRING": st.text(max_size=12) | st.sampled_from(["", "ascii", "ké", "\x00\x1f\x7f",
                                                       "\U0001f600", "\u2028"]),
    "BINARY": st.binary(max_size=10),
}


@st.composite
def value_of(draw: Any, name: str, mismatch: bool) -> Any:
    kind = NAME_TYPE[name]
    if mismatch and draw(st.integers(0, 9)) == 0:
        kind = draw(st.sampled_from(sorted(VALUES)))
    return draw(VALUES[kind])


@st.composite
def cells(draw: Any, mismatch: bool, ops: bool) -> tuple[Cell, ...]:
    out = []
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=6)):
        op = CellOp.PUT
        if ops:
            op = draw(st.sampled_from([CellOp.PUT] * 3 + [CellOp.DELETE_ALL_VERSION,
                                                          CellOp.DELETE_ONE_VERSION]))
        ts = None
        if op is not CellOp.DELETE_ALL_VERSION:
            ts = draw(st.none() | st.integers(0, 2**45))
        value = draw(value_of(name, mismatch)) if op is CellOp.PUT else None
        out.append(Cell(name, value, op, ts))
    return tuple(out)


@st.composite
def wire_record(draw: Any, index: int | None, mismatch: bool) -> Any:
    action = draw(st.sampled_from([m.ACTION_PUT_ROW, m.ACTION_UPDATE_ROW, m.ACTION_DELETE_ROW]))
    key_names = draw(st.lists(st.sampled_from(NAMES[:4]), min_size=1, max_size=3, unique=True))
    key = tuple((k, draw(value_of(k, mismatch))) for k in key_names)
    body = draw(cells(mismatch, ops=action == m.ACTION_UPDATE_ROW))
    # increasing, now and then not (a malformed page)
    epoch = draw(st.sampled_from([0] * 9 + [1]))
    seq = None if index is None else SequenceInfo(epoch, TS_US + index, index)
    record = m.Record(action_type=action,
                      record=encode_row(Row(key, body, action == m.ACTION_DELETE_ROW, seq)))
    if draw(st.booleans()):
        before = draw(cells(mismatch, ops=False))
        record.origin_record = encode_row(Row((), before))
    return record


@st.composite
def pages(draw: Any, mismatch: bool = False) -> tuple[list[Any], int | None, PageLayout]:
    n = draw(st.integers(0, 6))
    stream = draw(st.booleans())
    records = [draw(wire_record(i if stream else None, mismatch)) for i in range(n)]
    base_offset = None if stream else draw(st.none() | st.integers(0, 2**40))
    declared = draw(st.lists(st.sampled_from(NAMES), unique=True))
    columns = []
    for name in declared:
        kind = NAME_TYPE[name]
        if mismatch and draw(st.integers(0, 4)) == 0:
            kind = draw(st.sampled_from(sorted(TYPES)))
        columns.append((name, TYPES[kind]))
    return records, base_offset, PageLayout(tuple(columns))


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@needs_compiled
@SETTINGS
@given(pages())
def test_identical_batches_on_generated_pages(page: tuple[list[Any], int | None,
                                                          PageLayout]) -> None:
    records, base_offset, layout = page
    assert_same(records, base_offset, layout, must_compile=True)


@needs_compiled
@SETTINGS
@given(pages(mismatch=True))
def test_identical_outcomes_with_mismatched_types(page: tuple[list[Any], int | None,
                                                              PageLayout]) -> None:
    """Values of another type than their declared column: pyarrow's conversion (or its error)
    on the Python path decides for both."""
    records, base_offset, layout = page
    assert_same(records, base_offset, layout, must_compile=False)


@st.composite
def corrupted_pages(draw: Any) -> tuple[list[Any], int | None, PageLayout]:
    records, base_offset, layout = draw(pages().filter(lambda p: len(p[0]) > 0))
    victim = m.Record()
    i = draw(st.integers(0, len(records) - 1))
    victim.CopyFrom(records[i])
    field = "origin_record" if victim.HasField("origin_record") and draw(st.booleans()) \
        else "record"
    data = bytearray(getattr(victim, field))
    how = draw(st.sampled_from(["truncate", "flip", "overwrite", "insert", "delete"]))
    at = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        del data[at:]
    elif how == "flip":
        data[at] ^= 1 << draw(st.integers(0, 7))
    elif how == "overwrite":
        data[at] = draw(st.integers(0, 255))
    elif how == "insert":
        data[at:at] = draw(st.binary(min_size=1, max_size=3))
    else:
        del data[at]
    setattr(victim, field, bytes(data))
    event(f"corruption: {how} in {field}")
    return records[:i] + [victim] + records[i + 1:], base_offset, layout


@needs_compiled
@SETTINGS
@given(corrupted_pages())
def test_identical_errors_on_corrupted_pages(page: tuple[list[Any], int | None,
                                                         PageLayout]) -> None:
    records, base_offset, layout = page
    assert_same(records, base_offset, layout, must_compile=False)


# --- every truncation and bit flip of one record ------------------------------------------

KEY = (("id", "ké"), ("n", -7), ("b", b"\x00\xff"))
FULL = (Cell("a", 2**62, CellOp.PUT, 1_700_000_000_000), Cell("b", -2.5, CellOp.PUT, 1),
        Cell("t", True, CellOp.PUT, 2), Cell("s", "héllo ✓", CellOp.PUT, 3),
        Cell("e", "", CellOp.PUT, 4), Cell("x", b"\x01\x02", CellOp.PUT, 5),
        Cell("gone", None, CellOp.DELETE_ALL_VERSION),
        Cell("old", None, CellOp.DELETE_ONE_VERSION, 7))
BEFORE = (Cell("a", 1, CellOp.PUT, 9), Cell("s", "old", CellOp.PUT, 9),
          Cell("x", b"\xaa", CellOp.PUT, 9), Cell("f", math.nan, CellOp.PUT, 9))
LAYOUT = PageLayout((("id", pa.string()), ("n", pa.int64()), ("b", pa.binary()),
                     ("a", pa.int64()), ("s", pa.string()), ("t", pa.bool_())))


def _update() -> Any:
    return m.Record(action_type=m.ACTION_UPDATE_ROW,
                    record=encode_row(Row(KEY, FULL, False, SequenceInfo(0, TS_US, 42))),
                    origin_record=encode_row(Row((), BEFORE)))


def _corruptions(data: bytes) -> list[bytes]:
    out = [data[:n] for n in range(len(data))]
    for pos in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[pos] ^= 1 << bit
            out.append(bytes(bad))
    return out


@needs_compiled
@pytest.mark.parametrize("field", ["record", "origin_record"])
def test_every_truncation_and_bit_flip_gives_the_same_outcome(field: str) -> None:
    """Every prefix and every single-bit flip of the record (and of its before-image): both
    decoders raise the same error, or -- a flip the format cannot see, e.g. in the sequence
    extension -- give the same batch."""
    good = _update()
    errors = 0
    for bad in _corruptions(getattr(good, field)):
        record = m.Record()
        record.CopyFrom(good)
        setattr(record, field, bad)
        result = assert_same([good, record] if field == "origin_record" else [record], None,
                             LAYOUT, must_compile=False)
        errors += result[0] == "error"
    assert errors > 0.8 * len(getattr(good, field)) * 9


@needs_compiled
def test_edge_values_decode_in_the_compiled_decoder() -> None:
    """Spot checks of what the generated pages cover, on one hand-made page: NaN, infinities,
    -0.0, a float's repr, astral characters and control bytes in the JSON; no hand-over."""
    extra_cells = (Cell("f", math.nan), Cell("g", -math.inf), Cell("h", -0.0),
                   Cell("r", 0.1 + 0.2), Cell("big", 1e300), Cell("u", "\U0001f600\x01\u2028"),
                   Cell("q", "\"\\/\t"), Cell("bin", b""), Cell("i", -2**63))
    record = m.Record(action_type=m.ACTION_PUT_ROW,
                      record=encode_row(Row((("id", "k"),), extra_cells, False,
                                            SequenceInfo(0, TS_US, 1))),
                      origin_record=encode_row(Row((), (Cell("z", math.inf),))))
    layout = PageLayout((("id", pa.string()), ("f", pa.float64()), ("h", pa.float64())))
    got = assert_same([record], None, layout, must_compile=True)
    columns = {name: values for name, _, values in got[3]}
    assert columns["f"] == [struct.pack("<d", math.nan).hex()]
    assert columns["h"] == [struct.pack("<d", -0.0).hex()]
    assert columns["_extra"] == [
        '{"big":1e+300,"bin":{"$binary":""},"g":-Infinity,"i":-9223372036854775808,'
        '"q":"\\"\\\\/\\t","r":0.30000000000000004,"u":"\\ud83d\\ude00\\u0001\\u2028"}']
    assert columns["_before"] == ['{"z":Infinity}']


@needs_compiled
def test_what_the_compiled_decoder_hands_to_the_python_path() -> None:
    """A declared column of another type, an unsupported layout type: the Python path decides
    (here: the integer fits a double exactly, and pyarrow converts it to int32)."""
    record = m.Record(action_type=m.ACTION_PUT_ROW,
                      record=encode_row(Row((("id", "k"),), (Cell("v", 3),), False,
                                            SequenceInfo(0, TS_US, 1))))
    as_float = PageLayout((("id", pa.string()), ("v", pa.float64())))
    assert decode_compiled([record], "ch", "tok", None, as_float) is None
    assert decode_columns([record], "ch", "tok", None, as_float).column("v").to_pylist() == [3.0]
    int32 = PageLayout((("id", pa.string()), ("v", pa.int32())))
    assert decode_compiled([record], "ch", "tok", None, int32) is None
    assert decode_columns([record], "ch", "tok", None, int32).column("v").to_pylist() == [3]


# --- bad input of each kind: the typed error, alike in both decoders ---------------------------

STRING_KEY = PageLayout((("id", pa.string()), ("v", pa.int64())))


def _refused(records: list[Any], base_offset: int | None, layout: PageLayout) -> str:
    """Both decoders (objects and scanned bytes) refuse the page with the same
    ``MalformedRecordError``, naming the channel and the token; its reason."""
    got = assert_same(records, base_offset, layout, must_compile=False)
    assert got[:2] == ("error", MalformedRecordError), got
    return str(got[2])


def _put(key: Any, cells: tuple[Cell, ...] = (), seq: SequenceInfo | None = None,
         before: tuple[Cell, ...] | None = None) -> Any:
    record = m.Record(action_type=m.ACTION_PUT_ROW, record=encode_row(Row(key, cells, False, seq)))
    if before is not None:
        record.origin_record = encode_row(Row((), before))
    return record


@needs_compiled
@pytest.mark.parametrize("ts", [253_402_300_800_000, 2**53, 2**63 - 1])
@pytest.mark.parametrize("where", ["stream record", "base record", "before-image"])
def test_cell_timestamps_after_the_year_9999_are_malformed(ts: int, where: str) -> None:
    """A cell timestamp is milliseconds since the epoch; one after 9999-12-31 is no instant a
    timestamp column holds (a base record's commit time is its newest cell's): refused where
    the cell is read, in a record or its before-image, stream or base."""
    late = (Cell("v", 1, CellOp.PUT, ts),)
    seq = None if where == "base record" else SequenceInfo(0, TS_US, 1)
    good = _put((("id", "k"),), (Cell("v", 2, CellOp.PUT, 253_402_300_799_999),), seq)
    bad = _put((("id", "k2"),), () if where == "before-image" else late,
               None if seq is None else SequenceInfo(0, TS_US + 1, 2),
               before=late if where == "before-image" else None)
    reason = _refused([good, bad], None, STRING_KEY)
    assert f"record #1: cell 'v': timestamp {ts} ms is after the year 9999" in reason


@needs_compiled
@pytest.mark.parametrize("placeholder", list(Special))
@pytest.mark.parametrize("stream", [True, False])
def test_placeholders_in_a_record_key_are_malformed(placeholder: Special, stream: bool) -> None:
    """INF_MIN / INF_MAX (a range read's bounds) and AUTO_INCREMENT are no key value: a record
    whose key holds one, in any key column, is refused (not a TypeError, not a wrong row)."""
    for key in ((("id", placeholder),), (("id", "k"), ("n", placeholder))):
        records = [_put(key, (Cell("v", 1),), SequenceInfo(0, TS_US, 1) if stream else None)]
        for layout in (STRING_KEY, PageLayout((("id", pa.string()), ("n", pa.int64())))):
            reason = _refused(records, None, layout)
            column = key[-1][0]
            assert (f"record #0: key column {column!r} holds {placeholder.name}, a placeholder "
                    "that is not a value") in reason
        with pytest.raises(MalformedRecordError, match="placeholder"):
            decode_page(records, "ch-1", "tok-1", None)  # the protobuf-object path


#: (a value, the Arrow column types it fits without loss) for every value kind
FITS: list[tuple[Any, set[pa.DataType]]] = [
    (7, {pa.int64(), pa.float64()}),
    (2**53 + 1, {pa.int64()}),  # no double holds it exactly
    (4.0, {pa.int64(), pa.float64()}),  # a whole number
    (4.5, {pa.float64()}),
    (math.nan, {pa.float64()}),
    (1e300, {pa.float64()}),
    (True, {pa.bool_()}),
    ("x", {pa.string()}),
    ("", {pa.string()}),
    (b"\x00", {pa.binary()}),
]


@needs_compiled
@pytest.mark.parametrize("typ", list(TYPES.values()), ids=str)
# ids from the value alone: a set's repr follows its hashes, which differ between processes
# (pytest-xdist workers must collect the same ids)
@pytest.mark.parametrize("value, fits", FITS, ids=[repr(value)[:12] for value, _ in FITS])
def test_a_value_of_another_type_than_its_column(value: Any, fits: set[pa.DataType],
                                                  typ: pa.DataType) -> None:
    """Every value kind against every column type: a value that fits without loss is written;
    any other is null in the column and kept in ``_extra`` as a JSON value of its own type
    (both decoders alike) -- never pyarrow's error, never a DOUBLE 1.5 made the bigint 1."""
    layout = PageLayout((("id", pa.string()), ("v", typ)))
    ok = _put((("id", "a"),), (Cell("v", None, CellOp.DELETE_ALL_VERSION),),
              SequenceInfo(0, TS_US, 1))
    ok.action_type = m.ACTION_UPDATE_ROW
    records = [ok, _put((("id", "b"),), (Cell("v", value),), SequenceInfo(0, TS_US, 2))]
    got = assert_same(records, None, layout, must_compile=False)
    assert got[0] == "batch"
    batch = decode_columns_python(records, "c", "t", None, layout)
    column, extra = batch.column("v").to_pylist(), batch.column("_extra").to_pylist()
    assert column[0] is None and extra[0] is None
    if typ in fits:
        assert column[1] == value or math.isnan(column[1])
        assert extra[1] is None
    else:
        kept = json_value(json.loads(extra[1])["v"])
        assert column[1] is None and type(kept) is type(value)
        assert kept == value or math.isnan(kept)


# --- the fallback, announced once ------------------------------------------------------------

FALLBACK_SCRIPT = textwrap.dedent("""
    import logging, sys
    sys.modules["connector.tunnel.tablestore._columnar"] = None  # as if never built
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="LOG %(name)s %(levelname)s %(message)s")
    import tablestore_cdc.commands.app  # noqa: F401 -- the CLI's import says nothing
    print("imported", flush=True)
    import pyarrow as pa
    from connector.tunnel.page import PageLayout
    from connector.tunnel.tablestore import messages as m
    from connector.tunnel.tablestore.columnar import compiled_available
    from connector.tunnel.tablestore.plainbuffer import Row, SequenceInfo, encode_row
    from connector.tunnel.tablestore.records import decode_columns
    assert not compiled_available()
    record = m.Record(action_type=1, record=encode_row(
        Row((("id", 1),), (), False, SequenceInfo(0, 1_750_000_000_000_000, 1))))
    layout = PageLayout((("id", pa.int64()),))
    for _ in range(3):
        assert decode_columns([record], "ch", "tok", None, layout).num_rows == 1
    print("decoded", flush=True)
""")


def test_the_fallback_is_announced_once_at_the_first_decode() -> None:
    run = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], capture_output=True,
                         text=True, cwd=REPO, timeout=120, check=True)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    warnings = [line for line in lines if "pure-Python decoder" in line]
    assert len(warnings) == 1, lines
    assert warnings[0].startswith("LOG connector.tunnel.tablestore WARNING")
    assert lines.index(warnings[0]) > lines.index("imported"), lines
