"""The pipeline library: a selection of tables' changes into a Parquet change log and one
queryable table each.

Two streaming queries in one Spark driver, started by ``start_pipeline`` (``multi_table.py``,
whose docstring tells them; one table is a selection of one): the source into Spark's Parquet
file sink (``<out>/changelog``), and that change log, by ``foreachBatch``, into each table's
apply sink (``tablestore_cdc.lakehouse``, docs/lakehouse.md).

A restart on the same ``<out>`` resumes exactly (the checkpoints live under it). The commands
that run it, ``tablestore-cdc replicate`` and ``tablestore-cdc demo``, are in
``tablestore_cdc/commands/replicate.py``; the replication job around it (restarts, the output
lock, Spark's log) in ``job.py``; the demo's writer and verification in
``tablestore_cdc/demo/``. Everything here runs in the Spark driver; no printing.
"""

from tablestore_cdc.pipeline.multi_table import Pipeline, start_pipeline
from tablestore_cdc.pipeline.queries import ApplySettings

__all__ = ["ApplySettings", "Pipeline", "start_pipeline"]
