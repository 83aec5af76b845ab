"""Apply rate into Delta Lake against a plain append of the same rows, in one run (no Spark).

What is measured: ``batches`` micro-batches of ``batch_size`` changes each, in the source's
output schema (PUT of new keys, UPDATE and DELETE of live ones: 50 / 35 / 15 %), built once.
Then, in this process, timed separately and one after the other:

- **apply**: ``DeltaApplySink.apply`` per batch (order and reduce per key, then one MERGE commit
  with the batch's application transaction) into a new Delta table, SCD type 1;
- **append**: ``deltalake.write_deltalake(mode="append")`` of the very same batches into another
  new table: what the change rows cost to land in Delta at all;
- **iceberg apply** (for reference): ``IcebergApplySink.apply`` per batch (SQL catalog on SQLite).

``ratio`` = apply changes/s / append rows/s. The MERGE rewrites the files holding touched keys
and reads the table, so it falls as the table grows; the figure is for the configured sizes.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), False), pa.field("customer", pa.string()),
    pa.field("amount", pa.float64()), pa.field("status", pa.string()),
    pa.field("_op", pa.string(), False), pa.field("_channel_id", pa.string(), False),
    pa.field("_sequence", pa.string(), False), pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_before", pa.string()), pa.field("_extra", pa.string()),
])


@dataclass(frozen=True)
class LakehouseApplyConfig:
    batches: int = 20
    batch_size: int = 5_000
    iceberg: bool = True


def change_batches(config: LakehouseApplyConfig, seed: int = 5) -> list[pa.Table]:
    """Source-shaped batches over 4 channels, sequences increasing per channel."""
    rng = random.Random(seed)
    live: list[int] = []
    next_id = 0
    sequence = [0, 0, 0, 0]
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    out = []
    for b in range(config.batches):
        rows: list[dict[str, Any]] = []
        for i in range(config.batch_size):
            roll = rng.random()
            if not live or roll < 0.5:
                next_id += 1
                key, op = next_id, "PUT"
                live.append(key)
            elif roll < 0.85:
                key, op = rng.choice(live), "UPDATE"
            else:
                key, op = live.pop(rng.randrange(len(live))), "DELETE"
            channel = key % 4
            sequence[channel] += 1
            deleted = op == "DELETE"
            rows.append({
                "id": key, "customer": None if deleted else f"c{rng.randrange(500)}",
                "amount": None if deleted else round(rng.uniform(1, 500), 2),
                "status": None if deleted else rng.choice(["new", "paid", "shipped"]),
                "_op": op, "_channel_id": f"ch-{channel}",
                "_sequence": f"{sequence[channel]:020d}",
                "_commit_ts": start + dt.timedelta(microseconds=b * config.batch_size + i),
                "_before": None, "_extra": None})
        out.append(pa.Table.from_pylist(rows, schema=SCHEMA))
    return out


def run(config: LakehouseApplyConfig, workdir: Path) -> dict[str, Any]:
    from deltalake import write_deltalake

    from tablestore_cdc.lakehouse import DeltaApplySink, IcebergApplySink
    from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

    workdir.mkdir(parents=True, exist_ok=True)
    batches = change_batches(config)
    changes = sum(b.num_rows for b in batches)

    sink = DeltaApplySink(workdir / "apply", key_columns=["id"])
    began = time.perf_counter()
    for batch_id, batch in enumerate(batches):
        sink.apply(batch, "bench", batch_id)
    apply_s = time.perf_counter() - began

    began = time.perf_counter()
    for batch in batches:
        write_deltalake(str(workdir / "append"), batch, mode="append")
    append_s = time.perf_counter() - began

    result: dict[str, Any] = {
        "changes": changes, "batches": config.batches,
        "apply_changes_s": changes / apply_s, "append_rows_s": changes / append_s,
        "ratio": append_s / apply_s, "apply_s": round(apply_s, 2),
        "append_s": round(append_s, 2),
    }
    if config.iceberg:
        iceberg = IcebergApplySink(sqlite_catalog_properties(str(workdir / "warehouse")),
                                   "bench.orders", key_columns=["id"])
        began = time.perf_counter()
        for batch_id, batch in enumerate(batches):
            iceberg.apply(batch, "bench", batch_id)
        iceberg_s = time.perf_counter() - began
        result["iceberg_apply_changes_s"] = changes / iceberg_s
        result["iceberg_apply_s"] = round(iceberg_s, 2)
    return result


if __name__ == "__main__":  # a quick look: python -m benchmarks.lakehouse_apply
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        figures = run(LakehouseApplyConfig(), Path(tmp))
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()})
