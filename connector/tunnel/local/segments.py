"""Columnar segments (``cdc_change_segments``): the change log sealed into Arrow batches.

The write that completes ``SEGMENT_RECORDS`` unsealed changes of a channel also stores them as
one Arrow batch, LZ4-compressed Arrow IPC, in the page shape of ``connector.tunnel.page`` with
the table's declared columns (``seal``, in the writer process, inside the write's transaction).
``read_page`` (executors, through ``LocalTunnelService.read_page``) slices a segment instead
of decoding records, so the read path builds no Python object per record. ``cdc_changes``
stays the record of truth; a segment is derived from it in the same transaction, and trimming
deletes the segments inside the trimmed prefix (``channels.trim``).

pyarrow is imported here only when a segment is sealed or a page is built: a writer of a small
store never loads it.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from connector.gc_pause import gc_paused
from connector.tunnel.base import TableSchema
from connector.tunnel.local.changelog import read_changes
from connector.tunnel.local.channels import ChannelRow
from connector.tunnel.local.values import sequence_str

if TYPE_CHECKING:
    import pyarrow as pa

    from connector.tunnel.page import EncodedBatch, PageLayout

#: Records per sealed columnar segment (``cdc_change_segments``).
SEGMENT_RECORDS = 4096


def seal(conn: sqlite3.Connection, schema: TableSchema, channel: ChannelRow, head: int) -> None:
    """Inside the write that appended up to ``head``: seal every complete run of
    ``SEGMENT_RECORDS`` unsealed records of the channel into a columnar segment."""
    (sealed,) = conn.execute(
        "SELECT coalesce(max(last_seq), 0) FROM cdc_change_segments WHERE table_name = ? "
        "AND channel_id = ?",
        (schema.table_name, channel.channel_id),
    ).fetchone()
    sealed = max(sealed, channel.trimmed_upto)  # nothing to seal below the trim point
    if head - sealed < SEGMENT_RECORDS:
        return
    import pyarrow as pa

    from connector.tunnel.page import PageLayout, records_to_page

    layout = PageLayout.of_table(schema)
    lz4 = pa.ipc.IpcWriteOptions(compression="lz4")
    while head - sealed >= SEGMENT_RECORDS:
        records = read_changes(conn, schema, channel.channel_id, sealed, SEGMENT_RECORDS)
        with gc_paused():
            batch = records_to_page(records, layout)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema, options=lz4) as writer:
            writer.write_batch(batch)
        conn.execute(
            "INSERT INTO cdc_change_segments (table_name, channel_id, first_seq, last_seq, "
            "data) VALUES (?, ?, ?, ?, ?)",
            (schema.table_name, channel.channel_id, sealed + 1, sealed + SEGMENT_RECORDS,
             sink.getvalue().to_pybytes()),
        )
        sealed += SEGMENT_RECORDS


def read_page(
    conn: sqlite3.Connection,
    schema: TableSchema,
    channel_id: str,
    after_seq: int,
    limit: int,
    layout: PageLayout,
) -> pa.RecordBatch | EncodedBatch:
    """Inside a transaction: up to ``limit`` records with sequence > ``after_seq`` as one
    page batch (``connector.tunnel.page``) shaped by ``layout`` (executor read path).

    When ``layout`` has the table's declared columns, as the default output schema does,
    and a sealed segment holds ``after_seq + 1``, the page is a slice of that segment,
    returned still encoded (``EncodedBatch``: the compressed bytes, decoded when the page
    is handed on; no per-record work) and ending with the segment, so it may hold fewer
    than ``limit`` records. Records past the last segment, and every record for another
    layout, are decoded and converted."""
    from connector.tunnel.page import (
        PAGE_METADATA,
        EncodedBatch,
        PageLayout,
        empty_page_batch,
        records_to_page,
    )

    if limit and layout.same_columns(PageLayout.of_table(schema)):
        # the segment holding after_seq + 1, found on the index
        rows = _segments(
            conn,
            "SELECT first_seq, last_seq, data FROM cdc_change_segments WHERE table_name = ?1 "
            "AND channel_id = ?2 AND last_seq > ?3 AND first_seq = (SELECT max(first_seq) "
            "FROM cdc_change_segments WHERE table_name = ?1 AND channel_id = ?2 "
            "AND first_seq <= ?3 + 1)",
            (schema.table_name, channel_id, after_seq),
        )
        if rows:
            first, last, data = rows[0]
            # the page ends with the segment (a page may be short); kept compressed until
            # the reader hands it on
            count = min(last - after_seq, limit)
            names = tuple(name for name, _ in layout.columns)
            declared = tuple(c.name for c in (*schema.primary_key, *schema.columns))
            return EncodedBatch(
                data, after_seq + 1 - first, count, sequence_str(after_seq + count),
                None if names == declared else (*names, *(f.name for f in PAGE_METADATA)),
            )
    records = read_changes(conn, schema, channel_id, after_seq, limit)
    if not records:
        return empty_page_batch(layout)
    with gc_paused():
        return records_to_page(records, layout)


def _segments(conn: sqlite3.Connection, query: str, args: tuple[Any, ...]) -> list[Any]:
    try:
        return conn.execute(query, args).fetchall()
    except sqlite3.OperationalError as exc:  # a file from before segments, opened read-only
        if "no such table" in str(exc):
            return []
        raise


__all__ = ["SEGMENT_RECORDS", "read_page", "seal"]
