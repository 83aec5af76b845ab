"""Targets built from a real change stream, for the reconcile tests: no Spark.

``apply_stream`` opens the table's tunnel service (any backend: the embedded store, the
emulator over the wire, DynamoDB Streams on moto), reads the whole change stream through a
tunnel of its own, parents before children (a channel read to its end is checkpointed
``FINISHED`` so its children open), and applies it with a real apply sink
(``tablestore_cdc.lakehouse``) in batches of the source's output layout
(``connector.tunnel.page.records_to_page`` plus ``_channel_id``), as the source delivers them.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa

from connector.tunnel import FINISHED, ChannelStatus, Checkpoint, Record, open_tunnel_service
from connector.tunnel.page import PageLayout, records_to_page


def apply_stream(tunnel_uri: str, table: str, sink: Any, *, tunnel_name: str | None = None,
                 batch_records: int = 100, app_id: str = "build-query",
                 layout: PageLayout | None = None) -> int:
    """Apply every change of ``table`` with ``sink`` through a new tunnel (``tunnel_name``,
    default a fresh one); returns the batches applied."""
    tunnel_name = tunnel_name or f"build-{uuid.uuid4().hex[:8]}"
    with open_tunnel_service(tunnel_uri) as tunnel:
        schema = tunnel.table_schema(table)
        keys = tuple(c.name for c in schema.primary_key)
        layout = layout or PageLayout.of_table(schema)
        tunnel_id = tunnel.ensure_tunnel(table, tunnel_name).tunnel_id
        pending: list[pa.Table] = []
        batches = 0
        done: set[str] = set()
        while True:
            channels = [c for c in tunnel.describe_tunnel(table, tunnel_name).channels
                        if c.status is ChannelStatus.OPEN and c.channel_id not in done]
            if not channels:
                break
            for channel in channels:
                records, finished = _read_channel(tunnel, tunnel_id, channel.channel_id)
                for start in range(0, len(records), batch_records):
                    page = pa.Table.from_batches([records_to_page(
                        records[start:start + batch_records], layout)])
                    pending.append(page.append_column(
                        pa.field("_channel_id", pa.string(), False),
                        pa.array([channel.channel_id] * page.num_rows)))
                    if sum(p.num_rows for p in pending) >= batch_records:
                        sink.apply(pa.concat_tables(pending), app_id, batches, keys)
                        batches, pending = batches + 1, []
                if finished:
                    tunnel.checkpoint(tunnel_id, channel.channel_id,
                                      Checkpoint(FINISHED, len(records) + 1))
                    done.add(channel.channel_id)
                else:
                    done.add(channel.channel_id)  # open: read to its head
        if pending:
            sink.apply(pa.concat_tables(pending), app_id, batches, keys)
            batches += 1
    return batches


def _read_channel(tunnel: Any, tunnel_id: str, channel_id: str) -> tuple[list[Record], bool]:
    token = tunnel.get_checkpoint(tunnel_id, channel_id).token
    records: list[Record] = []
    while token != FINISHED:
        result = tunnel.read_records(tunnel_id, channel_id, token, 500)
        records += result.records
        token = result.next_token
        if not result.records and not result.may_more:
            break
    return records, token == FINISHED
