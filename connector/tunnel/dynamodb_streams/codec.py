"""DynamoDB Streams records and positions as the tunnel interface sees them (no SDK, no I/O).

Two things live here, both pure functions tested on plain dicts:

- **tokens**: a channel position is an opaque string to the rest of the product. Here it is
  ``ddbs1:<shard id>:<kind>:<sequence number>`` with kind

  - ``S`` — the shard's own start (``AT_SEQUENCE_NUMBER`` its ``StartingSequenceNumber``): a
    shard nobody has read yet. Asking for its start, not for ``TRIM_HORIZON``, is what lets a
    read notice that the retention window trimmed records this tunnel never saw. A child
    shard's start token ends with ``:<parent shard id>`` so an executor can check the parent is
    finished without listing the stream;
  - ``A`` — after a record already read (``AFTER_SEQUENCE_NUMBER``);
  - ``T`` — the oldest record held now (``TRIM_HORIZON``): only handed out as the
    ``resume_token`` of a ``TrimmedDataError``, when the user accepts the loss.

  ``FINISHED`` (``connector.tunnel.base``) is the token of a shard read to its end.
- **records**: one ``GetRecords`` record (botocore's parsed JSON) becomes one ``Record``:
  INSERT/MODIFY/REMOVE -> PUT/UPDATE/DELETE, the keys from ``Keys``, the images decoded from
  DynamoDB's typed JSON (see ``decode_value``), ``sequence`` the sequence number zero-padded to
  ``SEQUENCE_DIGITS`` digits so it sorts as a string within the shard.

Called by ``connector.tunnel.dynamodb_streams.service`` (driver and executors) and by the test
fake of the shard map.
"""

from __future__ import annotations

import base64
import json
import re
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

import pyarrow as pa

from connector.errors import MalformedRecordError, MalformedTokenError
from connector.tunnel.base import Op, Record

#: DynamoDB sequence numbers have 21 to 40 digits; padded to this width they sort as strings.
SEQUENCE_DIGITS = 40
TOKEN_PREFIX = "ddbs1"
_SEQ = re.compile(r"^[0-9]{1,40}$")
_SHARD = re.compile(r"^[A-Za-z0-9_.-]{1,65}$")

Kind = Literal["S", "A", "T"]
#: How numbers (``N``) are decoded: ``double`` -> float, ``decimal`` -> decimal.Decimal.
NumberMode = Literal["double", "decimal"]


# --- tokens ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Position:
    """A decoded token: which shard, which kind of position, and the sequence number it names
    (``""`` for kind ``T``)."""

    shard_id: str
    kind: Kind
    sequence_number: str
    parent_id: str = ""  # kind S only

    def encode(self) -> str:
        tail = f":{self.parent_id}" if self.parent_id else ""
        return f"{TOKEN_PREFIX}:{self.shard_id}:{self.kind}:{self.sequence_number}{tail}"

    def iterator_args(self) -> dict[str, str]:
        """The ``GetShardIterator`` arguments that start reading at this position."""
        if self.kind == "T":
            return {"ShardIteratorType": "TRIM_HORIZON"}
        kind = "AT_SEQUENCE_NUMBER" if self.kind == "S" else "AFTER_SEQUENCE_NUMBER"
        return {"ShardIteratorType": kind, "SequenceNumber": self.sequence_number}


def start_token(shard_id: str, starting_sequence_number: str, parent_id: str | None = None
                ) -> str:
    return Position(shard_id, "S", starting_sequence_number, parent_id or "").encode()


def after_token(shard_id: str, sequence_number: str) -> str:
    return Position(shard_id, "A", sequence_number).encode()


def horizon_token(shard_id: str) -> str:
    return Position(shard_id, "T", "").encode()


def parse_token(token: Any, channel_id: str) -> Position:
    """Decode any token this backend issued (``MalformedTokenError`` otherwise). The caller
    checks ``shard_id`` against the channel it reads; ``channel_id`` is only for the message."""

    def bad(reason: str) -> MalformedTokenError:
        return MalformedTokenError(channel_id=channel_id, token=token, reason=reason)

    if not isinstance(token, str) or not token:
        raise bad("not a non-empty string")
    parts = token.split(":")
    if len(parts) not in (4, 5) or parts[0] != TOKEN_PREFIX:
        raise bad(f"not a DynamoDB Streams token ({TOKEN_PREFIX}:<shard>:<kind>:<sequence>)")
    _, shard_id, kind, seq, *rest = parts
    parent = rest[0] if rest else ""
    if not _SHARD.match(shard_id) or (rest and (kind != "S" or not _SHARD.match(parent))):
        raise bad("bad shard id")
    if kind in ("S", "A"):
        if not _SEQ.match(seq):
            raise bad("bad sequence number")
    elif kind != "T" or seq:
        raise bad(f"unknown position kind {kind!r}")
    return Position(shard_id, kind, seq, parent)  # type: ignore[arg-type]


