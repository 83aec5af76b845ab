"""Apply a change stream into the tables people query: Delta Lake and Apache Iceberg.

``plan.py`` orders and reduces a micro-batch (SCD type 1 or 2) in Arrow compute, with
``changes.py`` (the batch as columns: order, ``_extra``'s values by type), ``drift.py`` (the
drift policies and the type lattice) and ``images.py`` (each value into its column or
``_extra``); ``sink.py`` is the ``foreachBatch`` side (query id, conflict retries),
``ownership.py`` the marker that says which job a table belongs to, ``delta.py`` and
``iceberg.py`` make the one idempotent commit per batch, ``target.py`` opens a sink from a
``--target`` URI.
docs/lakehouse.md describes the whole.
"""

from tablestore_cdc.lakehouse.delta import DeltaApplySink
from tablestore_cdc.lakehouse.iceberg import IcebergApplySink
from tablestore_cdc.lakehouse.plan import END_AT, START_AT, ApplyOptions
from tablestore_cdc.lakehouse.sink import ApplyResult, ApplySink
from tablestore_cdc.lakehouse.target import open_apply_sink

__all__ = ["ApplyOptions", "ApplyResult", "ApplySink", "DeltaApplySink", "END_AT",
           "IcebergApplySink", "START_AT", "open_apply_sink"]
