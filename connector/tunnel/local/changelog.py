"""The change log (``cdc_changes``): one record per write, per channel, in sequence order.

``cdc_changes`` is the record of truth: the sealed Arrow segments (``segments``) are derived
from it, trimming deletes a prefix of it (``channels.trim``), and verification reads it.

Who calls what, each inside a transaction its caller opened:
- the row API (writer process) appends one record per write, in the write's transaction
  (``append_changes``: a batch of writes in one statement);
- the tunnel service ``read_changes`` past a position (executors, ``read_records``; the
  unsealed tail of a columnar page) and decodes base-data rows with ``records_from_rows``;
  sealing a segment reads the records it seals (writer process);
- tests and harnesses read ``all_changes`` (``LocalTablestore.change_log``) to verify what a
  consumer received.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from connector.gc_pause import gc_paused
from connector.tunnel.base import Op, Record, TableSchema
from connector.tunnel.local.values import BYTES_MARK, decode_value, loads_values, sequence_str

_OPS = {op.value: op for op in Op}


#: one change record to append: (channel id, sequence, op, pk JSON, columns JSON,
#: before-image JSON or None, commit time in microseconds)
NewChange = tuple[str, int, Op, str, str, str | None, int]


def append_changes(conn: sqlite3.Connection, table: str, changes: Sequence[NewChange],
                   heads: Mapping[str, int]) -> None:
    """Inside a write transaction: append ``changes`` (each channel's sequences the next ones
    after its ``head_seq``, 1, 2, 3, ...: the caller allocates them in this transaction, so
    they stay gapless) and move each channel's ``head_seq`` to ``heads[channel]``."""
    conn.executemany(
        "INSERT INTO cdc_changes (table_name, channel_id, seq, op, pk, columns, before, "
        "commit_ts_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(table, ch, seq, op.value, pk, cols, before, ts)
         for ch, seq, op, pk, cols, before, ts in changes],
    )
    conn.executemany(
        "UPDATE cdc_channels SET head_seq = ? WHERE table_name = ? AND channel_id = ?",
        [(head, table, ch) for ch, head in heads.items()],
    )


def read_changes(
    conn: sqlite3.Connection, schema: TableSchema, channel_id: str, after_seq: int, limit: int
) -> list[Record]:
    """Up to ``limit`` records of the channel with sequence > ``after_seq``."""
    rows = conn.execute(
        "SELECT seq, op, pk, columns, before, commit_ts_us FROM cdc_changes "
        "WHERE table_name = ? AND channel_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (schema.table_name, channel_id, after_seq, limit),
    ).fetchall()
    return records_from_rows(schema, channel_id, rows)


#: (channel, seq) pairs asked in one ``commit_times`` query (two parameters each, well within
#: SQLite's limit on a statement's parameters)
_COMMIT_TIMES_CHUNK = 400


def commit_times(conn: sqlite3.Connection, table: str,
                 positions: Mapping[str, int]) -> dict[str, int]:
    """channel id -> the commit time (microseconds) of its record ``positions[channel]``, for
    the records still held (a trimmed or unwritten one is left out): one query per few hundred
    channels, not one per channel (the emulator's DescribeTunnel asks for every channel's)."""
    out: dict[str, int] = {}
    items = list(positions.items())
    for i in range(0, len(items), _COMMIT_TIMES_CHUNK):
        chunk = items[i:i + _COMMIT_TIMES_CHUNK]
        values = ", ".join(["(?, ?)"] * len(chunk))
        rows = conn.execute(
            f"WITH wanted(channel_id, seq) AS (VALUES {values}) "
            "SELECT c.channel_id, c.commit_ts_us FROM wanted w JOIN cdc_changes c "
            "ON c.table_name = ? AND c.channel_id = w.channel_id AND c.seq = w.seq",
            [*(v for pair in chunk for v in pair), table],
        ).fetchall()
        out.update((r[0], int(r[1])) for r in rows)
    return out


def all_changes(conn: sqlite3.Connection, schema: TableSchema) -> list[Record]:
    """Every record still held (not trimmed), channel by channel in creation order, each in
    sequence order, with ``channel_id`` set."""
    rows = conn.execute(
        "SELECT c.channel_id, c.seq, c.op, c.pk, c.columns, c.before, c.commit_ts_us "
        "FROM cdc_changes c JOIN cdc_channels h "
        "ON h.table_name = c.table_name AND h.channel_id = c.channel_id "
        "WHERE c.table_name = ? ORDER BY h.channel_no, c.seq",
        (schema.table_name,),
    ).fetchall()
    return [record_from_row(schema, r[0], r[1:]) for r in rows]


@gc_paused()
def records_from_rows(
    schema: TableSchema, channel_id: str, rows: Sequence[Sequence[Any]]
) -> list[Record]:
    """``[record_from_row(schema, channel_id, r) for r in rows]``, decoded a page at a time.

    Where records are decoded (``read_changes``: the tail past the last sealed segment,
    sealing a segment, ``read_records``; base-data reads): every JSON value of the
    page is parsed by one ``json.loads`` of one array instead of up to three calls per row
    (a call costs more than parsing a small object), bytes markers are decoded only when
    the page contains one, and the cyclic garbage collector is paused meanwhile
    (``gc_paused``). The result is equal to ``record_from_row`` row by row.
    """
    if not rows:
        return []
    text = "[" + ",".join([
        f"{r[2]},{r[3]},{'null' if r[4] is None else r[4]}" for r in rows
    ]) + "]"
    values = json.loads(text)
    if BYTES_MARK in text:  # a marker can only be a value: JSON strings escape quotes
        values = [v if v is None else {k: decode_value(x) for k, x in v.items()}
                  for v in values]
    names = [c.name for c in schema.primary_key]
    # the stored key JSON has sorted keys: already in declared order when that is sorted
    key_in_order = names == sorted(names)
    n_keys = len(names)
    ops = _OPS
    out = []
    it = iter(values)
    for r, pk, columns, before in zip(rows, it, it, it, strict=True):
        if not (key_in_order and len(pk) == n_keys):
            pk = {name: pk[name] for name in names}  # declared order
        op = ops.get(r[1]) or Op(r[1])
        out.append(Record(op, pk, columns, before, sequence_str(r[0]), r[5], channel_id))
    return out


def record_from_row(schema: TableSchema, channel_id: str, r: Sequence[Any]) -> Record:
    """A ``Record`` from ``(seq, op, pk_json, columns_json, before_json|None, ts_us)``."""
    seq, op, pk_json, cols_json, before_json, ts = r
    pk = loads_values(pk_json)
    return Record(
        op=Op(op),
        primary_key={c.name: pk[c.name] for c in schema.primary_key},  # declared order
        columns=loads_values(cols_json),
        before=loads_values(before_json) if before_json is not None else None,
        sequence=sequence_str(seq),
        commit_ts_us=ts,
        channel_id=channel_id,
    )


__all__ = ["NewChange", "all_changes", "append_changes", "read_changes", "record_from_row",
           "records_from_rows"]
