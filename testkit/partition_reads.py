"""A channel's claimed read as ``Record`` objects: tests and the fault harness compare reads
record by record (the product reads pages, ``connector.reader.read_rows``)."""

from __future__ import annotations

from connector.clients import executor_clients
from connector.partition import ChannelPartition
from connector.reader import claim_and_read
from connector.tunnel import Record, TableSchema
from connector.tunnel.page import PageLayout, page_to_records


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
