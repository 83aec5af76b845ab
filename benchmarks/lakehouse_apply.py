"""The apply sink against plain appends, at target sizes that show growth (no Spark).

For every target size N (``sizes``), format (Delta, Iceberg) and SCD type, in this process and
one after the other:

- **first load**: N rows as the source delivers a snapshot (PUTs, ``channels`` channels read at
  once, each in key order, ``load_batch`` changes per batch) applied into a new table through
  the sink (``apply``: every batch appended, pruning.py); against ``write_deltalake`` /
  pyiceberg's ``append`` of the same rows in the same batches into another new table;
- **stream**: ``batches`` batches of ``batch_size`` changes into the loaded table: 50 % PUTs of
  new keys, 35 % UPDATEs and 15 % DELETEs of keys among the ``hot_keys`` newest (orders are
  paid and shipped soon after they are placed); against an append of the very same change rows.
  ``per_batch_s`` is the median apply time of one stream batch.

Figures per (format, SCD, size): ``first_load_ratio`` (first-load rows/s over append rows/s),
``first_load_ratio_cpu`` (the same in the process's CPU time, every thread's: the steadier
figure on a shared machine), ``first_load_ratio_written`` (over an append of the rows the sink
writes: its table's columns, fewer than the change rows' ten, in one file a batch),
``apply_ratio`` (stream
changes/s over append rows/s), ``per_batch_s`` and ``per_batch_cpu_s`` (the CPU time of a
stream batch); and per
(format, SCD) ``growth`` = ``per_batch_s`` at the largest size over the smallest. Built
columnar (pyarrow), so 10 M-row loads are made in seconds. The format's library is imported
before the clock starts (the appenders, made later, find it imported).
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), False), pa.field("customer", pa.string()),
    pa.field("amount", pa.float64()), pa.field("status", pa.string()),
    pa.field("_op", pa.string(), False), pa.field("_channel_id", pa.string(), False),
    pa.field("_sequence", pa.string(), False), pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_before", pa.string()), pa.field("_extra", pa.string()),
])
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class LakehouseApplyConfig:
    sizes: tuple[int, ...] = (100_000, 1_000_000)
    formats: tuple[str, ...] = ("delta", "iceberg")
    scds: tuple[int, ...] = (1, 2)
    load_batch: int = 50_000
    channels: int = 4
    batches: int = 10
    batch_size: int = 5_000
    hot_keys: int = 50_000


def _changes(keys: np.ndarray, ops: np.ndarray, channels: np.ndarray, sequences: np.ndarray,
             first_ts: int, rng: np.random.Generator) -> pa.Table:
    """Change rows (the source's output schema) built column by column."""
    n = len(keys)
    deleted = pa.array(ops == 2)
    status = pa.array(np.array(["new", "paid", "shipped"])[rng.integers(0, 3, n)])
    customer = pc.binary_join_element_wise("c", pa.array(rng.integers(0, 500, n)).cast(
        pa.string()), "")
    amount = pa.array(np.round(rng.uniform(1, 500, n), 2))
    return pa.Table.from_arrays([
        pa.array(keys, pa.int64()),
        pc.if_else(deleted, pa.nulls(n, pa.string()), customer),
        pc.if_else(deleted, pa.nulls(n, pa.float64()), amount),
        pc.if_else(deleted, pa.nulls(n, pa.string()), status),
        pa.array(np.array(["PUT", "UPDATE", "DELETE"])[ops]),
        pc.binary_join_element_wise("ch-", pa.array(channels).cast(pa.string()), ""),
        pc.utf8_lpad(pa.array(sequences).cast(pa.string()), 20, "0"),
        pa.array(first_ts + np.arange(n), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.nulls(n, pa.string()), pa.nulls(n, pa.string())], schema=SCHEMA)


def load_batches(size: int, config: LakehouseApplyConfig) -> list[pa.Table]:
    """A snapshot of ``size`` rows: channel c holds keys [c*size/channels, ...), each read in
    key order; a batch takes the next ``load_batch / channels`` rows of every channel."""
    rng = np.random.default_rng(1)
    per_channel = size // config.channels
    step = max(1, config.load_batch // config.channels)
    out = []
    for start in range(0, per_channel, step):
        stop = min(per_channel, start + step)
        keys = np.concatenate([np.arange(c * per_channel + start, c * per_channel + stop)
                               for c in range(config.channels)])
        channels = np.repeat(np.arange(config.channels), stop - start)
        sequences = np.tile(np.arange(start + 1, stop + 1), config.channels)
        out.append(_changes(keys, np.zeros(len(keys), np.int64), channels, sequences,
                            int(START.timestamp() * 1e6) + start, rng))
    return out


def stream_batches(size: int, config: LakehouseApplyConfig) -> list[pa.Table]:
    """Changes after the load: new keys beyond the table, updates and deletes of hot keys."""
    rng = np.random.default_rng(2)
    next_key = size
    live = list(range(max(0, size - config.hot_keys), size))
    sequence = np.full(config.channels, size)
    out = []
    for b in range(config.batches):
        keys, ops = [], []
        for roll in rng.random(config.batch_size):
            if roll < 0.5 or not live:
                keys.append(next_key)
                ops.append(0)
                live.append(next_key)
                next_key += 1
            elif roll < 0.85:
                keys.append(live[int(rng.integers(len(live)))])
                ops.append(1)
            else:
                keys.append(live.pop(int(rng.integers(len(live)))))
                ops.append(2)
        key_array = np.array(keys, np.int64)
        channels = key_array % config.channels
        sequences = np.empty(len(keys), np.int64)
        for i, c in enumerate(channels):
            sequence[c] += 1
            sequences[i] = sequence[c]
        out.append(_changes(key_array, np.array(ops, np.int64), channels, sequences,
                            int(START.timestamp() * 1e6) + 10 ** 9 + b * config.batch_size, rng))
        live = live[-config.hot_keys:]
    return out


class _Target:
    """One benchmark table: the sink and a plain appender of the same format."""

    def __init__(self, kind: str, directory: Path, scd: int) -> None:
        self.kind, self.directory, self.scd = kind, directory, scd

    def sink(self) -> Any:
        from tablestore_cdc.lakehouse import DeltaApplySink, IcebergApplySink
        from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

        if self.kind == "delta":
            return DeltaApplySink(self.directory / "apply", key_columns=["id"], scd=self.scd)
        return IcebergApplySink(sqlite_catalog_properties(str(self.directory / "warehouse")),
                                "bench.apply", key_columns=["id"], scd=self.scd)

    def appender(self, name: str = "append", schema: pa.Schema = SCHEMA) -> Any:
        """A function appending rows into a plain table of the format (one commit a call)."""
        if self.kind == "delta":
            from deltalake import write_deltalake

            path = str(self.directory / name)
            return lambda rows: write_deltalake(path, rows, mode="append")
        from pyiceberg.catalog import load_catalog

        from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

        warehouse = self.directory / "append-warehouse"
        warehouse.mkdir(parents=True, exist_ok=True)
        catalog = load_catalog("bench", **sqlite_catalog_properties(str(warehouse)))
        catalog.create_namespace_if_not_exists("bench")
        table = catalog.create_table(f"bench.{name}", schema=schema)
        return table.append


def _timed(batches: list[pa.Table], write: Any) -> tuple[float, float]:
    """Seconds (wall, and the process's CPU) to write ``batches`` one after the other with
    ``write``."""
    began, cpu_began = time.perf_counter(), time.process_time()
    for batch in batches:
        write(batch)
    return time.perf_counter() - began, time.process_time() - cpu_began


def run_one(kind: str, scd: int, size: int, config: LakehouseApplyConfig,
            workdir: Path) -> dict[str, Any]:
    from tablestore_cdc.lakehouse.plan import plan_batch

    target = _Target(kind, workdir / f"{kind}-scd{scd}-{size}", scd)
    sink = target.sink()
    sink.target_properties()  # the format's library imported (and its catalog opened) first
    loads = load_batches(size, config)
    # the rows the sink writes (its table's columns), for the second baseline
    written = [plan_batch(batch, None, sink.options(("id",)), "bench").upsert_table
               for batch in loads]
    batch_ids = iter(range(len(loads)))

    def load(batch: pa.Table) -> None:
        batch_id = next(batch_ids)
        assert sink.apply(batch, "bench", batch_id).appended, f"load batch {batch_id} merged"

    load_s, load_cpu = _timed(loads, load)
    append = target.appender()
    append_load_s, append_load_cpu = _timed(loads, append)
    append_written_s, _ = _timed(written, target.appender("written", written[0].schema))
    stream = stream_batches(size, config)
    times, cpu = [], []
    for i, batch in enumerate(stream):
        began, cpu_began = time.perf_counter(), time.process_time()
        sink.apply(batch, "bench", len(loads) + i)
        times.append(time.perf_counter() - began)
        cpu.append(time.process_time() - cpu_began)
    append_stream_s, _ = _timed(stream, append)
    changes = sum(b.num_rows for b in stream)
    return {
        "rows": size, "first_load_rows_s": size / load_s,
        "append_load_rows_s": size / append_load_s,
        "first_load_ratio": append_load_s / load_s,
        "first_load_ratio_cpu": append_load_cpu / load_cpu,
        "first_load_ratio_written": append_written_s / load_s,
        "apply_changes_s": changes / sum(times), "append_rows_s": changes / append_stream_s,
        "apply_ratio": append_stream_s / sum(times),
        "per_batch_s": statistics.median(times),
        "per_batch_cpu_s": statistics.median(cpu),
    }


def run(config: LakehouseApplyConfig, workdir: Path,
        log: Any = lambda message: None) -> dict[str, Any]:
    from benchmarks.common import load_average

    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for kind in config.formats:
        for scd in config.scds:
            for size in config.sizes:
                name = f"{kind}_scd{scd}_{size}"
                log(f"lakehouse_apply: {name} ...")
                figures = run_one(kind, scd, size, config, workdir)
                figures["load_avg"] = load_average()
                results[name] = figures
            small, large = min(config.sizes), max(config.sizes)
            results[f"{kind}_scd{scd}_growth"] = (results[f"{kind}_scd{scd}_{large}"]
                                                  ["per_batch_s"] / results[
                                                      f"{kind}_scd{scd}_{small}"]["per_batch_s"])
    return results


if __name__ == "__main__":  # a quick look: python -m benchmarks.lakehouse_apply
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        figures = run(LakehouseApplyConfig(formats=("delta",), scds=(1,)), Path(tmp),
                      log=lambda m: print(m, file=sys.stderr))
    for key, value in figures.items():
        print(key, {k: v if isinstance(v, list) else round(v, 3) for k, v in value.items()}
              if isinstance(value, dict) else round(value, 3))
