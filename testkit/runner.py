"""Run one tablestore streaming query in its own process until told to stop.

    python -m testkit.runner (--store /abs/store.db | --endpoint URI) --table t --tunnel n \
        --checkpoint DIR --sink DIR [--option key=value ...] [--master local[2]] \
        [--meta-store URI] [--conf spark.key=value ...] [--target URI [--scd 1|2]]

The query writes into an ``ExactlyOnceParquetSink`` (skips batch ids already committed), so the
process can be SIGKILLed at any moment and restarted on the same checkpoint. With ``--target``
each batch is then also applied into a Delta or Iceberg table (``tablestore_cdc.lakehouse``,
exactly once by its own commit records). It stops cleanly when
the file ``--stop-file`` appears, and with ``--available-now`` it stops by itself. Used by the
restart tests, the fault-injection harness and the benchmarks (started by
``testkit.processes.start_runner``); it runs as the Spark driver.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="the local store file (endpoint local://STORE)")
    parser.add_argument("--endpoint", help="any other tunnel endpoint URI instead of --store")
    parser.add_argument("--table", required=True)
    parser.add_argument("--tunnel", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--stop-file")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--trigger-ms", type=int, default=0)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--meta-store", help="the meta.store option (default: SQLite beside "
                        "the store)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark configuration setting for the session")
    parser.add_argument("--target", help="also apply each batch into this table "
                        "(delta:///abs/path or iceberg:///abs/warehouse?table=ns.name)")
    parser.add_argument("--scd", type=int, default=1, help="SCD type of --target (1 or 2)")
    parser.add_argument("--executor-write-rows", type=int, default=None,
                        help="appended batches of at least this many rows have their files "
                        "written by the executors (the apply sink's executor_write_rows)")
    args = parser.parse_args(argv)
    if not (args.store or args.endpoint):
        parser.error("one of --store or --endpoint is required")

    from connector.spark import local_session
    from tablestore_cdc.sinks import ExactlyOnceParquetSink

    conf = {key: value for key, _, value in (item.partition("=") for item in args.conf)}
    spark = local_session("tablestore-cdc-runner", master=args.master, conf=conf)
    reader = (spark.readStream.format("tablestore")
              .option("endpoint", args.endpoint or f"local://{Path(args.store).resolve()}")
              .option("table.name", args.table).option("tunnel.name", args.tunnel))
    if args.meta_store:
        reader = reader.option("meta.store", args.meta_store)
    for item in args.option:
        key, _, value = item.partition("=")
        reader = reader.option(key, value)
    sink = ExactlyOnceParquetSink(args.sink)
    if args.target:
        sink = _and_apply(sink, args.target, args.scd, args.executor_write_rows)
    writer = (reader.load().writeStream.foreachBatch(sink)
              .option("checkpointLocation", args.checkpoint))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    elif args.trigger_ms:
        writer = writer.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    query = writer.start()
    print(f"runner: query {query.id} started", flush=True)
    stop_file = Path(args.stop_file) if args.stop_file else None
    while query.isActive:
        if stop_file is not None and stop_file.exists():
            query.stop()
            break
        time.sleep(0.2)
    error = query.exception()
    if error is not None:
        print(f"runner: query failed: {error}", file=sys.stderr, flush=True)
        return 1
    print("runner: stopped cleanly", flush=True)
    spark.stop()
    return 0


def _and_apply(parquet: Any, target: str, scd: int, executor_write_rows: int | None) -> Any:
    """A ``foreachBatch`` function: the apply sink first (the harness compares its table with
    the source), then the Parquet sink (the harness verifies delivery there). In this order a
    batch that reached the Parquet sink is in the table too, so the harness, which stops the
    query once the Parquet sink holds every change, never stops it between the two (a stop
    interrupts the batch in flight: with the Parquet sink first, the table could lack the last
    batch)."""
    from tablestore_cdc.lakehouse import open_apply_sink

    apply = open_apply_sink(target, scd=scd, executor_write_rows=executor_write_rows)

    def both(df: Any, batch_id: int) -> None:
        df.persist()  # read the batch from the source once for both sinks
        try:
            apply(df, batch_id)
            parquet(df, batch_id)
        finally:
            df.unpersist()

    return both


if __name__ == "__main__":
    sys.exit(main())
