"""A channel's claimed read as ``Record`` objects: tests and the fault harness compare reads
record by record (the product reads pages, ``connector.reader.read_rows``); ``page_to_records``
turns a page back into records."""

from __future__ import annotations

import json

import pyarrow as pa

from connector.clients import executor_clients
from connector.partition import ChannelPartition
from connector.reader import claim_and_read
from connector.tunnel import Op, Record, TableSchema
from connector.tunnel.page import PAGE_METADATA_NAMES, PageLayout, json_value


def read_partition(p: ChannelPartition, table: TableSchema | None = None) -> list[Record]:
    """The claimed records of the partition as ``Record`` objects, channel id set, through the
    same claim as the source's read (``claim_and_read``: the end is recorded in the meta store).
    Values are the declared columns plus undeclared ones; an UPDATE's ``columns`` is the whole
    row after it (see ``page_to_records``). ``table``: the table's schema (None: asked of the
    tunnel)."""
    if table is None:
        tunnel = executor_clients().tunnel(p.endpoint)
        name = next(t.table_name for t in tunnel.list_tunnels() if t.tunnel_id == p.tunnel_id)
        table = tunnel.table_schema(name)
    read = claim_and_read(p, PageLayout.of_table(table))
    return [r for batch in read.batches() for r in page_to_records(batch, table, p.channel_id)]


def page_to_records(batch: pa.RecordBatch, table: TableSchema, channel_id: str) -> list[Record]:
    """Records back from a page batch (never the read path).

    ``primary_key`` is the declared key; ``columns`` is the after image (for an UPDATE the
    whole row after the change, not only the changed columns); ``before`` is decoded JSON.
    """
    keys = [c.name for c in table.primary_key]
    names = [n for n in batch.schema.names if n not in PAGE_METADATA_NAMES]
    out = []
    for row in batch.to_pylist():
        op = Op(row["_op"])
        extra = json.loads(row["_extra"]) if row["_extra"] is not None else {}
        after = {n: row[n] for n in names if n not in keys and row[n] is not None}
        after.update({k: json_value(v) for k, v in extra.items()})
        before = None
        if row["_before"] is not None:
            before = {k: json_value(v) for k, v in json.loads(row["_before"]).items()}
        ts = row["_commit_ts"]
        micros = (int(ts.timestamp()) * 1_000_000 + ts.microsecond) if ts is not None else 0
        out.append(Record(op, {k: row[k] for k in keys}, {} if op is Op.DELETE else after,
                          before, row["_sequence"], micros, channel_id))
    return out
