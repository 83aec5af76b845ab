"""The compiled scan of a ReadRecords answer's bytes against the protobuf runtime's parse.

``read_answer.read_answer(data, scan=True)`` reads a ``ReadRecordsResponse`` with
``_columnar.scan_read_records`` and leaves its records as spans of the bytes; the rule it must
keep: it either declines (and the protobuf runtime parses, with its errors) or it gives exactly
what the runtime gives -- the same records (action, ``record`` bytes, ``origin_record`` set or
not and its bytes), ``next_token`` and ``may_more_record``. Checked on generated answers (with
unknown fields, repeated fields, every ``may_more_record`` state), on every truncation and
every bit flip of an answer, and on hand-made answers the scanner must decline. The decoded
pages themselves are compared in tests/test_decoders.py (``assert_same`` decodes each page
from a scanned answer too).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.columnar import RawRecords, _columnar, compiled_available
from connector.tunnel.tablestore.read_answer import read_answer
from testkit.wire_bytes import varint

pytestmark = pytest.mark.skipif(not compiled_available(),
                                reason="the compiled decoder is not installed")


def parsed(body: bytes) -> tuple[Any, ...] | None:
    """What the protobuf runtime reads in ``body``, or None when it refuses it."""
    try:
        msg = m.parse(m.ReadRecordsResponse, body)
    except m.MessageError:
        return None
    records = [(r.action_type, bytes(r.record), r.HasField("origin_record"),
                bytes(r.origin_record)) for r in msg.records]
    may_more = msg.may_more_record if msg.HasField("may_more_record") else None
    return records, msg.next_token, may_more


def scanned(body: bytes) -> tuple[Any, ...] | None:
    """What the scanner reads in ``body`` (the same shape as ``parsed``), or None."""
    out = _columnar.scan_read_records(body)
    if out is None:
        return None
    count, next_token, may_more, index = out
    fields = struct.unpack(f"<{5 * count}i", index)
    records = []
    for i in range(count):
        action, at, size, origin_at, origin_size = fields[5 * i:5 * i + 5]
        records.append((action, body[at:at + size], origin_at >= 0,
                        body[origin_at:origin_at + origin_size] if origin_at >= 0 else b""))
    return records, next_token, None if may_more < 0 else bool(may_more)


def assert_agree(body: bytes) -> tuple[Any, ...] | None:
    """The scanner declines, or it reads what the runtime reads."""
    got = scanned(body)
    if got is not None:
        assert got == parsed(body)
    return got


# --- generated answers --------------------------------------------------------------------------

def field(number: int, wire_type: int, payload: bytes) -> bytes:
    return varint(number << 3 | wire_type) + payload


def length_delimited(number: int, data: bytes) -> bytes:
    return field(number, 2, varint(len(data)) + data)


#: fields neither message declares, in every wire type a Tunnel message may carry
unknown_fields = st.one_of(
    st.builds(lambda n, v: field(n, 0, varint(v)), st.integers(4, 40), st.integers(0, 2**64 - 1)),
    st.builds(lambda n, d: field(n, 1, d), st.integers(4, 40), st.binary(min_size=8, max_size=8)),
    st.builds(length_delimited, st.integers(4, 40), st.binary(max_size=12)),
    st.builds(lambda n, d: field(n, 5, d), st.integers(4, 40), st.binary(min_size=4, max_size=4)),
)


@st.composite
def records(draw: Any) -> bytes:
    parts = [field(1, 0, varint(draw(st.sampled_from([1, 2, 3]))))]
    parts += [length_delimited(2, draw(st.binary(max_size=40)))
              for _ in range(draw(st.integers(1, 2)))]  # a field twice: the last one counts
    if draw(st.booleans()):
        parts.append(length_delimited(3, draw(st.binary(max_size=40))))  # empty is still set
    parts += draw(st.lists(unknown_fields, max_size=2))
    return b"".join(draw(st.permutations(parts)))


@st.composite
def answers(draw: Any) -> bytes:
    parts = [length_delimited(1, r) for r in draw(st.lists(records(), max_size=6))]
    parts += [length_delimited(2, draw(st.text(max_size=20)).encode("utf-8"))
              for _ in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        parts.append(field(3, 0, varint(draw(st.sampled_from([0, 1, 2, 2**63])))))
    parts += draw(st.lists(unknown_fields, max_size=3))
    return b"".join(draw(st.permutations(parts)))  # the records' order is kept by both


@settings(max_examples=300, deadline=None)
@given(answers())
def test_a_generated_answer_is_scanned_as_the_runtime_parses_it(body: bytes) -> None:
    assert parsed(body) is not None
    assert assert_agree(body) is not None, "a well-formed answer was declined"


@settings(max_examples=60, deadline=None)
@given(answers())
def test_every_truncation_and_bit_flip_is_declined_or_read_alike(body: bytes) -> None:
    for cut in range(len(body)):
        assert_agree(body[:cut])
    for bit in range(len(body) * 8):
        flipped = bytearray(body)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert_agree(bytes(flipped))


def test_the_answers_the_scanner_declines() -> None:
    record = length_delimited(1, field(1, 0, varint(1)) + length_delimited(2, b"row"))
    token = length_delimited(2, b"next")
    assert assert_agree(record + token) is not None
    declined = {
        "no next_token (required)": record,
        "a record without its bytes (required)": length_delimited(1, field(1, 0, varint(1)))
        + token,
        "a record without an action (required)": length_delimited(1, length_delimited(2, b"r"))
        + token,
        "an action type the service does not send": length_delimited(
            1, field(1, 0, varint(9)) + length_delimited(2, b"r")) + token,
        "records in the wrong wire type": field(1, 0, varint(1)) + token,
        "a group": field(9, 3, b"") + token,
        "field number 0": field(0, 0, varint(1)) + token,
        "a next_token that is not UTF-8": record + length_delimited(2, b"\xff\xfe"),
        "a varint of 11 bytes": field(9, 0, b"\xff" * 10 + b"\x01") + token,
        "a length past the end": record + field(2, 2, varint(50) + b"next"),
    }
    for what, body in declined.items():
        assert scanned(body) is None, what


def test_read_answer_gives_raw_records_or_protobuf_records_alike() -> None:
    rows = [m.Record(action_type=a, record=bytes([a]) * 3) for a in (1, 2, 3)]
    rows[1].origin_record = b""
    body = m.ReadRecordsResponse(records=rows, next_token="t", may_more_record=False
                                 ).SerializeToString()
    raw, objects = read_answer(body, scan=True), read_answer(body, scan=False)
    assert isinstance(raw.records, RawRecords)
    assert (raw.next_token, raw.may_more_record) == (objects.next_token,
                                                      objects.may_more_record) == ("t", False)
    assert len(raw.records) == len(objects.records) == 3
    window = raw.records[1:5]
    assert (window.start, window.stop, len(window)) == (1, 3, 2)
    assert window.messages() == list(objects.records[1:3])
    assert len(raw.records[2:1]) == 0
    # a body the scanner declines is parsed by the runtime: the same answer
    declined = body + field(9, 3, b"")
    with pytest.raises(m.MessageError):
        read_answer(declined, scan=True)


def test_without_the_extension_the_runtime_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    from connector.tunnel.tablestore import columnar

    body = m.ReadRecordsResponse(records=[m.Record(action_type=1, record=b"r")],
                                 next_token="t").SerializeToString()
    monkeypatch.setattr(columnar, "_columnar", None)
    answer = read_answer(body, scan=True)
    assert not isinstance(answer.records, RawRecords)
    assert (len(answer.records), answer.next_token, answer.may_more_record) == (1, "t", None)


def test_the_raw_decoder_refuses_an_index_that_is_not_its_bodys() -> None:
    body = m.ReadRecordsResponse(records=[m.Record(action_type=1, record=b"row")],
                                 next_token="t").SerializeToString()
    _, _, _, index = _columnar.scan_read_records(body)
    for bad_body in (body[:5], b""):  # spans past the end of another body
        with pytest.raises(ValueError, match="does not describe"):
            _columnar.decode_raw_page(bad_body, index, 0, 1, (), b"", None)
    with pytest.raises(ValueError, match="within the index"):
        _columnar.decode_raw_page(body, index, 0, 2, (), b"", None)
