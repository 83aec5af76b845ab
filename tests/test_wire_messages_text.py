"""Protobuf ``string`` fields are UTF-8 checked where the Tunnel client parses a message.

The Tunnel messages are proto2, whose ``string`` bytes the protobuf runtime (upb) does not
check: a field holding invalid UTF-8 parses, and reading it gives ``bytes``. ``messages.parse``
refuses such a message with ``MessageError`` naming the field (the client reports it as a
``TunnelServiceError`` "BadResponse"; tokens and page decoding as theirs), for every string
field of every message, at any depth, repeated or not; valid text -- non-ASCII included --
parses as before.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.read_answer import read_answer
from testkit.emulator_requests import with_text

MARK = "zqzqzqzq"
BAD = b"\xc3(\xff\xfe\xed\xa0\x80z"  # a cut sequence, bytes never in UTF-8, a surrogate


def _cases() -> list[tuple[str, tuple[str, ...]]]:
    out = []

    def walk(name: str, descriptor: Any, prefix: tuple[str, ...], depth: int) -> None:
        for field in descriptor.fields:
            if field.type == FieldDescriptor.TYPE_STRING:
                out.append((name, (*prefix, field.name)))
            elif field.type == FieldDescriptor.TYPE_MESSAGE and depth < 3:
                walk(name, field.message_type, (*prefix, field.name), depth + 1)

    for name in m._MESSAGES:
        walk(name, getattr(m, name).DESCRIPTOR, (), 0)
    return out


CASES = _cases()


def test_every_message_with_text_is_covered() -> None:
    with_strings = {name for name, _ in CASES}
    assert {"ReadRecordsResponse", "DescribeTunnelResponse", "Error", "TokenContentV2",
            "HeartbeatResponse", "GetCheckpointResponse"} <= with_strings


@pytest.mark.parametrize("name, path", CASES, ids=lambda v: "/".join(v) if
                         isinstance(v, tuple) else v)
def test_a_string_field_that_is_not_utf8_is_a_message_error(name: str,
                                                            path: tuple[str, ...]) -> None:
    cls = getattr(m, name)
    good = with_text(cls, path, "ké ☃ \U0001f600")
    data = good.SerializeToString()
    assert m.parse(cls, data) == good  # valid text, non-ASCII included, parses as before
    bad = with_text(cls, path, MARK).SerializeToString().replace(MARK.encode(), BAD)
    with pytest.raises(m.MessageError) as info:
        m.parse(cls, bad)
    message = str(info.value)
    assert message.startswith(f"{name} field ") and "is not UTF-8 text" in message
    assert all(part in message for part in path), message


@pytest.mark.parametrize("scan", [True, False])
def test_a_read_records_answer_with_a_token_that_is_not_utf8(scan: bool) -> None:
    """The compiled scan declines it, and the runtime's parse refuses it: both paths of the
    client's ``read_page`` end in ``MessageError`` (then ``TunnelServiceError``)."""
    answer = m.ReadRecordsResponse(next_token=MARK, records=[m.Record(
        action_type=m.ACTION_PUT_ROW, record=b"x")]).SerializeToString()
    with pytest.raises(m.MessageError, match="next_token is not UTF-8"):
        read_answer(answer.replace(MARK.encode(), BAD), scan)
    assert read_answer(answer, scan).next_token == MARK
