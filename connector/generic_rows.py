"""The multi-table output rows: one row codec, the same schema for every table.

A multi-table query (``connector.multiplex``) cannot output each table's own columns, since
Spark's schema is one for the whole query. Each change is written as a generic row instead
(docs/multi-table.md): ``_table``, the key and the row's declared columns as JSON objects
(binary values in base64), the table's declared columns (``_schema``) and the change columns
every table has (``connector.schema.METADATA_FIELDS``).

- ``encode`` runs on executors, in the multi-table reader's ``read``: one table's typed output
  batch (``connector.schema.RecordBatchBuilder``) as generic rows;
- ``decode`` runs on the driver, in the apply of ``replicate --tables``
  (``tablestore_cdc.pipeline.multi_table``): one table's generic rows of the change log typed
  again, with the declared columns they carry, even after the table is dropped.

The declared types become Arrow types by the one table the pages use
(``connector.tunnel.page.TABLESTORE_TO_ARROW``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StringType, StructField, StructType

from connector.schema import METADATA_FIELDS, constant_strings
from connector.spark_compat import arrow_schema
from connector.tunnel.base import ColumnSpec
from connector.tunnel.page import TABLESTORE_TO_ARROW

#: the output of a multi-table query: the same for every table (docs/multi-table.md)
MULTI_TABLE_SCHEMA = StructType([
    StructField("_table", StringType(), False),
    StructField("_key", StringType(), False),
    StructField("_row", StringType(), True),
    StructField("_schema", StringType(), False),
    *METADATA_FIELDS,
])
#: the change columns every table's rows carry beside its own (``connector.schema``)
CHANGE_COLUMNS = tuple(f.name for f in METADATA_FIELDS)


def encode(typed: pa.RecordBatch, table: str, key_columns: Sequence[ColumnSpec],
           columns: Sequence[ColumnSpec]) -> pa.RecordBatch:
    """One table's output rows in the multi-table schema (executor): the key and the row's
    declared columns as JSON objects, binary values in base64, and the table's declared
    columns (``_schema``), with which ``decode`` types them again."""
    keys = [c.name for c in key_columns]
    names = [c.name for c in columns]
    key_rows = typed.select(keys).to_pylist()
    value_rows = typed.select(names).to_pylist() if names else [{}] * typed.num_rows
    ops = typed.column("_op").to_pylist()
    key_json = [_dumps(k) for k in key_rows]
    row_json = [None if op == "DELETE" else _dumps(v) for op, v in zip(ops, value_rows,
                                                                       strict=True)]
    n = typed.num_rows
    declared = json.dumps({"key": [[c.name, c.type] for c in key_columns],
                           "columns": [[c.name, c.type] for c in columns]},
                          separators=(",", ":"))
    arrays = [constant_strings(table, n), pa.array(key_json, pa.string()),
              pa.array(row_json, pa.string()), constant_strings(declared, n)]
    arrays += [typed.column(f.name) for f in METADATA_FIELDS]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(MULTI_TABLE_SCHEMA))


def decode(rows: pa.Table) -> tuple[pa.Table, tuple[str, ...]]:
    """One table's generic rows as that table's own change rows (its declared columns typed,
    then the change columns), and its key columns (driver, the apply). The declared columns
    are those of the newest row (``_schema``; a table's declared columns do not change while
    it exists)."""
    declared = json.loads(rows.column("_schema")[rows.num_rows - 1].as_py())
    keys = [json.loads(k) for k in rows.column("_key").to_pylist()]
    images = [json.loads(r) if r is not None else {} for r in rows.column("_row").to_pylist()]
    arrays: dict[str, pa.Array] = {}
    for source, specs in ((keys, declared["key"]), (images, declared["columns"])):
        for name, typ in specs:
            values = [row.get(name) for row in source]
            if typ == "BINARY":
                values = [None if v is None else base64.b64decode(v) for v in values]
            arrays[name] = pa.array(values, TABLESTORE_TO_ARROW[typ])
    for name in CHANGE_COLUMNS:
        arrays[name] = rows.column(name)
    return pa.table(arrays), tuple(name for name, _ in declared["key"])


def _dumps(values: dict[str, Any]) -> str:
    return json.dumps({k: base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v
                       for k, v in values.items()}, separators=(",", ":"))
