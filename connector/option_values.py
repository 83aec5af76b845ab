"""The values of the source's options that are not plain integers or names (pure functions).

``SourceOptions`` (``connector/options.py``) calls these in its validators, on the driver when
``load()`` and the query's start check the options; each raises ``ValueError`` saying what is
wrong, which becomes an ``OptionError`` naming the option.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

#: what ``startingTimestamp`` / ``endingTimestamp`` accept
TIMESTAMP_ALLOWED = ("milliseconds since the epoch (1767225600000) or ISO-8601 with a zone "
                     "(2026-01-01T00:00:00Z, 2026-01-01T08:00:00+08:00)")
#: Kafka's default ``maxTriggerDelay`` (15 minutes)
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                      "d": 86_400_000}
_BYTE_UNITS = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3,
               "gb": 1024**3, "t": 1024**4, "tb": 1024**4}

#: the vendor catalog's type names -> Tablestore's
CATALOG_TYPES = {
    "string": "STRING", "long": "INTEGER", "int": "INTEGER", "integer": "INTEGER",
    "bigint": "INTEGER", "double": "DOUBLE", "float": "DOUBLE", "boolean": "BOOLEAN",
    "bool": "BOOLEAN", "binary": "BINARY",
}


def parse_bool(value: Any) -> Any:
    """``true`` / ``false`` in any case (and surrounding spaces); other values as given."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ValueError("not a boolean")
    return value


def parse_timestamp_ms(text: str) -> int:
    """``startingTimestamp`` / ``endingTimestamp``: milliseconds since the epoch, or ISO-8601
    with a zone (``Z`` or ``+hh:mm``); ``ValueError`` otherwise (a time without a zone would
    mean a different instant on every machine)."""
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit():  # not "١٢٣": int() reads any script's digits
        return int(stripped)
    try:
        when = dt.datetime.fromisoformat(stripped)
    except ValueError:
        raise ValueError("is neither milliseconds since the epoch nor an ISO-8601 "
                         "timestamp") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError("has no zone (add Z or an offset such as +08:00)")
    try:
        millis = round(when.timestamp() * 1000)
    except (OverflowError, ValueError):  # 0001-01-01 at +01:00 is before year 1 in UTC
        raise ValueError("is out of range") from None
    if millis < 0:
        raise ValueError("is before 1970-01-01T00:00:00Z")
    return millis


def parse_duration_ms(text: str) -> int:
    """``maxTriggerDelay``: Spark's duration strings (``15m``, ``30s``, ``500ms``, ``1h``,
    ``2d``; a bare number is milliseconds) as milliseconds; ``ValueError`` otherwise."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in ("", *_DURATION_UNITS_MS):
        raise ValueError("is not a duration")
    return int(match.group(1)) * _DURATION_UNITS_MS.get(match.group(2), 1)


def parse_bytes(text: str) -> int:
    """``maxBytesPerTrigger``: a number of bytes, with an optional binary unit (``k``/``kb``,
    ``m``/``mb``, ``g``/``gb``, ``t``/``tb``, any case); ``ValueError`` otherwise."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in ("", *_BYTE_UNITS):
        raise ValueError("is not a number of bytes")
    return int(match.group(1)) * _BYTE_UNITS.get(match.group(2), 1)


def parse_catalog(text: str) -> tuple[tuple[str, str], ...]:
    """The vendor's ``catalog`` JSON -> ((column, Tablestore type), ...). ``ValueError`` with
    what is wrong (it becomes an ``OptionError`` naming ``catalog``)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    except RecursionError:  # the catalog is 3 levels deep; json recurses per level
        raise ValueError("not JSON this reader takes (nested past Python's recursion "
                         "limit)") from None
    columns = doc.get("columns") if isinstance(doc, dict) else None
    if not isinstance(columns, dict) or not columns:
        raise ValueError('expected {"columns": {"name": {"type": ...}, ...}} with columns')
    out = []
    for name, spec in columns.items():
        typ = spec.get("type") if isinstance(spec, dict) else None
        if not isinstance(typ, str) or typ.strip().lower() not in CATALOG_TYPES:
            raise ValueError(f"column {name!r}: type {typ!r} is not one of "
                             + ", ".join(sorted(CATALOG_TYPES)))
        if not name or name.startswith("_"):
            raise ValueError(f"column {name!r}: names starting with '_' are the source's own")
        out.append((name, CATALOG_TYPES[typ.strip().lower()]))
    return tuple(out)


__all__ = ["CATALOG_TYPES", "DEFAULT_MAX_TRIGGER_DELAY_MS", "TIMESTAMP_ALLOWED", "parse_bool",
           "parse_bytes", "parse_catalog", "parse_duration_ms", "parse_timestamp_ms"]