def padded(sequence_number: str) -> str:
    """``Record.sequence``: the sequence number zero-padded so it sorts within the shard."""
    return sequence_number.rjust(SEQUENCE_DIGITS, "0")


# --- values ------------------------------------------------------------------------------------
#
# A record's attribute values are DynamoDB's typed JSON as botocore parses it (or raw JSON, in
# a test fake). Each one is checked as it is decoded: its shape (a map of exactly one known
# type tag), the Python type of what the tag holds (a number is a string of digits, a map's
# keys are strings ...), numbers within DynamoDB's range, and the nesting within DynamoDB's 32
# levels. Anything else raises ``AttributeValueError`` naming where in the record it is, which
# ``decode_record`` turns into a ``MalformedRecordError``: never a value guessed from another
# type (``bool("false")``), never a ``RecursionError``.

#: DynamoDB nests M and L values at most 32 levels deep
MAX_DEPTH = 32
#: a number as DynamoDB writes it: an optional sign, digits with an optional fraction, an
#: optional exponent
_NUMBER_TEXT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?")
#: DynamoDB's numbers: 0, or a magnitude from 1E-130 up to (not including) 1E+126
_MIN_MAGNITUDE, _MAX_MAGNITUDE = Decimal("1E-130"), Decimal("1E+126")
_TAGS = ("S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS")


class AttributeValueError(ValueError):
    """A typed attribute value that is not one (``decode_record`` reports it as the record's
    ``MalformedRecordError``); the message starts with where it is (``NewImage.tags[2]``)."""


def _bad(path: str, problem: str) -> AttributeValueError:
    return AttributeValueError(f"{path}: {problem}")


def _tagged(value: Any, path: str) -> tuple[str, Any]:
    """(type tag, what it holds) of a typed value, its shape checked."""
    if not isinstance(value, Mapping) or len(value) != 1:
        raise _bad(path, "not a typed DynamoDB value ({TAG: value} with one of "
                   f"{', '.join(_TAGS)}): {reprlib.repr(value)}")
    ((tag, inner),) = value.items()
    if not isinstance(tag, str) or tag not in _TAGS:
        raise _bad(path, f"unknown DynamoDB type {reprlib.repr(tag)}")
    return tag, inner


def _want(inner: Any, kind: type | tuple[type, ...], tag: str, what: str, path: str) -> None:
    if not isinstance(inner, kind):
        raise _bad(path, f"{tag} holds {type(inner).__name__} {reprlib.repr(inner)}, "
                   f"not {what}")


def _decimal(text: Any, path: str) -> Decimal:
    """A DynamoDB number's text, checked, as a Decimal."""
    _want(text, str, "N", "a number as a string", path)
    if not _NUMBER_TEXT.fullmatch(text):
        raise _bad(path, f"N holds {reprlib.repr(text)}, not a number")
    value = Decimal(text)
    if value and not _MIN_MAGNITUDE <= abs(value) < _MAX_MAGNITUDE:
        raise _bad(path, f"N {reprlib.repr(text)} is outside DynamoDB's range (1E-130 .. "
                   "1E+126)")
    return value


def _number(text: Any, mode: NumberMode, path: str) -> Any:
    value = _decimal(text, path)
    return value if mode == "decimal" else float(value)


def _json_number(text: str) -> Any:
    """A number inside JSON text: exact integers stay integers, others become floats."""
    value = Decimal(text)
    return int(value) if value == value.to_integral_value() and "e" not in text.lower() \
        else float(value)


def _items(inner: Any, tag: str, path: str) -> list[Any]:
    _want(inner, (list, tuple), tag, "a list", path)
    return list(inner)


