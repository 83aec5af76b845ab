"""PlainBuffer in the table API's requests and replies: the connector's codec with the service's
error answer.

Called by ``table_api`` (the server's connection threads). The rows a request carries are read
by ``connector.tunnel.tablestore.plainbuffer`` -- the executors' decoder, with every check it
makes, checksums included (every SDK writes them) -- and anything malformed is answered as the
service does: 400 ``OTSParameterInvalid`` "Invalid PlainBuffer: <what and where>.". A row
without key cells is read here: the table API answers a key of the wrong size in the service's
own words. Replies are written by the same codec (the SDK's writer gives the same bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

from connector.tunnel.tablestore.plainbuffer import (
    HEADER,
    Cell,
    PlainBufferError,
    Row,
    decode_row,
    decode_value,
    encode_row,
)
from connector.tunnel.tablestore.plainbuffer import VT_STRING as VT_STRING
from tablestore_emulator.errors import OtsError, parameter_invalid


def _invalid(exc: Exception) -> OtsError:
    return parameter_invalid(f"Invalid PlainBuffer: {exc}.")


def read_row(data: bytes) -> Row:
    """Decode one PlainBuffer row (a request's ``row``, ``row_change`` or ``primary_key``)."""
    try:
        return decode_row(data, allow_empty_pk=True)
    except PlainBufferError as exc:
        raise _invalid(exc) from None


def read_value(data: bytes) -> Any:
    """Decode a bare value (type byte + payload: a column condition's ``column_value``), read
    as a cell's value is."""
    try:
        return decode_value(data, "column_value")
    except PlainBufferError as exc:
        raise _invalid(exc) from None


def write_row(
    primary_key: Sequence[tuple[str, Any]],
    columns: Iterable[tuple[str, Any]] = (),
    timestamp_ms: int | None = None,
) -> bytes:
    """Encode a row (key and attributes, each attribute stamped ``timestamp_ms``)."""
    cells = tuple(Cell(name, value, timestamp_ms=timestamp_ms) for name, value in columns)
    return encode_row(Row(tuple(primary_key), cells))


def write_rows(rows: Iterable[bytes]) -> bytes:
    """Concatenate encoded rows under one header (GetRange's ``rows``)."""
    parts = [r[4:] for r in rows]
    if not parts:
        return b""
    return struct.pack("<I", HEADER) + b"".join(parts)
