"""``snapshot.op`` without Spark: the option's values, and ``mark_snapshot_reads`` relabelling
only the base-data PUT rows a backend points out (docs/schema.md, "Snapshot rows")."""

from __future__ import annotations

import pyarrow as pa
import pytest

from connector.errors import OptionError
from connector.options import SourceOptions
from connector.schema import mark_snapshot_reads

BATCH = pa.RecordBatch.from_pydict({
    "id": [1, 2, 3],
    "_op": ["PUT", "PUT", "DELETE"],
    "_sequence": ["!0000000000000001", "00000001:0000000000000002:00000000",
                  "00000001:0000000000000003:00000000"],
})


def options(**extra: str) -> SourceOptions:
    return SourceOptions.from_spark({"endpoint": "local:///tmp/s.db", "table.name": "t",
                                     "tunnel.name": "q", **extra})


def test_the_option_defaults_to_put_and_takes_read_in_any_case() -> None:
    assert options().snapshot_op == "PUT"
    assert options(**{"snapshot.op": " read "}).snapshot_op == "READ"
    with pytest.raises(OptionError, match=r"option 'snapshot.op'.*got 'r'.*allowed: PUT or READ"):
        options(**{"snapshot.op": "r"})


def test_only_the_marked_put_rows_become_reads() -> None:
    marked = pa.array([True, False, True])  # a base row, a stream PUT, a (stream) DELETE
    assert mark_snapshot_reads(BATCH, marked).column("_op").to_pylist() == [
        "READ", "PUT", "DELETE"]
    assert mark_snapshot_reads(BATCH, True).column("_op").to_pylist() == [
        "READ", "READ", "DELETE"]
    assert mark_snapshot_reads(BATCH, False) is BATCH
    without_op = BATCH.drop_columns(["_op"])
    assert mark_snapshot_reads(without_op, True) is without_op
    assert mark_snapshot_reads(BATCH, marked).schema == BATCH.schema


def test_the_backends_point_out_their_base_data() -> None:
    from connector.tunnel.dynamodb_streams.service import DynamoDbStreamsTunnelService
    from connector.tunnel.local.service import LocalTunnelService
    from connector.tunnel.tablestore.reading import TablestoreReading

    sequences = BATCH.column("_sequence")
    # the methods read neither the client nor the service: only the channel and the rows
    assert LocalTunnelService.snapshot_rows(None, "base-ch-0", sequences) is True  # type: ignore[arg-type]
    assert LocalTunnelService.snapshot_rows(None, "ch-0", sequences) is False  # type: ignore[arg-type]
    assert TablestoreReading.snapshot_rows(None, "c", sequences).to_pylist() == [  # type: ignore[arg-type]
        True, False, False]
    assert DynamoDbStreamsTunnelService.snapshot_rows(None, "shard", sequences) is False  # type: ignore[arg-type]