def _plain(value: Any, path: str, depth: int) -> Any:
    """A typed attribute value as plain JSON-able Python (for M/L/sets inside JSON text)."""
    if depth > MAX_DEPTH:
        raise _bad(path, f"nested deeper than DynamoDB's {MAX_DEPTH} levels")
    tag, inner = _tagged(value, path)
    if tag == "S":
        _want(inner, str, tag, "a string", path)
        return inner
    if tag == "N":
        _decimal(inner, path)
        return _json_number(inner)
    if tag == "B":
        return {"$binary": base64.b64encode(_bytes(inner, path)).decode()}
    if tag == "BOOL":
        _want(inner, bool, tag, "true or false", path)
        return inner
    if tag == "NULL":
        if inner is not True:
            raise _bad(path, f"NULL holds {reprlib.repr(inner)}, not true")
        return None
    if tag == "M":
        _want(inner, Mapping, tag, "a map", path)
        out = {}
        for k, v in inner.items():
            if not isinstance(k, str):
                raise _bad(path, f"M has a key {reprlib.repr(k)} that is not a string")
            out[k] = _plain(v, f"{path}.{k}", depth + 1)
        return out
    if tag == "L":
        return [_plain(v, f"{path}[{i}]", depth + 1)
                for i, v in enumerate(_items(inner, tag, path))]
    if tag == "SS":
        strings = _items(inner, tag, path)
        for i, item in enumerate(strings):
            _want(item, str, tag, "a string", f"{path}[{i}]")
        return sorted(strings)
    if tag == "NS":
        numbers = _items(inner, tag, path)
        for i, n in enumerate(numbers):
            _decimal(n, f"{path}[{i}]")
        return sorted((_json_number(n) for n in numbers), key=float)
    encoded = sorted(base64.b64encode(_bytes(b, f"{path}[{i}]")).decode()
                     for i, b in enumerate(_items(inner, tag, path)))  # BS
    return [{"$binary": b} for b in encoded]


def _bytes(inner: Any, path: str) -> bytes:
    # boto3 hands binary values over as bytes; raw JSON (a fake, a test) as base64 text
    if isinstance(inner, bytes | bytearray):
        return bytes(inner)
    _want(inner, str, "B", "bytes or base64 text", path)
    try:
        return base64.b64decode(inner, validate=True)
    except ValueError:  # binascii.Error, or text that is not ASCII
        raise _bad(path, f"B holds {reprlib.repr(inner)}, not base64") from None


_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def decode_value(value: Mapping[str, Any], mode: NumberMode = "double",
                 path: str = "value") -> Any:
    """One typed attribute value (``{"S": "x"}``) as a plain Python value.

    S -> str, N -> float (or Decimal with ``mode="decimal"``), B -> bytes, BOOL -> bool,
    NULL -> None; M, L, SS, NS, BS -> compact JSON text with sorted keys (sets sorted; numbers
    as JSON numbers; binary as ``{"$binary": base64}``, as the ``_extra`` column writes it).
    ``AttributeValueError`` (naming ``path``) for anything that is not a typed value.
    """
    tag, inner = _tagged(value, path)
    if tag == "N":
        return _number(inner, mode, path)
    if tag == "B":
        return _bytes(inner, path)
    if tag in ("S", "BOOL", "NULL"):
        return _plain(value, path, 0)
    return _JSON(_plain(value, path, 0))


def decode_item(item: Mapping[str, Any] | None, mode: NumberMode = "double",
                skip: frozenset[str] = frozenset(), path: str = "item") -> dict[str, Any] | None:
    """An item (attribute name -> typed value) as plain values; None stays None.
    ``AttributeValueError`` for an item that is not a map of names to typed values."""
    if item is None:
        return None
    if not isinstance(item, Mapping):
        raise _bad(path, f"not a map of attributes: {reprlib.repr(item)}")
    out = {}
    for name, v in item.items():
        if not isinstance(name, str) or not name:
            raise _bad(path, f"attribute name {reprlib.repr(name)} is not a non-empty string")
        if name not in skip:
            out[name] = decode_value(v, mode, f"{path}.{name}")
    return out


# --- records -----------------------------------------------------------------------------------

_OPS = {"INSERT": Op.PUT, "MODIFY": Op.UPDATE, "REMOVE": Op.DELETE}
#: the latest commit time a record may carry: 9999-12-31T23:59:59.999999Z in microseconds
_MAX_COMMIT_US = 253_402_300_799_999_999


def _micros(when: Any) -> int:
    if isinstance(when, datetime):
        micros = int(when.timestamp() * 1_000_000)
    elif isinstance(when, int | float) and not isinstance(when, bool) and -1e15 < when < 1e15:
        # epoch seconds in raw JSON, bounded first (NaN and infinities are not in the bounds;
        # 1e303 seconds would overflow as microseconds)
        micros = int(when * 1_000_000)
    elif isinstance(when, int | float) and not isinstance(when, bool):
        micros = -1  # a number, far outside any time: refused below
    else:
        raise ValueError(f"ApproximateCreationDateTime {reprlib.repr(when)} is not a time")
    if not 0 <= micros <= _MAX_COMMIT_US:
        raise ValueError(f"ApproximateCreationDateTime {reprlib.repr(when)} is not between "
                         "1970 and 9999")
    return micros


