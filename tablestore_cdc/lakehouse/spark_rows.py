"""One table's generic rows typed again by Spark, for the Spark engine (``--engine spark``) of
a multi-table pipeline.

The multi-table change log holds generic rows (``connector.generic_rows``: ``_key`` and
``_row`` JSON objects, binary values in base64, the declared columns in ``_schema``). The
embedded apply types them on the driver (``generic_rows.decode``, over Arrow); the Spark engine
(``spark_merge.SparkMergeSink``) must not collect a batch, so here Spark's SQL functions do the
same on the executors: ``from_json`` with a struct built from ``_schema``, ``unbase64`` for
binary values, the types of the source's own output schema (``connector.schema.
TABLESTORE_TO_SPARK``, which maps each declared type as ``connector.tunnel.page.
TABLESTORE_TO_ARROW`` does for the embedded decode). The result has the columns a single
table's change log had: the key columns, the declared columns, then the change columns.

Called by ``tablestore_cdc.pipeline.multi_table.MultiTableApply`` on the driver, which plans;
the only rows it collects are the batch's distinct (``_table``, ``_schema``) pairs
(``declared_schemas``).
"""

from __future__ import annotations

import json
from typing import Any

from connector.generic_rows import CHANGE_COLUMNS
from connector.schema import TABLESTORE_TO_SPARK
from tablestore_cdc.lakehouse.changes import NO_TIME


def declared_schemas(batch: Any) -> dict[str, str]:
    """Each table of ``batch`` (a DataFrame of generic rows) and its declared columns
    (``_schema`` JSON): the small distinct pairs, collected to the driver. A table with more
    than one ``_schema`` in the batch gets that of its newest change (commit time, then
    sequence), as ``generic_rows.decode`` takes its newest row's."""
    from pyspark.sql import functions as F

    newest = F.struct(F.coalesce(F.unix_micros("_commit_ts"), F.lit(NO_TIME)), "_sequence")
    pairs = (batch.groupBy("_table", "_schema").agg(F.max(newest).alias("__newest"))
             .collect())
    chosen: dict[str, tuple[Any, str]] = {}
    for row in pairs:
        order = tuple(row["__newest"])
        if row["_table"] not in chosen or order > chosen[row["_table"]][0]:
            chosen[row["_table"]] = (order, row["_schema"])
    return {table: declared for table, (_, declared) in sorted(chosen.items())}


def decode(rows: Any, declared: str) -> tuple[Any, tuple[str, ...]]:
    """One table's generic rows (a DataFrame) as that table's typed change rows, and its key
    columns: planned on the driver, run by Spark on the executors. ``declared``: the table's
    ``_schema`` (``declared_schemas``). A DELETE's ``_row`` is null: its declared columns are
    null, as in the embedded decode."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    spec = json.loads(declared)
    parsed = []
    for source, columns in (("_key", spec["key"]), ("_row", spec["columns"])):
        # binary values travel as base64 text: parsed as strings, then unbase64
        struct = StructType([StructField(name, StringType() if typ == "BINARY"
                                         else TABLESTORE_TO_SPARK[typ], True)
                             for name, typ in columns])
        parsed.append(F.from_json(F.col(source), struct))
    values = []
    for image, columns in zip(parsed, (spec["key"], spec["columns"]), strict=True):
        for name, typ in columns:
            value = image.getField(name)
            if typ == "BINARY":
                value = F.unbase64(value)
            values.append(value.cast(TABLESTORE_TO_SPARK[typ]).alias(name))
    changes = rows.select(*values, *[F.col(c) for c in CHANGE_COLUMNS])
    return changes, tuple(name for name, _ in spec["key"])
