"""DynamoDB Streams records the product did not expect: every malformed shape is refused.

``codec.decode_record`` turns one ``GetRecords`` record into a ``Record``; a record from a
service (or a proxy) that sends something else must end in ``MalformedRecordError`` naming the
shard and the token -- never a value guessed from another type (``bool("false")`` is True, the
number 5 is not the string "5"), never an ``AttributeError`` or a ``RecursionError``. Each
malformed attribute value is tried in every place a value can sit (the keys, both images,
inside a map, inside a list). The page built from decoded records refuses a value of another
type than its column the same way (``page.records_to_page``).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from connector.errors import MalformedRecordError
from connector.tunnel.base import Op
from connector.tunnel.dynamodb_streams import codec
from connector.tunnel.page import PageLayout, json_value, records_to_page

SHARD, TOKEN = "shardId-0001", "ddbs1:shardId-0001:A:100"
WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def record(keys: Any = None, new: Any = None, old: Any = None, **fields: Any) -> dict[str, Any]:
    ddb: dict[str, Any] = {"Keys": {"id": {"S": "a"}} if keys is None else keys,
                           "SequenceNumber": "101", "ApproximateCreationDateTime": WHEN}
    if new is not None:
        ddb["NewImage"] = new
    if old is not None:
        ddb["OldImage"] = old
    raw: dict[str, Any] = {"eventName": "MODIFY", "dynamodb": ddb}
    for name, value in fields.items():
        (raw if name == "eventName" else ddb)[name] = value
    return raw


def refused(raw: Any) -> str:
    with pytest.raises(MalformedRecordError) as info:
        codec.decode_record(raw, SHARD, TOKEN)
    assert info.value.fields["channel_id"] == SHARD and info.value.fields["token"] == TOKEN
    return str(info.value.fields["reason"])


def test_a_well_formed_record_of_every_type_decodes() -> None:
    """The baseline the malformed ones below are cut from."""
    item = {"id": {"S": "a"}, "n": {"N": "-1.5e3"}, "b": {"B": "AP8="}, "ok": {"BOOL": False},
            "nil": {"NULL": True}, "m": {"M": {"z": {"N": "2"}, "l": {"L": [{"S": "q"}]}}},
            "ss": {"SS": ["b", "a"]}, "ns": {"NS": ["10", ".5"]}, "bs": {"BS": [b"\x01"]}}
    r = codec.decode_record(record(new=item, old={"id": {"S": "a"}, "gone": {"N": "0"}}),
                            SHARD, TOKEN)
    assert r.op is Op.UPDATE and r.primary_key == {"id": "a"}
    assert r.columns["n"] == -1500.0 and r.columns["b"] == b"\x00\xff"
    assert r.columns["ok"] is False and r.columns["nil"] is None and r.columns["gone"] is None
    assert json.loads(r.columns["m"]) == {"l": ["q"], "z": 2}
    assert json.loads(r.columns["ns"]) == [0.5, 10]
    assert r.commit_ts_us == int(WHEN.timestamp() * 1_000_000)
    decimal = codec.decode_record(record(new={"n": {"N": "0.1"}}), SHARD, TOKEN, "decimal")
    assert decimal.columns["n"] == Decimal("0.1")


#: attribute values that are not one, and the words their error carries
MALFORMED_VALUES: list[tuple[Any, str]] = [
    ({"S": 5}, "S holds int 5, not a string"),
    ({"S": None}, "S holds NoneType"),
    ({"S": b"x"}, "S holds bytes"),
    ({"N": 5}, "N holds int 5, not a number as a string"),
    ({"N": 1.5}, "N holds float"),
    ({"N": "abc"}, "not a number"),
    ({"N": "NaN"}, "not a number"),
    ({"N": "Infinity"}, "not a number"),
    ({"N": "1e400"}, "outside DynamoDB's range"),
    ({"N": "1e-131"}, "outside DynamoDB's range"),
    ({"N": " 1"}, "not a number"),
    ({"N": ""}, "not a number"),
    ({"B": "!!not base64"}, "not base64"),
    ({"B": 5}, "B holds int"),
    ({"B": None}, "B holds NoneType"),
    ({"BOOL": "false"}, "BOOL holds str 'false', not true or false"),
    ({"BOOL": 1}, "BOOL holds int"),
    ({"BOOL": None}, "BOOL holds NoneType"),
    ({"NULL": False}, "NULL holds False, not true"),
    ({"NULL": "yes"}, "NULL holds 'yes'"),
    ({"M": None}, "M holds NoneType None, not a map"),
    ({"M": []}, "M holds list"),
    ({"M": "x"}, "M holds str"),
    ({"M": {1: {"S": "x"}}}, "M has a key 1 that is not a string"),
    ({"M": {"k": "v"}}, "not a typed DynamoDB value"),
    ({"L": None}, "L holds NoneType None, not a list"),
    ({"L": {"a": 1}}, "L holds dict"),
    ({"L": "ab"}, "L holds str"),
    ({"L": [5]}, "not a typed DynamoDB value"),
    ({"SS": "ab"}, "SS holds str"),
    ({"SS": [1]}, "SS holds int 1, not a string"),
    ({"NS": ["x"]}, "not a number"),
    ({"NS": [1]}, "N holds int"),
    ({"BS": [5]}, "B holds int"),
    ({"BS": None}, "BS holds NoneType"),
    ({}, "not a typed DynamoDB value"),
    ({"S": "a", "N": "1"}, "not a typed DynamoDB value"),
    ({"X": "1"}, "unknown DynamoDB type 'X'"),
    ({None: "1"}, "unknown DynamoDB type None"),
    ("x", "not a typed DynamoDB value"),
    (None, "not a typed DynamoDB value"),
    (["S", "x"], "not a typed DynamoDB value"),
    (5, "not a typed DynamoDB value"),
]


def _places(value: Any) -> dict[str, dict[str, Any]]:
    """``value`` in every place an attribute value sits, as a whole record each."""
    return {
        "Keys.id": record(keys={"id": value}),
        "Keys.k2": record(keys={"id": {"S": "a"}, "k2": value}),
        "NewImage.v": record(new={"v": value}),
        "OldImage.v": record(old={"v": value}),
        "NewImage.m.x": record(new={"m": {"M": {"x": value}}}),
        "NewImage.l[1]": record(new={"l": {"L": [{"S": "ok"}, value]}}),
        "NewImage.m.l[0].y": record(new={"m": {"M": {"l": {"L": [{"M": {"y": value}}]}}}}),
    }


@pytest.mark.parametrize("value, words", MALFORMED_VALUES, ids=lambda v: repr(v)[:24])
def test_every_malformed_attribute_value_in_every_place(value: Any, words: str) -> None:
    for path, raw in _places(value).items():
        reason = refused(raw)
        assert reason.startswith(f"AttributeValueError: {path}"), (path, reason)
        assert words in reason, (path, reason)


#: items (Keys, NewImage, OldImage) of a wrong shape
MALFORMED_ITEMS: list[tuple[Any, str]] = [
    ([{"id": {"S": "a"}}], "not a map of attributes"),
    ("id", "not a map of attributes"),
    ({1: {"S": "a"}}, "attribute name 1 is not a non-empty string"),
    ({"": {"S": "a"}}, "attribute name '' is not a non-empty string"),
    ({None: {"S": "a"}}, "attribute name None"),
]


@pytest.mark.parametrize("item, words", MALFORMED_ITEMS, ids=lambda v: repr(v)[:24])
@pytest.mark.parametrize("where", ["Keys", "NewImage", "OldImage"])
def test_items_of_a_wrong_shape(item: Any, words: str, where: str) -> None:
    raw = record(**{{"Keys": "keys", "NewImage": "new", "OldImage": "old"}[where]: item})
    assert words in refused(raw)


@pytest.mark.parametrize("raw, words", [
    ({"eventName": "INSERT"}, "'dynamodb' is missing or not a map"),
    ({"eventName": "INSERT", "dynamodb": None}, "'dynamodb' is missing or not a map"),
    ({"eventName": "INSERT", "dynamodb": []}, "'dynamodb' is missing or not a map"),
    (["not", "a", "record"], "not a stream record"),
    (None, "not a stream record"),
    (record(eventName="UPSERT"), "eventName 'UPSERT' is not one of"),
    (record(eventName=None), "eventName None"),
    (record(eventName={"a": 1}), "eventName {'a': 1}"),
    (record(keys={}), "Keys is missing or empty"),
    ({"eventName": "INSERT", "dynamodb": {"SequenceNumber": "1"}}, "Keys is missing"),
    (record(SequenceNumber=101), "bad sequence number 101"),
    (record(SequenceNumber="1.5"), "bad sequence number"),
    (record(SequenceNumber=None), "bad sequence number None"),
    (record(ApproximateCreationDateTime="yesterday"), "is not a time"),
    (record(ApproximateCreationDateTime=math.nan), "is not between 1970 and 9999"),
    (record(ApproximateCreationDateTime=True), "is not a time"),
    (record(ApproximateCreationDateTime=1e300), "is not between 1970 and 9999"),
    (record(ApproximateCreationDateTime=1e303), "is not between 1970 and 9999"),
    (record(ApproximateCreationDateTime=10**400), "is not between 1970 and 9999"),
    (record(ApproximateCreationDateTime=-5), "is not between 1970 and 9999"),
], ids=lambda v: repr(v)[:40])
def test_records_of_a_wrong_shape(raw: Any, words: str) -> None:
    assert words in refused(raw)


@pytest.mark.parametrize("depth", [33, 40, 5_000, 100_000])
@pytest.mark.parametrize("tag", ["M", "L"])
def test_nesting_past_32_levels_is_refused_not_a_recursion_error(depth: int, tag: str) -> None:
    """DynamoDB nests at most 32 levels; deeper input -- even far past Python's recursion limit
    -- is a malformed record, found without recursing into it."""
    value: Any = {"S": "leaf"}
    for _ in range(depth):
        value = {"M": {"x": value}} if tag == "M" else {"L": [value]}
    reason = refused(record(new={"deep": value}))
    assert "nested deeper than DynamoDB's 32 levels" in reason
    ok: Any = {"S": "leaf"}
    for _ in range(32):
        ok = {"M": {"x": ok}} if tag == "M" else {"L": [ok]}
    assert codec.decode_record(record(new={"deep": ok}), SHARD, TOKEN).columns["deep"]


def test_the_failure_is_about_the_record_not_the_input_object() -> None:
    """The decoder never changes or keeps the input: the same raw decodes twice alike."""
    raw = record(new={"m": {"M": {"a": {"N": "1"}}}})
    before = copy.deepcopy(raw)
    assert codec.decode_record(raw, SHARD, TOKEN) == codec.decode_record(raw, SHARD, TOKEN)
    assert raw == before


@pytest.mark.parametrize("column, value, fits", [
    (pa.string(), "x", True), (pa.string(), 1.0, False), (pa.string(), b"x", False),
    (pa.float64(), 1.5, True), (pa.float64(), "1.5", False), (pa.float64(), True, False),
    (pa.int64(), 2.0, True), (pa.int64(), 2.5, False), (pa.int64(), "2", False),
    (pa.binary(), b"x", True), (pa.binary(), "x", False),
    (pa.bool_(), True, True), (pa.bool_(), 1.0, False),
    (pa.decimal128(38, 2), Decimal("1.25"), True),
    (pa.decimal128(5, 2), Decimal("123456.5"), False),
    (pa.int32(), 2**40, False),
], ids=lambda v: repr(v)[:16])
def test_a_page_keeps_a_value_of_another_type_than_its_column(column: pa.DataType, value: Any,
                                                                 fits: bool) -> None:
    """``records_to_page`` (DynamoDB's page path): a value that fits is written; any other is
    null in its column and kept in ``_extra`` as a JSON value of its own type (a Decimal as a
    JSON number), never pyarrow's error: the reader's schema.change.behavior decides."""
    a = codec.decode_record(record(new={"v": {"NULL": True}}), SHARD, TOKEN)
    b = codec.decode_record(record(keys={"id": {"S": "b"}}, SequenceNumber="102"), SHARD, TOKEN)
    b = replace(b, columns={"v": value})
    layout = PageLayout((("id", pa.string()), ("v", column)))
    page = records_to_page([a, b], layout, token=TOKEN)
    extra = page.column("_extra").to_pylist()
    if fits:
        assert page.column("v").to_pylist() == [None, value] and extra == [None, None]
        return
    assert page.column("v").to_pylist() == [None, None] and extra[0] is None
    kept = json_value(json.loads(extra[1])["v"])
    expected = float(value) if isinstance(value, Decimal) else value
    assert kept == expected and type(kept) is type(expected)
