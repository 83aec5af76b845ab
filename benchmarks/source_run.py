"""The source's own read into noop in a process of its own, started as ``replicate --once``
starts its session: ``replicate_e2e``'s like-with-like side (its module docstring).

``python -m benchmarks.source_run --store PATH --checkpoint DIR``: a SparkSession from
``connector.spark.local_session(short_run=True)`` (the JVM options and class archive of a
short run, as the command's), one streaming read of the embedded store's benchmark table
through a new tunnel into ``writeStream.format("noop")`` with ``Trigger.AvailableNow``, then
one JSON line on stdout, measured as ``replicate_e2e`` measures the command:

- ``rows``: every row read; ``rows_after_first``: those after the first batch;
- ``seconds``: from the end of the first batch (the mtime of ``DIR/commits/0``) to the end
  of the last one (its commit file's mtime);
- ``trigger_rows_s``: rows over the summed ``triggerExecution`` of the batches.

Run by ``benchmarks.replicate_e2e`` as a subprocess (its CPU sampled from outside); not a
test, not part of the product.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import commit_times, read_bench_table


def read_into_noop(store: Path, checkpoint: Path) -> dict[str, float]:
    """The read, in this process (driver); the figures of the module docstring."""
    from connector.spark import local_session

    spark = local_session("tablestore-cdc-benchmarks", short_run=True)
    try:
        query = (read_bench_table(spark, store).writeStream.format("noop")
                 .trigger(availableNow=True).option("checkpointLocation", str(checkpoint))
                 .start())
        query.awaitTermination()
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        spark.stop()
    commits = commit_times(checkpoint)
    trigger_s = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    rows = sum(p["numInputRows"] for p in progress)
    return {"rows": rows, "batches": len(progress),
            "rows_after_first": rows - (progress[0]["numInputRows"] if progress else 0),
            "seconds": commits[max(commits)] - commits[min(commits)],
            "trigger_rows_s": rows / trigger_s if trigger_s else 0.0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.source_run")
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(read_into_noop(args.store, args.checkpoint)), flush=True)


if __name__ == "__main__":
    main()
