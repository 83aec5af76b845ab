"""The source driven without Spark: the driver protocol and the executor reader called in
Spark's order, in this process."""

from __future__ import annotations

from connector.protocol import StreamProtocol
from connector.tunnel import Record
from testkit.partition_reads import read_partition


def run_batch(proto: StreamProtocol, start: dict) -> tuple[dict, list[Record]]:
    """One micro-batch in Spark's order: latestOffset -> partitions -> read -> commit (no
    commit when the offset did not move); its end and the records it read."""
    end = proto.latest_offset(start, None)
    records = [r for p in proto.plan(start, end) for r in read_partition(p)]
    if end != start:
        proto.commit(end)
    return end, records


def run_until_caught_up(proto: StreamProtocol, start: dict, max_batches: int = 50
                        ) -> tuple[dict, list[Record]]:
    """Batches in Spark's order until ``latestOffset`` returns its start (the run is done)."""
    seen: list[Record] = []
    for _ in range(max_batches):
        end, records = run_batch(proto, start)
        if end == start:
            return start, seen
        seen += records
        start = end
    raise AssertionError(f"the run did not end within {max_batches} batches")
