"""Tablestore-style CDC source for Spark Structured Streaming.

Public surface::

    from connector import register
    register(spark)                      # registers format("tablestore"), sets PYSPARK_PYTHON
                                         # also on a Spark Connect session: docs/connect.md
    spark.readStream.format("tablestore").option("endpoint", "local:///abs/store.db") ...

``TablestoreDataSource`` and ``register`` are imported lazily so that the tunnel and meta-store
code (and the CLI) can be used without starting anything Spark-related.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TablestoreDataSource", "register"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from connector import source

        return getattr(source, name)
    raise AttributeError(f"module 'connector' has no attribute {name!r}")