def decode_record(raw: Mapping[str, Any], shard_id: str, token: str,
                  mode: NumberMode = "double") -> Record:
    """One ``GetRecords`` record as a ``Record`` (executor).

    What each stream view type gives (``StreamViewType`` of the table's stream):

    - ``NEW_AND_OLD_IMAGES``: PUT = the new item; UPDATE = the new item plus ``None`` for each
      attribute the change removed, ``before`` = the old item; DELETE ``before`` = the old item;
    - ``NEW_IMAGE``: PUT/UPDATE = the new item, no ``before``;
    - ``OLD_IMAGE``: PUT/UPDATE carry the keys only (DynamoDB does not send the new values);
      DELETE ``before`` = the old item;
    - ``KEYS_ONLY``: every record carries the keys only.

    A record that cannot be decoded -- a missing or mistyped field, an attribute value of a
    wrong shape (``AttributeValueError``), nesting past 32 levels -- raises
    ``MalformedRecordError`` naming the shard and the token: never a wrong row.
    """
    try:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("dynamodb"), Mapping):
            raise ValueError("not a stream record: 'dynamodb' is missing or not a map")
        ddb = raw["dynamodb"]
        event = raw.get("eventName")
        if not isinstance(event, str) or event not in _OPS:
            raise ValueError(f"eventName {reprlib.repr(event)} is not one of "
                             f"{', '.join(_OPS)}")
        op = _OPS[event]
        keys = decode_item(ddb.get("Keys"), mode, path="Keys")
        if not keys:
            raise ValueError("Keys is missing or empty")
        key_names = frozenset(keys)
        new = decode_item(ddb.get("NewImage"), mode, key_names, path="NewImage")
        old = decode_item(ddb.get("OldImage"), mode, key_names, path="OldImage")
        seq = ddb.get("SequenceNumber")
        if not isinstance(seq, str) or not _SEQ.match(seq):
            raise ValueError(f"bad sequence number {reprlib.repr(seq)}")
        when = ddb.get("ApproximateCreationDateTime")
        commit_ts_us = _micros(when) if when is not None else 0
    except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
        raise MalformedRecordError(channel_id=shard_id, token=token,
                                   reason=f"{type(exc).__name__}: {exc}") from None
    columns: dict[str, Any]
    before: dict[str, Any] | None = None
    if op is Op.DELETE:
        columns, before = {}, old
    elif op is Op.PUT:
        columns = new or {}
    else:
        columns = dict(new) if new is not None else {}
        if new is not None and old is not None:
            before = old
            for name in old.keys() - new.keys():  # removed by this change
                columns[name] = None
    return Record(op, keys, columns, before, padded(seq), commit_ts_us, shard_id)


# --- fitting records to a page layout (executor) ------------------------------------------------


def fit_records(records: Sequence[Record], columns: Sequence[tuple[str, pa.DataType]],
                mode: NumberMode) -> Sequence[Record]:
    """Numbers shaped for the page's columns (``TunnelService.read_page``, executor).

    A number bound for a ``double`` column becomes a float, one for a ``decimal`` column a
    ``Decimal``; numbers that end up in JSON text (``_before``, ``_extra``) become JSON numbers
    (integers stay exact). With ``numbers=double`` and no decimal column nothing changes.
    """
    floats = {n for n, t in columns if pa.types.is_floating(t)}
    decimals = {n for n, t in columns if pa.types.is_decimal(t)}
    if mode == "double" and not decimals:
        return records

    def fit(values: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(values)
        for k, v in values.items():
            if isinstance(v, Decimal):
                out[k] = float(v) if k in floats else v if k in decimals \
                    else _json_number(str(v))
            elif isinstance(v, float) and k in decimals:
                out[k] = Decimal(repr(v))
        return out

    def for_json(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if values is None:
            return None
        return {k: _json_number(str(v)) if isinstance(v, Decimal) else v
                for k, v in values.items()}

    return [replace(r, primary_key=fit(r.primary_key), columns=fit(r.columns),
                    before=for_json(r.before)) for r in records]


__all__ = [
    "MAX_DEPTH",
    "SEQUENCE_DIGITS",
    "AttributeValueError",
    "NumberMode",
    "Position",
    "after_token",
    "decode_item",
    "decode_record",
    "decode_value",
    "fit_records",
    "horizon_token",
    "padded",
    "parse_token",
    "start_token",
]
