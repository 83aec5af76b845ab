"""A Spark Connect thin client run of ``format("tablestore")`` (used by test_spark_connect.py).

Runs in the *client's* virtual environment (``integration.connect_env.client_python``): a
PySpark Connect client with protobuf >= 6 and neither the ``tablestore`` SDK nor boto3, with this
repository on ``PYTHONPATH``. It does what a notebook user would: connect to ``sc://...``,
``connector.register(spark)``, attach ``ProgressListener``, start a query from the source into a
Parquet file sink, process everything available, stop it. The query itself runs on the Connect
server (driver and Python workers there import ``connector`` from the server's environment).

Writes a JSON report (``--report``) for the test: session type, versions, which SDK modules the
client imported, the query's batches and what the listener recorded.

    python -m integration.connect_client --remote sc://127.0.0.1:PORT --endpoint local:///s.db \
        --table t --tunnel q --out DIR --checkpoint DIR --meta sqlite:///s.meta.db --report R
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from testkit.waiting import wait_until

#: modules the client path must never import (they pin protobuf < 6 or are server-side only)
SERVER_ONLY_MODULES = ("tablestore", "boto3", "botocore")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import google.protobuf
    import pyspark
    from pyspark.sql import SparkSession

    from connector import register
    from tablestore_cdc.listener import ProgressListener

    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    listener = ProgressListener(args.meta)
    report: dict[str, Any] = {
        "session_type": f"{type(spark).__module__}.{type(spark).__qualname__}",
        "client_pyspark": pyspark.__version__,
        "server_spark": spark.version,
        "protobuf": google.protobuf.__version__,
        "client_pid": os.getpid(),
    }
    try:
        register(spark)
        report["server_only_modules_imported"] = [
            m for m in SERVER_ONLY_MODULES if m in sys.modules]
        # PySpark 4 Connect delivers listener events to the client: the listener runs here
        spark.streams.addListener(listener)
        reader = (spark.readStream.format("tablestore").option("endpoint", args.endpoint)
                  .option("table.name", args.table).option("tunnel.name", args.tunnel))
        if args.max_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(args.max_per_trigger))
        query = (reader.load().writeStream.format("parquet").option("path", args.out)
                 .option("checkpointLocation", args.checkpoint)
                 .trigger(processingTime="500 milliseconds").start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        report["exception"] = str(query.exception()) if query.exception() else None
        progress = [json.loads(p.json) if hasattr(p, "json") else dict(p)
                    for p in query.recentProgress]  # objects in Connect, dicts in classic
        batches = [{"batch_id": p["batchId"],
                    "rows": sum(s.get("numInputRows") or 0 for s in p.get("sources") or [])}
                   for p in progress]
        report["batches"] = batches
        # the source's own lag report (reportLatestOffset), as a Connect client sees it
        report["latest_offset_reported"] = any(
            s.get("latestOffset") for p in progress for s in p.get("sources") or [])
        # listener events arrive asynchronously: wait for the batches that carried data (the
        # report says how many arrived; the test judges it)
        with_data = sum(1 for b in batches if b["rows"])
        try:
            wait_until(f"the listener to record {with_data} batches",
                       lambda: listener.recorded, lambda n: n >= with_data, timeout=30)
        except TimeoutError:
            pass
        report["listener"] = {"recorded": listener.recorded, "errors": listener.errors,
                              "expected": with_data}
    finally:
        try:
            spark.streams.removeListener(listener)
        finally:
            listener.close()
            spark.stop()  # a client with a listener does not exit until its session stops
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("remote", "endpoint", "table", "tunnel", "out", "checkpoint", "meta",
                 "report"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--max-per-trigger", type=int, default=0)
    args = parser.parse_args(argv)
    report = run(args)
    with open(args.report, "w") as out:
        json.dump(report, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
