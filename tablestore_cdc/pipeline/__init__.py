"""The pipeline library: a table's changes into a Parquet change log and a queryable table.

Two streaming queries in one Spark driver, started by ``start_pipeline`` (``queries.py``):

1. ``readStream.format("tablestore")`` -> Spark's Parquet **file sink** (``<out>/changelog``):
   every insert, update and delete, exactly once (the file sink's own log makes writes atomic);
2. ``readStream.parquet(<out>/changelog)`` -> ``foreachBatch`` -> an apply sink
   (``tablestore_cdc.lakehouse``): the table's current state (SCD type 1) or its history (SCD
   type 2) in a Delta Lake or Iceberg table, one idempotent commit per batch (docs/lakehouse.md).

A restart on the same ``<out>`` resumes exactly (the checkpoints live under it). The commands
that run it, ``tablestore-cdc replicate`` and ``tablestore-cdc demo``, are in
``tablestore_cdc/commands/replicate.py``;
the demo's writer and verification in ``tablestore_cdc/demo/``.
Everything here runs in the Spark driver; no printing.
"""

from tablestore_cdc.pipeline.queries import ApplySettings, Pipeline, start_pipeline

__all__ = ["ApplySettings", "Pipeline", "start_pipeline"]
