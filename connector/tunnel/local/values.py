"""Values in a local store file: checked against their declared types, stored as JSON.

Called by the row API when it validates a write (writer process: ``check_value``,
``dumps_values``, ``key_hash``) and by the change log's readers when they decode records
(driver and executors: ``loads_values``, ``decode_value``, ``sequence_str``).

The encoding is part of the file format (tests/test_local_store_format.py): a row's key and its
attribute columns are each one canonical JSON object (sorted keys, compact); JSON has no bytes,
so a bytes value is the one-key object ``{"$b": base64}`` (only ever a value, never a row). A
key's place in the hash space is the blake2b of its canonical JSON.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from connector.errors import InvalidRowError

#: Tablestore's type names -> the Python types a value of that type may have.
COLUMN_TYPES = ("INTEGER", "DOUBLE", "BOOLEAN", "STRING", "BINARY")
#: Tablestore allows only these as primary-key column types.
KEY_TYPES = ("INTEGER", "STRING", "BINARY")

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

#: how ``dumps_values`` marks bytes in stored JSON (``"$b"`` inside a string value would be
#: escaped, so this text appears in a stored object only where it holds bytes)
BYTES_MARK = '{"$b":'


def _enc(value: Any) -> Any:
    # JSON has no bytes; a one-key object marks them (only ever a value, never a row).
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode("ascii")}
    return value


def decode_value(value: Any) -> Any:
    """One value as ``json.loads`` gave it back: bytes for a bytes marker, else itself."""
    if isinstance(value, dict):
        return base64.b64decode(value["$b"])
    return value


#: ``json.dumps(..., sort_keys=True, separators=(",", ":"))`` without making an encoder per
#: call (a write makes up to three)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def dumps_values(values: Mapping[str, Any]) -> str:
    """Canonical JSON of a column -> value mapping (sorted keys, bytes as base64)."""
    return _CANONICAL.encode({k: _enc(v) for k, v in values.items()})


def loads_values(text: str) -> dict[str, Any]:
    """Inverse of ``dumps_values``."""
    return {k: decode_value(v) for k, v in json.loads(text).items()}


def key_hash(pk_json: str) -> int:
    """The key's position in the hash space [0, 2**32): stable across processes and runs."""
    return int.from_bytes(hashlib.blake2b(pk_json.encode("utf-8"), digest_size=4).digest(), "big")


def sequence_str(seq: int) -> str:
    """``Record.sequence`` of per-channel sequence ``seq`` (sortable as a string)."""
    return f"{seq:020d}"


#: a lone surrogate: a Python string's character that UTF-8 cannot encode
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_value(table: str, column: str, typ: str | None, value: Any, *, key: bool) -> Any:
    """Validate one value against its declared type (``None`` = undeclared attribute); returns
    the value to store (an ``int`` for a DOUBLE becomes ``float``, a bytearray ``bytes``).
    ``InvalidRowError`` names the table, the column and what it expects."""
    kind = "key column" if key else "column"

    def bad(expected: str) -> InvalidRowError:
        return InvalidRowError(
            table=table,
            reason=f"{kind} {column!r} expects {expected}, got {type(value).__name__} {value!r}",
        )

    if isinstance(value, str):
        surrogate = _SURROGATE.search(value)
        if surrogate is not None:  # not UTF-8: no page, no service, no Spark string holds it
            raise bad(f"UTF-8 text (it holds a lone surrogate U+{ord(surrogate.group()):04X} "
                      f"at position {surrogate.start()})")
    if typ is None:  # undeclared attribute: any of the five Tablestore value types
        if isinstance(value, bool | str | float):
            return value
        if isinstance(value, int):
            typ = "INTEGER"
        elif isinstance(value, bytes | bytearray):
            return bytes(value)
        else:
            raise bad("one of int, float, bool, str, bytes")
    if typ == "INTEGER":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("INTEGER (int)")
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise bad("INTEGER within 64 bits")
        return value
    if typ == "DOUBLE":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("DOUBLE (float)")
        return float(value)
    if typ in ("BOOLEAN", "STRING"):
        kind_of = bool if typ == "BOOLEAN" else str
        if not isinstance(value, kind_of):
            raise bad(f"{typ} ({kind_of.__name__})")
        return value
    if typ == "BINARY":
        if not isinstance(value, bytes | bytearray):
            raise bad("BINARY (bytes)")
        return bytes(value)
    raise bad(typ)  # pragma: no cover - schemas are validated at create_table


__all__ = [
    "BYTES_MARK",
    "COLUMN_TYPES",
    "KEY_TYPES",
    "check_value",
    "decode_value",
    "dumps_values",
    "key_hash",
    "loads_values",
    "sequence_str",
]
