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

A SPEC with ``"pipeline"`` instead runs the replication pipeline (``replicate --tables``) with
the Spark engine on an embedded store (``SPARK_MERGE_PYTHON``):
``{"pipeline": {"store", "out", "tables", "target", "config": {table: {setting: value}},
"phases": [{"writes": [[table, "put"|"update"|"delete", pk, columns], ...],
"adopt_target": bool}, ...], "replay": bool}}``. ``config``: the tables' own settings, as
``replicate --config``'s ``[tables.NAME]`` (a table's ``target``: an Iceberg one beside the
Delta template); the session gets what ``replicate`` gives it (``spark_merge.
replicate_conf`` of every target). Each phase's writes are made, then the
pipeline runs once (``Trigger.AvailableNow``) to its end, with the phase's ``adopt_target``;
with ``replay``, the apply query's last commit is then removed and the pipeline run once more,
so Spark replays that batch under its id. The last stdout line is JSON: per run, per table,
what the apply recorded (``last_batch``, ``rows_applied``, ``version``, ``state``).
A value ``{"base64": TEXT}`` in a write is bytes (a BINARY column).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

#: the project's root, where the runner is started (``python -m testkit.spark_merge_run``)
ROOT = Path(__file__).resolve().parent.parent
#: the interpreter of the venv make's jar step prepares (or the environment's choice)
SPARK_MERGE_PYTHON = os.environ.get(
    "TABLESTORE_CDC_SPARK_MERGE_PYTHON", str(ROOT / ".venv-spark-merge" / "bin" / "python"))


def merge_session(warehouse: str, master: str = "local[2]", parallelism: int = 1,
                  app_name: str = "tablestore-cdc-spark-merge",
                  conf: dict[str, str] | None = None) -> Any:
    """The session this runner applies batches in (and ``benchmarks/apply_engines.py``'s Spark
    engine): Delta's and Iceberg's jars and extensions, Iceberg tables in a Hadoop catalog on
    ``warehouse``, no UI. ``parallelism``: shuffle partitions and default parallelism (1 for
    the tests' batches of a few rows: one task per stage, no Delta snapshot spread over 50);
    ``conf``: more settings (the driver's memory), applied last."""
    import pyspark
    from pyspark.sql import SparkSession

    from tablestore_cdc.lakehouse.spark_merge import FORMATS, session_conf

    settings = {"spark.master": master, "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": str(parallelism),
                "spark.databricks.delta.snapshotPartitions": str(parallelism),
                "spark.default.parallelism": str(parallelism),
                **session_conf(FORMATS, pyspark.__version__, warehouse=warehouse), **(conf or {})}
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(spec_path: str) -> int:
    import pyarrow.parquet as pq

    from tablestore_cdc.lakehouse.spark_merge import SparkMergeSink

    with open(spec_path) as f:
        spec = json.load(f)
    if "pipeline" in spec:
        print(json.dumps(run_pipeline(spec["pipeline"])))
        return 0
    spark = merge_session(spec["warehouse"])
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


def _value(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"base64"}:
        import base64

        return base64.b64decode(value["base64"])
    return value


def run_pipeline(spec: dict[str, Any]) -> list[dict[str, dict[str, Any]]]:
    """The ``pipeline`` form of SPEC (module docstring): the Spark engine in the multi-table
    pipeline, phase by phase, then a replayed batch."""
    import functools
    import time

    from connector.local import LocalTablestore
    from connector.spark import local_session
    from tablestore_cdc.lakehouse.spark_merge import replicate_conf
    from tablestore_cdc.pipeline import ApplySettings
    from tablestore_cdc.pipeline.multi_table import start_pipeline
    from tablestore_cdc.pipeline.table_config import TableConfig

    out = Path(spec["out"])
    config = TableConfig.model_validate({"tables": spec.get("config", {})})
    base = ApplySettings(spec["target"], engine="spark")
    targets = [config.for_table(t, base)[0].target for t in ("", *config.tables)]
    conf = {"spark.sql.shuffle.partitions": "1", "spark.default.parallelism": "1",
            "spark.databricks.delta.snapshotPartitions": "1", **replicate_conf(targets)}
    began = time.monotonic()
    spark = local_session("tablestore-cdc-spark-merge-tables", master="local[2]", conf=conf,
                          short_run=True)
    print(f"session: {time.monotonic() - began:.1f} s", file=sys.stderr)
    endpoint = f"local://{spec['store']}"
    report: list[dict[str, dict[str, Any]]] = []

    def run_once(adopt_target: bool = False) -> None:
        began = time.monotonic()
        apply = ApplySettings(spec["target"], engine="spark", adopt_target=adopt_target)
        pipeline = start_pipeline(spark, endpoint, spec["tables"], "replicate", out, apply,
                                  once=True, per_table=functools.partial(config.for_table,
                                                                         base=apply),
                                  cycle=spec.get("cycle", "two"))
        try:
            pipeline.state_query.awaitTermination()
            pipeline.check()
        finally:
            pipeline.stop()
        report.append({table: {"last_batch": status.last_batch,
                               "rows_applied": status.rows_applied, "version": status.version,
                               "state": getattr(status.state, "value", status.state)}
                       for table, status in sorted(pipeline.apply.tables.items())})
        print(f"run {len(report)}: {time.monotonic() - began:.1f} s", file=sys.stderr)

    try:
        for phase in spec["phases"]:
            with LocalTablestore(spec["store"]) as store:
                for table, op, pk, columns in phase["writes"]:
                    values = {k: _value(v) for k, v in (columns or {}).items()}
                    if op == "delete":
                        store.delete_row(table, pk)
                    else:
                        getattr(store, f"{op}_row")(table, pk, values)
            run_once(phase.get("adopt_target", False))
        if spec.get("replay"):  # as if the job died after its commits, before Spark's
            commits = out / "_checkpoints" / "apply" / "commits"
            last = max((p for p in commits.iterdir() if p.name.isdigit()),
                       key=lambda p: int(p.name))
            last.unlink()
            (commits / f".{last.name}.crc").unlink(missing_ok=True)  # (its checksum too)
            run_once()
    finally:
        spark.stop()
    return report


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
