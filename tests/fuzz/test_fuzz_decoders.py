"""Fuzz target: ReadRecords pages from a server (or a corrupting proxy) into the page decoders.

Input: pages of wire records built to be almost right -- keys holding range bounds, cell
timestamps past the year 9999, values of another type than their declared column, layouts of
any Arrow type, before-images -- then their PlainBuffer bytes and the whole answer's protobuf
bytes mutated (``testkit.fuzzing.mutated``), or replaced by arbitrary bytes.

Property: ``read_answer`` gives an answer or ``MessageError``; the compiled and the pure-Python
decoders, from protobuf objects and from the scanned bytes, give the same batch or the same
``MalformedRecordError`` (``testkit.page_decoders.assert_same``); the protobuf-object path
(``decode_page``) gives records or ``MalformedRecordError``. Never another error.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from connector.errors import MalformedRecordError
from connector.tunnel.page import PageLayout
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.columnar import compiled_available
from connector.tunnel.tablestore.plainbuffer import (
    MAX_CELL_TIMESTAMP_MS,
    Cell,
    CellOp,
    Row,
    SequenceInfo,
    Special,
    encode_row,
)
from connector.tunnel.tablestore.read_answer import read_answer
from connector.tunnel.tablestore.records import decode_page
from testkit.fuzzing import fuzz_settings, mostly, mutated
from testkit.page_decoders import assert_same, compiled_required

pytestmark = [
    pytest.mark.fuzz,
    pytest.mark.skipif(not compiled_available() and not compiled_required(),
                       reason="the compiled decoder is not installed (make test requires it)"),
]

TS_US = 1_750_000_000_000_000
NAMES = ["id", "n", "v", "é", "\U0001f600", "a\"\\", "x" * 40]
VALUES = (st.integers(-2**63, 2**63 - 1) | st.floats() | st.booleans() | st.text(max_size=8)
          | st.binary(max_size=8))
#: a key value: now and then a placeholder (INF_MIN ...), which no record key may hold
KEY_VALUES = mostly(VALUES, st.sampled_from(list(Special)))
#: a cell timestamp: now and then past the year 9999
TIMESTAMPS = mostly(st.none() | st.integers(0, 2**45), st.sampled_from(
    [MAX_CELL_TIMESTAMP_MS, MAX_CELL_TIMESTAMP_MS + 1, 2**63 - 1]))
#: column types a layout may declare: the five a tunnel declares, and others a user may
TYPES = [pa.int64(), pa.float64(), pa.bool_(), pa.string(), pa.binary(), pa.int32(),
         pa.float32(), pa.timestamp("us"), pa.decimal128(10, 2), pa.large_string(), pa.date32()]


@st.composite
def cells(draw: Any, key: bool) -> tuple[Any, ...]:
    out = []
    for name in draw(st.lists(st.sampled_from(NAMES), min_size=1 if key else 0, max_size=4,
                              unique=key)):
        if key:
            out.append((name, draw(KEY_VALUES)))
            continue
        op = draw(st.sampled_from([CellOp.PUT] * 16 + list(CellOp)))
        value = draw(VALUES) if op in (CellOp.PUT, CellOp.INCREMENT) else None
        ts = None if op is CellOp.DELETE_ALL_VERSION else draw(TIMESTAMPS)
        out.append(Cell(name, value, op, ts))
    return tuple(out)


@st.composite
def records(draw: Any, index: int, stream: bool) -> Any:
    action = draw(st.sampled_from([m.ACTION_PUT_ROW, m.ACTION_UPDATE_ROW, m.ACTION_DELETE_ROW]))
    seq = SequenceInfo(0, TS_US + index, index) if stream else None
    try:
        body = encode_row(Row(draw(cells(key=True)), draw(cells(key=False)),
                              action == m.ACTION_DELETE_ROW, seq))
    except (TypeError, ValueError, OverflowError):  # a value PlainBuffer cannot encode
        body = b""
    corrupt = draw(mostly(st.just(False), st.just(True), one_in=4))  # bytes mutated
    record = m.Record(action_type=action, record=draw(mutated(body)) if corrupt else body)
    if draw(st.booleans()):
        before = encode_row(Row((), tuple(c for c in draw(cells(key=False))
                                          if c.op is CellOp.PUT)))
        record.origin_record = draw(mutated(before)) if corrupt else before
    return record


@st.composite
def pages(draw: Any) -> tuple[list[Any], int | None, PageLayout]:
    stream = draw(st.booleans())
    page = [draw(records(i, stream)) for i in range(draw(st.integers(0, 3)))]
    if draw(mostly(st.just(False), st.just(True))):  # arbitrary bytes as a record
        page.append(m.Record(action_type=m.ACTION_PUT_ROW, record=draw(st.binary(max_size=64))))
    # mostly the five types a tunnel declares; now and then one a user's schema may
    types = mostly(st.sampled_from(TYPES[:5]), st.sampled_from(TYPES), one_in=4)
    columns = draw(st.lists(st.tuples(st.sampled_from(NAMES), types), max_size=3,
                            unique_by=lambda c: c[0]))
    base = None if stream else draw(st.none() | st.integers(0, 2**40))
    return page, base, PageLayout(tuple(columns))


@fuzz_settings()
@given(pages())
def test_fuzz_pages_decode_to_a_batch_or_a_malformed_record_error(
        page: tuple[list[Any], int | None, PageLayout]) -> None:
    records_, base_offset, layout = page
    got = assert_same(records_, base_offset, layout, must_compile=False)
    if got[0] == "error":  # what was refused, for the statistics
        reason = re.sub(r"'[^']*'|0x[0-9a-f]+|[0-9]+", "_", got[2].partition("malformed: ")[2])
        event(f"refused: {reason.removeprefix('record #_: ')[:48]}")
    try:
        decode_page(records_, "ch-1", "tok-1", base_offset)
    except MalformedRecordError:
        pass


@fuzz_settings()
@given(pages(), st.data())
def test_fuzz_answers_read_and_decode_or_refuse(page: tuple[list[Any], int | None, PageLayout],
                                               data: Any) -> None:
    """A whole ReadRecords answer's bytes mutated: both readers agree to refuse it
    (``MessageError``) or read it, and its records then decode as above."""
    records_, base_offset, layout = page
    answer = m.ReadRecordsResponse(records=records_, next_token="tok-2",
                                   may_more_record=True).SerializeToString()
    body = data.draw(mutated(answer) | st.binary(max_size=200))
    outcomes = []
    for scan in (True, False):
        try:
            read = read_answer(body, scan)
        except m.MessageError:
            outcomes.append(None)
            continue
        assert isinstance(read.next_token, str)
        outcomes.append((read.next_token, read.may_more_record, len(read.records)))
        if not scan:
            assert_same(list(read.records), base_offset, layout, must_compile=False)
    assert outcomes[0] == outcomes[1]
    event(f"answer: {'refused' if outcomes[0] is None else 'read'}")
