"""The throughput baseline: a trivial Python streaming source, ``format("bench_trivial")``.

It yields Arrow record batches of exactly the row shape ``format("tablestore")`` produces for
the benchmark table (same Spark schema, built with ``connector.schema.output_schema``; similar
values: a 13-character name, integers, a 20-digit sequence, 10 % deletes, a before-image JSON on
the share of rows option ``before_share`` gives) and the same batch/partition structure: option
``channel_rows`` lists the rows each "channel" holds, ``max_per_partition`` caps a partition like
``maxOffsetsPerChannel`` does, so batch ``b`` has one partition per channel with rows left, each
of ``min(max_per_partition, rows left)`` rows.

Reading does no work per row: each Python worker builds one 8,192-row template batch (the size
``RecordBatchBuilder`` uses) once and yields slices of it, so its rate is what Spark itself
needs to move Arrow batches from a Python source into the sink: the ceiling any Python source
can reach on this machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from benchmarks.common import COLUMNS, PRIMARY_KEY, TABLE
from connector.schema import output_schema
from connector.tunnel.base import ColumnSpec, TableSchema

#: rows per yielded Arrow batch, as in ``connector.schema.RecordBatchBuilder``
BATCH_ROWS = 8192

_TEMPLATE: dict[tuple[str, int], pa.RecordBatch] = {}


def bench_schema() -> StructType:
    """The Spark schema ``format("tablestore")`` gives the benchmark table."""
    table = TableSchema(TABLE, tuple(ColumnSpec(n, t) for n, t in PRIMARY_KEY),
                        tuple(ColumnSpec(n, t) for n, t in COLUMNS))
    return output_schema(table)


def template_batch(schema: StructType, before_percent: int) -> pa.RecordBatch:
    """One ``BATCH_ROWS``-row batch of benchmark-shaped values (built once per process)."""
    key = (schema.json(), before_percent)
    if key not in _TEMPLATE:
        arrow_schema = to_arrow_schema(schema, timezone="UTC")
        n = BATCH_ROWS
        ts = datetime(2026, 1, 1, tzinfo=UTC)
        before = [json.dumps({"name": f"name-{i:08d}", "qty": i}, sort_keys=True,
                             separators=(",", ":")) if i % 100 < before_percent else None
                  for i in range(n)]
        columns = {
            "id": list(range(n)),
            "name": [None if i % 10 == 9 else f"name-{i:08d}" for i in range(n)],
            "qty": [None if i % 10 == 9 else i for i in range(n)],
            "_op": [("DELETE" if i % 10 == 9 else "UPDATE" if i % 10 in (3, 6) else "PUT")
                    for i in range(n)],
            "_channel_id": ["ch-0000"] * n,
            "_sequence": [f"{i + 1:020d}" for i in range(n)],
            "_commit_ts": [ts] * n,
            "_before": before,
            "_extra": [None] * n,
        }
        arrays = [pa.array(columns[f.name], type=f.type) for f in arrow_schema]
        _TEMPLATE[key] = pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
    return _TEMPLATE[key]


@dataclass(frozen=True)
class TrivialPartition(InputPartition):
    rows: int


def batch_plan(channel_rows: Sequence[int], max_per_partition: int) -> list[list[int]]:
    """Rows per partition of each batch, as the tablestore source would cut the channels."""
    left = list(channel_rows)
    batches: list[list[int]] = []
    while any(left):
        batch = [min(max_per_partition, n) for n in left if n > 0]
        left = [n - min(max_per_partition, n) for n in left]
        batches.append(batch)
    return batches


class TrivialDataSource(DataSource):
    """``spark.readStream.format("bench_trivial").option("channel_rows", "10,12")``"""

    @classmethod
    def name(cls) -> str:
        return "bench_trivial"

    def schema(self) -> StructType:
        return bench_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        rows = [int(x) for x in self.options["channel_rows"].split(",")]
        cap = int(self.options.get("max_per_partition", max(rows)))
        before_percent = round(100 * float(self.options.get("before_share", "0.3")))
        return TrivialStreamReader(schema, batch_plan(rows, cap), before_percent)


class TrivialStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are batch numbers; batch ``b`` covers ``plan[b]``."""

    def __init__(self, schema: StructType, plan: list[list[int]], before_percent: int) -> None:
        self.schema = schema
        self.plan = plan
        self.before_percent = before_percent

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"batch": min(start["batch"] + 1, len(self.plan))}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [TrivialPartition(rows) for b in range(start["batch"], end["batch"])
                for rows in self.plan[b]]

    def commit(self, end: dict) -> None:
        pass

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # the plan is fixed: nothing arrives later

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TrivialPartition)
        template = template_batch(self.schema, self.before_percent)
        left = partition.rows
        while left > 0:
            n = min(left, BATCH_ROWS)
            yield template if n == BATCH_ROWS else template.slice(0, n)
            left -= n
