"""A row condition's column condition, decoded from its wire bytes in one bounded pass.

Called by ``table_api`` (PutRow, UpdateRow, DeleteRow, BatchWriteRow; in the server's
connection thread, under the store's write lock) with the ``column_condition`` bytes of a
request's ``Condition``: a ``table_store_filter.Filter`` whose ``filter`` field holds either a
``SingleColumnValueFilter`` or a ``CompositeColumnValueFilter``, whose ``sub_filters`` are
``Filter`` messages again -- a tree serialized inside bytes fields, each level inside the one
above.

Decoding it level by level with the generated classes copies the rest of the tree at every
level (a bytes field is a new object), so a deep tree with a large leaf costs its depth times
its size. Here the tree is walked once over a ``memoryview`` of the input with an explicit
stack: composite levels are read in place, only each single condition's own bytes are copied
(once) and parsed by the SDK's class. Memory stays a small multiple of the input.

Bounds (checked before descending, so nothing past them is looked at): ``MAX_FILTER_DEPTH``
levels of composite conditions and ``MAX_FILTER_CONDITIONS`` conditions in all; past either
the request is refused with 400 ``OTSParameterInvalid``, as any malformed condition is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tablestore.protobuf import table_store_filter_pb2 as fpb

from connector.tunnel.tablestore.proto_text import invalid_string_field
from tablestore_emulator.errors import OtsError, parameter_invalid, unsupported_operation

__all__ = ["MAX_FILTER_CONDITIONS", "MAX_FILTER_DEPTH", "Composite", "Single", "decode_filter"]

#: Deepest nesting of composite conditions (AND/OR/NOT) accepted in one column condition.
MAX_FILTER_DEPTH = 32
#: Most conditions (single and composite together) accepted in one column condition.
MAX_FILTER_CONDITIONS = 1024

#: fields one message of the tree may have (a composite's subs and its combinator, and slack)
_MAX_FIELDS = MAX_FILTER_CONDITIONS + 8
_FILTER_TYPES = frozenset(v for _, v in fpb.FilterType.items())
_COMBINATORS = frozenset(v for _, v in fpb.LogicalOperator.items())


@dataclass
class Single:
    """A single-column comparison: ``column_value`` is still PlainBuffer (a bare value)."""

    comparator: int
    column_name: str
    column_value: bytes
    filter_if_missing: bool


@dataclass
class Composite:
    """``combinator`` (``LO_NOT`` / ``LO_AND`` / ``LO_OR``) over ``subs``, in wire order."""

    combinator: int
    subs: list[Single | Composite] = field(default_factory=list)


def _invalid(reason: str) -> OtsError:
    return parameter_invalid(f"Invalid column condition: {reason}.")


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(buf))):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i + 1
        shift += 7
    raise _invalid("truncated or overlong varint")


def _fields(buf: memoryview) -> list[tuple[int, int | memoryview]]:
    """``(field number, value)`` of every field of one message, in order: an int for a varint,
    a view into ``buf`` for a length-delimited field; fixed-width fields are skipped. More
    fields than a condition may have conditions are refused before they are listed."""
    out: list[tuple[int, int | memoryview]] = []
    pos, end = 0, len(buf)
    while pos < end:
        if len(out) > _MAX_FIELDS:
            raise parameter_invalid(
                f"Column condition has more than {MAX_FILTER_CONDITIONS} conditions.")
        key, pos = _varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _invalid("field number 0")
        if wire_type == 0:
            value, pos = _varint(buf, pos)
            out.append((number, value))
        elif wire_type == 2:
            size, pos = _varint(buf, pos)
            if size > end - pos:
                raise _invalid("a field runs past the end of its message")
            out.append((number, buf[pos:pos + size]))
            pos += size
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
            if pos > end:
                raise _invalid("a field runs past the end of its message")
        else:
            raise _invalid(f"unsupported wire type {wire_type}")
    return out


def _one(fields: list[tuple[int, int | memoryview]], number: int, kind: type,
         what: str) -> int | memoryview:
    """The last value of a required field (protobuf's rule: the last one wins)."""
    found = [v for n, v in fields if n == number]
    if not found or not isinstance(found[-1], kind):
        raise _invalid(f"{what} is missing")
    return found[-1]


def _single(raw: memoryview) -> Single:
    msg = fpb.SingleColumnValueFilter()
    try:
        msg.ParseFromString(bytes(raw))
    except Exception as exc:  # DecodeError, or a required field missing
        raise _invalid(f"bad single-column condition ({exc})") from None
    bad = invalid_string_field(msg)
    if bad is not None:
        raise _invalid(f"field {bad} is not UTF-8 text")
    return Single(msg.comparator, msg.column_name, msg.column_value, msg.filter_if_missing)


def decode_filter(raw: bytes) -> Single | Composite:
    """The condition tree of a ``Filter``'s bytes; 400 ``OTSParameterInvalid`` for a malformed
    one or one past ``MAX_FILTER_DEPTH`` / ``MAX_FILTER_CONDITIONS``, 400
    ``OTSUnsupportOperation`` for a filter type other than column value conditions."""
    root = Composite(0)  # a holder: the decoded tree is its one sub
    # each entry: a Filter's bytes, its depth (1 = the top), the list its node goes into
    stack: list[tuple[memoryview, int, list[Single | Composite]]] = [
        (memoryview(raw), 1, root.subs)]
    count = 1
    while stack:
        view, depth, into = stack.pop()
        fields = _fields(view)
        kind = _one(fields, 1, int, "the filter's type")
        body = _one(fields, 2, memoryview, "the filter's body")
        assert isinstance(body, memoryview)
        if kind not in _FILTER_TYPES:
            raise _invalid(f"unknown filter type {kind}")
        if kind == fpb.FT_SINGLE_COLUMN_VALUE:
            into.append(_single(body))
            continue
        if kind != fpb.FT_COMPOSITE_COLUMN_VALUE:
            raise unsupported_operation("Only column value conditions are supported.")
        comp_fields = _fields(body)
        combinator = _one(comp_fields, 1, int, "the composite's combinator")
        assert isinstance(combinator, int)
        if combinator not in _COMBINATORS:
            raise _invalid(f"unknown combinator {combinator}")
        node = Composite(combinator)
        into.append(node)
        subs = [v for n, v in comp_fields if n == 2]
        if not subs:
            raise parameter_invalid("A composite condition needs sub-conditions.")
        if combinator == fpb.LO_NOT and len(subs) != 1:
            raise parameter_invalid("A NOT condition takes exactly one sub-condition.")
        if depth + 1 > MAX_FILTER_DEPTH:
            raise parameter_invalid(
                f"Column condition is nested deeper than {MAX_FILTER_DEPTH} levels.")
        count += len(subs)
        if count > MAX_FILTER_CONDITIONS:
            raise parameter_invalid(
                f"Column condition has more than {MAX_FILTER_CONDITIONS} conditions.")
        for sub in reversed(subs):  # popped in wire order
            if not isinstance(sub, memoryview):
                raise _invalid("a sub-condition is not a message")
            stack.append((sub, depth + 1, node.subs))
    return root.subs[0]
