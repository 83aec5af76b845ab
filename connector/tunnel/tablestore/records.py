"""Wire records -> a page batch or ``Record`` objects: a ReadRecords page decoded on an executor.

``decode_columns(records, channel_id, token, base_offset, layout)`` turns the protobuf
``Record`` list of one ``ReadRecordsResponse`` straight into the page batch the reader hands to
Spark (``connector.tunnel.page``; the client's ``read_page``); ``decode_page(records,
channel_id, token, base_offset)`` into ``connector.tunnel.base.Record`` objects (the client's
``read_records``). Both decode the same way:

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

Anything that does not decode -- bad PlainBuffer (a cell timestamp after the year 9999
included), a record without a key, a key holding a placeholder (INF_MIN, INF_MAX,
AUTO_INCREMENT: a range read's bounds, no row's value), an unknown action, a stream record
without sequence info next to ones with it -- raises ``MalformedRecordError`` naming the
channel, the token the page was read from and the record's index in the page: never a wrong
row, never pyarrow's or Python's own error. A value of another type than its declared column is
not malformed (attributes are schemaless): it is kept in ``_extra`` with its own type
(``connector.tunnel.page.layout_arrays``).

``decode_columns`` has two implementations giving the same batch and the same errors: the
compiled decoder (``columnar``: C, PlainBuffer straight into Arrow buffers), used when it is
installed, and ``decode_columns_python``, the fallback and reference: per record
``decode_one`` returns plain tuples (``plainbuffer.decode_raw``: no ``Row`` or ``Cell``
objects), then it builds the after-image row and the JSON texts exactly as ``records_to_page``
does from ``Record`` objects, so both read paths give the same batch
(``tests/test_tablestore_columnar.py``, ``tests/test_decoders.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from connector.errors import MalformedRecordError
from connector.tunnel.base import Op, Record
from connector.tunnel.page import ENCODE_JSON, PageLayout, layout_arrays, page_schema
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.columnar import RawRecords, decode_compiled
from connector.tunnel.tablestore.plainbuffer import CellOp, PlainBufferError, Special, decode_raw

_ACTIONS = {
    m.ACTION_PUT_ROW: Op.PUT, m.ACTION_UPDATE_ROW: Op.UPDATE, m.ACTION_DELETE_ROW: Op.DELETE,
}
BASE_PREFIX = "!"

#: plausible commit times in microseconds since the epoch: 2000-01-01 .. 2200-01-01
_MIN_TS_US, _MAX_TS_US = 946_684_800_000_000, 7_258_118_400_000_000

_INCREMENT = int(CellOp.INCREMENT)

#: one decoded record: (op, key, columns, before, sequence or None, commit_ts_us)
Decoded = tuple[Op, dict[str, Any], dict[str, Any], dict[str, Any] | None, str | None, int]
#: the same with its sequence assigned (base-data records included)
Sequenced = tuple[Op, dict[str, Any], dict[str, Any], dict[str, Any] | None, str, int]


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
    key, cells, _, seq = decode_raw(wire.record)
    for name, value in key:
        if isinstance(value, Special):  # a range bound (a read's start or end), not a row's
            raise ValueError(f"key column {name!r} holds {value.name}, a placeholder that is "
                             "not a value")
    pk = dict(key)
    if len(pk) != len(key):
        raise ValueError("a key column appears twice")
    columns: dict[str, Any] = {}
    if op is not Op.DELETE:
        for name, value, cell_op, _ts in cells:
            if not cell_op:  # a put
                columns[name] = value
            elif cell_op == _INCREMENT:
                raise ValueError(f"column {name!r}: an INCREMENT cell in a change record")
            elif op is Op.PUT:
                raise ValueError(f"column {name!r}: a delete cell in a PUT_ROW record")
            else:
                columns[name] = None
    before: dict[str, Any] | None = None
    if wire.HasField("origin_record"):
        _, origin, _, _ = decode_raw(wire.origin_record, allow_empty_pk=True)
        before = {name: value for name, value, cell_op, _ts in origin if not cell_op}
    if seq is not None:
        epoch, ts_us, index = seq
        return op, pk, columns, before, f"{epoch:08x}:{ts_us:016x}:{index:08x}", ts_us
    ts_ms = max((c[3] for c in cells if c[3] is not None), default=0)
    return op, pk, columns, before, None, ts_ms * 1000


def _decode_all(records: Sequence[Any], channel_id: str, token: str,
                base_offset: int | None) -> list[Sequenced]:
    """Every record of a page decoded and checked, sequences assigned (see the module
    docstring); ``MalformedRecordError`` at the first problem."""
    out: list[Sequenced] = []
    with_seq = 0
    for i, wire in enumerate(records):
        try:
            op, pk, columns, before, sequence, ts = decode_one(wire)
        except (PlainBufferError, ValueError) as exc:
            raise MalformedRecordError(channel_id=channel_id, token=token,
                                       reason=f"record #{i}: {exc}") from None
        if sequence is None:
            if base_offset is not None:
                sequence = f"{BASE_PREFIX}{base_offset + i + 1:016x}"
            else:
                sequence = BASE_PREFIX + key_order_string(tuple(pk.items()))
        else:
            if not _MIN_TS_US <= ts <= _MAX_TS_US:
                # the timestamp's unit is an assumption (microseconds): a wrong guess would
                # give 1970 (milliseconds) or the far future (nanoseconds) -- refuse, do not
                # mislabel
                raise MalformedRecordError(
                    channel_id=channel_id, token=token,
                    reason=f"record #{i}: sequence timestamp {ts} is not microseconds since "
                    "the epoch between 2000 and 2200")
            with_seq += 1
        out.append((op, pk, columns, before, sequence, ts))
    if 0 < with_seq < len(out):
        raise MalformedRecordError(channel_id=channel_id, token=token,
                                   reason="a page mixes records with and without sequence info")
    if with_seq:  # stream records only: sequences increase by contract
        for a, b in zip(out, out[1:], strict=False):
            if not a[4] < b[4]:
                raise MalformedRecordError(
                    channel_id=channel_id, token=token,
                    reason=f"sequences do not increase within the page ({a[4]} then {b[4]})")
    return out


def decode_page(
    records: Sequence[Any], channel_id: str, token: str, base_offset: int | None
) -> list[Record]:
    """Decode one page into ``Record`` objects (executor, ``read_records``). ``base_offset``:
    how many records of the channel precede the page, when the token tells it (base-data
    sequences); ``None`` if unknown."""
    return [Record(op, pk, columns, before, sequence, ts, channel_id)
            for op, pk, columns, before, sequence, ts
            in _decode_all(records, channel_id, token, base_offset)]


def decode_columns(records: Sequence[Any], channel_id: str, token: str,
                   base_offset: int | None, layout: PageLayout) -> pa.RecordBatch:
    """Decode one page straight into the page batch (executor, ``read_page``): the same batch
    ``records_to_page(decode_page(...), layout)`` builds, without a ``Record`` per record.
    ``records``: protobuf ``Record`` objects, or a ``columnar.RawRecords`` window of a scanned
    answer's bytes (``read_answer``).

    The compiled decoder (``columnar.decode_compiled``) when it is installed and the page is
    one it fills; else the pure-Python one, ``decode_columns_python``. Both give the same
    batch and the same errors."""
    batch = decode_compiled(records, channel_id, token, base_offset, layout)
    if batch is not None:
        return batch
    if isinstance(records, RawRecords):  # a scanned answer: the Python path reads objects
        try:
            records = records.messages()
        except m.MessageError as exc:
            raise MalformedRecordError(channel_id=channel_id, token=token,
                                       reason=str(exc)) from None
    return decode_columns_python(records, channel_id, token, base_offset, layout)


def decode_columns_python(records: Sequence[Any], channel_id: str, token: str,
                          base_offset: int | None, layout: PageLayout) -> pa.RecordBatch:
    """``decode_columns`` in pure Python: the fallback, and the reference the compiled
    decoder is tested against.

    Per record only the row after the change is made (a dict, as ``records_to_page`` makes
    it, so values, nulls and the ``_extra`` JSON are the same); each column is then one list
    and one ``pa.array`` call per page.
    """
    decoded = _decode_all(records, channel_id, token, base_offset)
    names = layout.names()
    rows: list[dict[str, Any]] = []
    extras: list[str | None] = []
    ops: list[str] = []
    befores: list[str | None] = []
    append_row, append_extra = rows.append, extras.append
    append_op, append_before = ops.append, befores.append
    delete, update = Op.DELETE, Op.UPDATE
    for op, pk, columns, before, _sequence, _ts in decoded:
        # the row after the change: key columns + ``Record.after_image()``
        if op is delete:
            values = pk
        elif op is update and before is not None:
            after = {**before, **columns}
            values = dict(pk)
            values.update({k: v for k, v in after.items() if v is not None})
        else:  # PUT, or UPDATE without before-image: the cells as sent
            values = {**pk, **columns}
        append_row(values)
        append_op(op.value)
        append_before(None if before is None else ENCODE_JSON(before))
        if values.keys() <= names:
            append_extra(None)
        else:
            append_extra(ENCODE_JSON({k: v for k, v in values.items() if k not in names}))
    schema = page_schema(layout)
    arrays = layout_arrays(rows, layout, extras, channel_id=channel_id, token=token)
    arrays.append(pa.array(ops, type=pa.string()))
    arrays.append(pa.array([d[4] for d in decoded], type=pa.string()))
    arrays.append(pa.array([d[5] for d in decoded], type=pa.int64())
                  .cast(schema.field("_commit_ts").type))
    arrays.append(pa.array(befores, type=pa.string()))
    arrays.append(pa.array(extras, type=pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
