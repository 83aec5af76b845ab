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
        if self.kind == "S":
            return {"ShardIteratorType": "AT_SEQUENCE_NUMBER",
                    "SequenceNumber": self.sequence_number}
        if self.kind == "A":
            return {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                    "SequenceNumber": self.sequence_number}
        return {"ShardIteratorType": "TRIM_HORIZON"}


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


def _number(text: str, mode: NumberMode) -> Any:
    return Decimal(text) if mode == "decimal" else float(text)


def _json_number(text: str) -> Any:
    """A number inside JSON text: exact integers stay integers, others become floats."""
    value = Decimal(text)
    return int(value) if value == value.to_integral_value() and "e" not in text.lower() \
        else float(value)


def _plain(value: Mapping[str, Any]) -> Any:
    """A typed attribute value as plain JSON-able Python (for M/L/sets inside JSON text)."""
    ((tag, inner),) = value.items()
    if tag == "S":
        return inner
    if tag == "N":
        return _json_number(inner)
    if tag == "B":
        return {"$binary": base64.b64encode(_bytes(inner)).decode()}
    if tag == "BOOL":
        return bool(inner)
    if tag == "NULL":
        return None
    if tag == "M":
        return {k: _plain(v) for k, v in inner.items()}
    if tag == "L":
        return [_plain(v) for v in inner]
    if tag == "SS":
        return sorted(inner)
    if tag == "NS":
        return sorted((_json_number(n) for n in inner), key=float)
    if tag == "BS":
        encoded = sorted(base64.b64encode(_bytes(b)).decode() for b in inner)
        return [{"$binary": b} for b in encoded]
    raise ValueError(f"unknown DynamoDB type {tag!r}")


def _bytes(inner: Any) -> bytes:
    # boto3 hands binary values over as bytes; raw JSON (a fake, a test) as base64 text
    return bytes(inner) if isinstance(inner, bytes | bytearray) else base64.b64decode(inner)


_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def decode_value(value: Mapping[str, Any], mode: NumberMode = "double") -> Any:
    """One typed attribute value (``{"S": "x"}``) as a plain Python value.

    S -> str, N -> float (or Decimal with ``mode="decimal"``), B -> bytes, BOOL -> bool,
    NULL -> None; M, L, SS, NS, BS -> compact JSON text with sorted keys (sets sorted; numbers
    as JSON numbers; binary as ``{"$binary": base64}``, as the ``_extra`` column writes it).
    """
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ValueError(f"not a typed DynamoDB value: {value!r}")
    ((tag, inner),) = value.items()
    if tag == "S":
        return str(inner)
    if tag == "N":
        return _number(str(inner), mode)
    if tag == "B":
        return _bytes(inner)
    if tag == "BOOL":
        return bool(inner)
    if tag == "NULL":
        return None
    if tag in ("M", "L", "SS", "NS", "BS"):
        return _JSON(_plain(value))
    raise ValueError(f"unknown DynamoDB type {tag!r}")


def decode_item(item: Mapping[str, Any] | None, mode: NumberMode = "double",
                skip: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    if item is None:
        return None
    return {name: decode_value(v, mode) for name, v in item.items() if name not in skip}


# --- records -----------------------------------------------------------------------------------

_OPS = {"INSERT": Op.PUT, "MODIFY": Op.UPDATE, "REMOVE": Op.DELETE}


def _micros(when: Any) -> int:
    if isinstance(when, datetime):
        return int(when.timestamp() * 1_000_000)
    return int(float(when) * 1_000_000)  # epoch seconds in raw JSON


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

    A record that cannot be decoded raises ``MalformedRecordError``: never a wrong row.
    """
    try:
        ddb = raw["dynamodb"]
        op = _OPS[raw["eventName"]]
        keys = decode_item(ddb["Keys"], mode) or {}
        key_names = frozenset(keys)
        new = decode_item(ddb.get("NewImage"), mode, key_names)
        old = decode_item(ddb.get("OldImage"), mode, key_names)
        seq = str(ddb["SequenceNumber"])
        if not _SEQ.match(seq):
            raise ValueError(f"bad sequence number {seq!r}")
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
    "SEQUENCE_DIGITS",
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
