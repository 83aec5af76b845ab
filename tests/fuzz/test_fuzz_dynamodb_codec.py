"""Fuzz target: DynamoDB Streams records into the codec and onto a page.

Input: ``GetRecords`` records built from typed attribute values that are right or nearly so
(every type tag, nesting up to past DynamoDB's 32 levels, a tag holding another Python type,
numbers out of range, maps with keys of another type, unknown tags), with any part of the
record replaced by arbitrary JSON-like data now and then; then a page of the decoded records
for a layout of any of the column types.

Property: ``codec.decode_record`` gives a ``Record`` or ``MalformedRecordError`` from one of
its own checks (not a ``TypeError`` or ``OverflowError`` it caught as a last resort);
``fit_records`` and ``records_to_page`` give a batch or ``MalformedRecordError``. Never
another error (no ``AttributeError``, no ``RecursionError``, no pyarrow error).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from connector.errors import MalformedRecordError
from connector.tunnel.dynamodb_streams import codec
from connector.tunnel.page import PageLayout, records_to_page
from testkit.fuzzing import fuzz_settings, mostly

pytestmark = pytest.mark.fuzz

SHARD, TOKEN = "shardId-1", "ddbs1:shardId-1:A:1"

#: JSON-like junk: what a broken service or proxy might put anywhere
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
    | st.binary(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=4) | st.integers(), inner, max_size=3),
    max_leaves=8)

NUMBERS = st.one_of(
    st.integers(-10**20, 10**20).map(str), st.decimals(allow_nan=False).map(str),
    st.sampled_from(["1e125", "1e126", "-1e-130", "1e-131", "NaN", "Infinity", "0x10", " 1",
                     "1_0", "", "٣", "1e99999"]))
SCALAR_VALUES = st.one_of(
    st.builds(lambda s: {"S": s}, st.text(max_size=8)),
    st.builds(lambda n: {"N": n}, NUMBERS),
    st.builds(lambda b: {"B": b}, st.binary(max_size=8) | st.text(max_size=8)),
    st.builds(lambda b: {"BOOL": b}, st.booleans()),
    st.just({"NULL": True}),
    st.builds(lambda s: {"SS": s}, st.lists(st.text(max_size=4), max_size=3)),
    st.builds(lambda s: {"NS": s}, st.lists(NUMBERS, max_size=3)),
    st.builds(lambda s: {"BS": s}, st.lists(st.binary(max_size=4), max_size=3)),
)
#: a typed value now and then of the wrong shape: another tag's content, an unknown tag, junk
WRONG = st.one_of(
    st.builds(lambda tag, v: {tag: v}, st.sampled_from(["S", "N", "B", "BOOL", "NULL", "M",
                                                        "L", "SS", "NS", "BS", "X", ""]), JUNK),
    JUNK, st.just({}), st.just({"S": "a", "N": "1"}))


def _nest(value: Any, depth: int, as_map: bool) -> Any:
    for _ in range(depth):
        value = {"M": {"k": value}} if as_map else {"L": [value]}
    return value


VALUES = st.recursive(
    mostly(SCALAR_VALUES, WRONG, one_in=6),
    lambda inner: st.one_of(
        st.builds(lambda m: {"M": m}, st.dictionaries(st.text(max_size=4), inner, max_size=3)),
        st.builds(lambda items: {"L": items}, st.lists(inner, max_size=3))),
    max_leaves=10,
) | st.builds(_nest, SCALAR_VALUES, st.sampled_from([31, 32, 33, 2000]), st.booleans())

ITEMS = st.dictionaries(st.text(min_size=1, max_size=4), VALUES, max_size=4)


@st.composite
def raw_records(draw: Any) -> Any:
    ddb: dict[str, Any] = {
        "Keys": draw(st.dictionaries(st.sampled_from(["id", "k"]),
                                     mostly(SCALAR_VALUES, WRONG), min_size=1,
                                     max_size=2)),
        "SequenceNumber": draw(mostly(st.integers(1, 10**30).map(str),
                                      st.sampled_from(["", "1.5", "x"]) | st.integers())),
        "ApproximateCreationDateTime": draw(mostly(st.sampled_from(
            [dt.datetime(2026, 1, 1, tzinfo=dt.UTC), 1.7e9, None]), st.floats() | JUNK)),
    }
    for image in ("NewImage", "OldImage"):
        if draw(st.booleans()):
            ddb[image] = draw(ITEMS)
    events = st.sampled_from(["INSERT", "MODIFY", "REMOVE"])
    raw: dict[str, Any] = {"eventName": draw(mostly(events, st.text(max_size=6))),
                           "dynamodb": ddb}
    if draw(mostly(st.just(False), st.just(True))):  # any one part replaced by junk
        part = draw(st.sampled_from(["eventName", "dynamodb", *ddb]))
        (raw if part in ("eventName", "dynamodb") else ddb)[part] = draw(JUNK)
    return draw(mostly(st.just(raw), JUNK, one_in=30))


TYPES = [pa.string(), pa.float64(), pa.int64(), pa.binary(), pa.bool_(),
         pa.decimal128(38, 6), pa.int32(), pa.timestamp("us")]


@fuzz_settings()
@given(st.lists(raw_records(), max_size=4), st.sampled_from(["double", "decimal"]),
       st.lists(st.tuples(st.sampled_from(["id", "k", "a", "b"]), st.sampled_from(TYPES)),
                max_size=3, unique_by=lambda c: c[0]))
def test_fuzz_records_decode_and_page_or_a_malformed_record_error(
        raws: list[Any], mode: str, columns: list[tuple[str, pa.DataType]]) -> None:
    decoded = []
    for raw in raws:
        try:
            decoded.append(codec.decode_record(raw, SHARD, TOKEN, mode))  # type: ignore[arg-type]
        except MalformedRecordError as exc:
            assert exc.fields["channel_id"] == SHARD and exc.fields["token"] == TOKEN
            # refused by a check of the codec's, not by Python tripping over the input
            assert exc.fields["reason"].startswith(("AttributeValueError: ", "ValueError: "))
            event(f"record refused: {str(exc.fields['reason']).split(':')[0]}")
        else:
            event("record decoded")
            for value in (*decoded[-1].primary_key.values(), *decoded[-1].columns.values()):
                assert value is None or isinstance(value, str | bytes | bool | float | Decimal)
    layout = PageLayout(tuple(columns))
    try:
        batch = records_to_page(codec.fit_records(decoded, layout.columns, mode),  # type: ignore[arg-type]
                                layout, token=TOKEN)
    except MalformedRecordError as exc:
        assert exc.fields["reason"].startswith("record #")
        event("page refused")
    else:
        assert batch.num_rows == len(decoded)
        event("page built")
