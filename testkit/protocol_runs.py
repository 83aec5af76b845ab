"""The source driven without Spark: the driver protocol and the executor reader called in
Spark's order, in this process."""

from __future__ import annotations

from connector.protocol import StreamProtocol
from connector.reader import read_partition
from connector.tunnel import Record


def run_until_caught_up(proto: StreamProtocol, start: dict, max_batches: int = 50
                        ) -> tuple[dict, list[Record]]:
    """Batches in Spark's order until ``latestOffset`` returns its start (the run is done)."""
    seen: list[Record] = []
    for _ in range(max_batches):
        end = proto.latest_offset(start, None)
        if end == start:
            return start, seen
        seen += [r for p in proto.plan(start, end) for r in read_partition(p)]
        proto.commit(end)
        start = end
    raise AssertionError(f"the run did not end within {max_batches} batches")
