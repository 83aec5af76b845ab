"""Wire records -> the product's ``Record``: a ReadRecords page decoded on an executor.

``decode_page(records, channel_id, token, base_offset)`` turns the protobuf ``Record`` list of
one ``ReadRecordsResponse`` into ``connector.tunnel.base.Record`` objects:

- ``PUT_ROW``: ``columns`` is the new row (every PUT cell); ``UPDATE_ROW``: the changed cells,
  a ``DELETE_ONE_VERSION`` / ``DELETE_ALL_VERSION`` cell becoming ``None``; ``DELETE_ROW``: no
  columns. ``before`` is the decoded ``origin_record`` when the service sent one, else ``None``.
- ``sequence``: a stream record's ``SequenceInfo`` as ``%08x:%016x:%08x`` (epoch, timestamp,
  row index), which sorts like the tuple. A base-data record has no sequence info; it gets
  ``"!"`` + its position in the channel as 16 hex digits when the token tells the position,
  else ``"!"`` + an order-preserving encoding of its primary key (a base channel is a key-order
  scan). ``"!"`` sorts before every hex digit, so base records sort before the stream.
- ``commit_ts_us``: the sequence timestamp, taken as microseconds (an assumption: a value
  outside 2000..2200 read that way is refused as malformed); for a base record the newest cell
  timestamp (milliseconds, x1000), else 0.

Anything that does not decode -- bad PlainBuffer, a record without a key, an unknown action, a
stream record without sequence info next to ones with it -- raises ``MalformedRecordError``
naming the channel and the token the page was read from: never a wrong row.

The work is split per record (``decode_one`` returns plain tuples) so a columnar page builder
can reuse it without going through ``Record`` objects.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from connector.errors import MalformedRecordError
from connector.tunnel.base import Op, Record
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.plainbuffer import CellOp, PlainBufferError, decode_row

_ACTIONS = {
    m.ACTION_PUT_ROW: Op.PUT, m.ACTION_UPDATE_ROW: Op.UPDATE, m.ACTION_DELETE_ROW: Op.DELETE,
}
BASE_PREFIX = "!"

#: plausible commit times in microseconds since the epoch: 2000-01-01 .. 2200-01-01
_MIN_TS_US, _MAX_TS_US = 946_684_800_000_000, 7_258_118_400_000_000

Decoded = tuple[Op, dict[str, Any], dict[str, Any], dict[str, Any] | None, str | None, int]


def key_order_string(primary_key: Sequence[tuple[str, Any]]) -> str:
    """An encoding of a key that sorts like Tablestore's key order: per column, integers as
    offset-binary hex (16 digits), strings and binaries as the hex of their bytes, columns
    joined by ``"!"`` (below every hex digit, so a shorter value sorts first)."""
    parts = []
    for _, value in primary_key:
        if isinstance(value, bool):  # not a key type; keep it total anyway
            parts.append(f"{int(value):02x}")
        elif isinstance(value, int):
            parts.append(f"{value + 2**63:016x}")
        elif isinstance(value, str):
            parts.append(value.encode("utf-8").hex())
        elif isinstance(value, bytes):
            parts.append(value.hex())
        else:
            parts.append(struct.pack(">d", float(value)).hex())
    return "!".join(parts)


def decode_one(wire: Any) -> Decoded:
    """One wire ``Record`` -> (op, key, columns, before, sequence-or-None, commit_ts_us).
    Raises ``PlainBufferError`` or ``ValueError`` on malformed input."""
    op = _ACTIONS.get(wire.action_type)
    if op is None:
        raise ValueError(f"unknown action type {wire.action_type}")
    row = decode_row(wire.record)
    pk = dict(row.primary_key)
    if len(pk) != len(row.primary_key):
        raise ValueError("a key column appears twice")
    columns: dict[str, Any] = {}
    if op is not Op.DELETE:
        for cell in row.cells:
            if cell.op is CellOp.PUT:
                columns[cell.name] = cell.value
            elif cell.op is CellOp.INCREMENT:
                raise ValueError(f"column {cell.name!r}: an INCREMENT cell in a change record")
            elif op is Op.PUT:
                raise ValueError(f"column {cell.name!r}: a delete cell in a PUT_ROW record")
            else:
                columns[cell.name] = None
    before: dict[str, Any] | None = None
    if wire.HasField("origin_record"):
        origin = decode_row(wire.origin_record, allow_empty_pk=True)
        before = {c.name: c.value for c in origin.cells if c.op is CellOp.PUT}
    if row.sequence is not None:
        return op, pk, columns, before, row.sequence.sortable(), row.sequence.timestamp
    ts_ms = max((c.timestamp_ms for c in row.cells if c.timestamp_ms is not None), default=0)
    return op, pk, columns, before, None, ts_ms * 1000


def decode_page(
    records: Sequence[Any], channel_id: str, token: str, base_offset: int | None
) -> list[Record]:
    """Decode one page (executor). ``base_offset``: how many records of the channel precede
    the page, when the token tells it (base-data sequences); ``None`` if unknown."""
    out: list[Record] = []
    with_seq = 0
    for i, wire in enumerate(records):
        try:
            op, pk, columns, before, sequence, ts = decode_one(wire)
        except (PlainBufferError, ValueError) as exc:
            raise MalformedRecordError(channel_id=channel_id, token=token,
                                       reason=f"record #{i}: {exc}") from None
        if sequence is not None and not _MIN_TS_US <= ts <= _MAX_TS_US:
            # the timestamp's unit is an assumption (microseconds): a wrong guess would give
            # 1970 (milliseconds) or the far future (nanoseconds) -- refuse, do not mislabel
            raise MalformedRecordError(
                channel_id=channel_id, token=token,
                reason=f"record #{i}: sequence timestamp {ts} is not microseconds since the "
                "epoch between 2000 and 2200")
        if sequence is None:
            if base_offset is not None:
                sequence = f"{BASE_PREFIX}{base_offset + i + 1:016x}"
            else:
                sequence = BASE_PREFIX + key_order_string(tuple(pk.items()))
        else:
            with_seq += 1
        out.append(Record(op, pk, columns, before, sequence, ts, channel_id))
    if 0 < with_seq < len(out):
        raise MalformedRecordError(channel_id=channel_id, token=token,
                                   reason="a page mixes records with and without sequence info")
    for a, b in zip(out, out[1:], strict=False):
        if with_seq and not a.sequence < b.sequence:  # stream records only: by contract
            raise MalformedRecordError(
                channel_id=channel_id, token=token,
                reason=f"sequences do not increase within the page ({a.sequence} then "
                f"{b.sequence})")
    return out
