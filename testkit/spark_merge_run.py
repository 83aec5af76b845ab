"""``python -m testkit.spark_merge_run SPEC.json``: change batches applied by the Spark engine
(``tablestore_cdc.lakehouse.spark_merge``) in a process of its own, on a PySpark that delta-spark
and Iceberg's runtime are released for (``make``'s ``.venv-spark-merge``). Its JVM hosts one
session with Delta's and Iceberg's extensions, which the suite's shared ``spark`` session must
not get. Standard library, PyArrow and PySpark only (no pytest in that venv).

SPEC: ``{"warehouse": DIR, "runs": [{"format", "target", "app_id", "key_columns",
"soft_delete_column", "scd", "source", "batches": [[batch_id, PARQUET], ...],
"out": PARQUET|null}]}``.
Each run's batches are applied in order (a batch id given twice is a replay); ``out`` receives
the table's rows. The last stdout line is JSON: per run, per batch ``{"committed", "version"}``
or ``{"error": class name, "message"}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(spec_path: str) -> int:
    import pyarrow.parquet as pq
    import pyspark
    from pyspark.sql import SparkSession

    from tablestore_cdc.lakehouse.spark_merge import FORMATS, SparkMergeSink, session_conf

    with open(spec_path) as f:
        spec = json.load(f)
    conf = {"spark.master": "local[2]", "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "1",
            # batches of a few rows: one task per stage, no Delta snapshot spread over 50
            "spark.databricks.delta.snapshotPartitions": "1",
            "spark.default.parallelism": "1",
            **session_conf(FORMATS, pyspark.__version__, warehouse=spec["warehouse"])}
    builder = SparkSession.builder.appName("tablestore-cdc-spark-merge")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    report: list[list[dict[str, Any]]] = []
    try:
        for run in spec["runs"]:
            sink = SparkMergeSink(run["target"], format=run["format"],
                                  key_columns=run["key_columns"],
                                  soft_delete_column=run.get("soft_delete_column"),
                                  scd=run.get("scd", 1), source=run.get("source"))
            outcomes: list[dict[str, Any]] = []
            for batch_id, path in run["batches"]:
                df = spark.createDataFrame(pq.read_table(path))
                try:
                    result = sink.apply(df, run["app_id"], batch_id)
                    outcomes.append({"committed": result.committed, "version": result.version})
                except Exception as exc:
                    outcomes.append({"error": type(exc).__name__, "message": str(exc)})
            if run.get("out"):
                table = (spark.read.format("delta").load(run["target"])
                         if run["format"] == "delta" else spark.table(run["target"]))
                pq.write_table(table.toArrow(), run["out"])
            report.append(outcomes)
    finally:
        spark.stop()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
