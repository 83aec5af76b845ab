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

Both directions work on whole columns (Arrow's casts and string joins one way, Arrow's JSON
reader the other), not row by row: a value Arrow would not write as Python's ``json`` writes
it (a string needing escapes, a non-finite or negative-zero double, any binary) is written by
``json`` for that column, and a batch Arrow's reader refuses is read by ``json`` row by row, so
every change log written before, and every value, reads back the same.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
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
    n = typed.num_rows
    key_json = _json_objects(typed, key_columns)
    deleted = pc.equal(typed.column("_op"), "DELETE")
    row_json = pc.if_else(deleted, pa.scalar(None, pa.string()), _json_objects(typed, columns))
    declared = json.dumps({"key": [[c.name, c.type] for c in key_columns],
                           "columns": [[c.name, c.type] for c in columns]},
                          separators=(",", ":"))
    arrays = [constant_strings(table, n), key_json, row_json, constant_strings(declared, n)]
    arrays += [typed.column(f.name) for f in METADATA_FIELDS]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(MULTI_TABLE_SCHEMA))


#: what Arrow writes for a double that JSON has no such number for, or that reads back
#: without its sign (``-0``): those columns are written by ``json``
_UNLIKE_JSON_DOUBLES = pa.array(["nan", "-nan", "inf", "-inf", "-0"])
#: a character a JSON string must escape: such string columns are written by ``json``
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'


def _json_objects(typed: pa.RecordBatch, specs: Sequence[ColumnSpec]) -> pa.Array:
    """Each row's ``specs`` columns as one JSON object text (``{"name":value,...}``, null as
    ``null``), joined column by column."""
    if not specs:
        return constant_strings("{}", typed.num_rows)
    pieces: list[Any] = []
    for i, spec in enumerate(specs):
        pieces.append(("{" if i == 0 else ",") + json.dumps(spec.name) + ":")
        pieces.append(_json_values(typed.column(spec.name), spec.type))
    pieces.append("}")
    return pc.binary_join_element_wise(*pieces, "")


#: the Arrow types whose values Arrow itself writes as JSON, by declared type
_ARROW_WRITES = {"INTEGER": pa.types.is_integer, "BOOLEAN": pa.types.is_boolean,
                 "DOUBLE": pa.types.is_floating, "STRING": pa.types.is_string}


def _json_values(values: pa.Array, typ: str) -> pa.Array:
    """One column's values as JSON texts: Arrow's own where it writes what ``json`` reads
    back the same, else ``json``'s, value by value (also for a column whose Arrow type is
    not its declared type's)."""
    if typ in _ARROW_WRITES and _ARROW_WRITES[typ](values.type):
        if typ in ("INTEGER", "BOOLEAN"):
            return pc.fill_null(pc.cast(values, pa.string()), "null")
        if typ == "DOUBLE":
            texts = pc.cast(values, pa.string())
            if not pc.any(pc.is_in(texts, value_set=_UNLIKE_JSON_DOUBLES)).as_py():
                return pc.fill_null(texts, "null")
        elif not pc.any(pc.match_substring_regex(values, _NEEDS_ESCAPE)).as_py():
            return pc.fill_null(pc.binary_join_element_wise('"', values, '"', ""), "null")
    return pa.array([json.dumps(_json_value(v)) for v in values.to_pylist()], pa.string())


def decode(rows: pa.Table) -> tuple[pa.Table, tuple[str, ...]]:
    """One table's generic rows as that table's own change rows (its declared columns typed,
    then the change columns), and its key columns (driver, the apply). The declared columns
    are those of the newest row (``_schema``; a table's declared columns do not change while
    it exists)."""
    declared = json.loads(rows.column("_schema")[rows.num_rows - 1].as_py())
    arrays: dict[str, pa.Array] = {}
    for column, specs in (("_key", declared["key"]), ("_row", declared["columns"])):
        texts = pc.fill_null(rows.column(column).combine_chunks(), "{}")
        arrays.update(_typed_columns(texts, [(name, typ) for name, typ in specs]))
    for name in CHANGE_COLUMNS:
        arrays[name] = rows.column(name)
    return pa.table(arrays), tuple(name for name, _ in declared["key"])


def _typed_columns(texts: pa.Array, specs: list[tuple[str, str]]) -> dict[str, pa.Array]:
    """``specs``' columns of the JSON objects ``texts``, typed: read by Arrow's JSON reader
    from the texts as lines, or by ``json`` row by row when Arrow refuses them (a text of
    another writer: a line break in it, a number Arrow does not take)."""
    if not specs:
        return {}
    try:
        parsed = _read_lines(texts, specs)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        parsed = None
    arrays: dict[str, pa.Array] = {}
    if parsed is None or parsed.num_rows != len(texts):
        objects = [json.loads(t) for t in texts.to_pylist()]
        for name, typ in specs:
            values = [row.get(name) for row in objects]
            arrays[name] = pa.array(_unbase64(values) if typ == "BINARY" else values,
                                    TABLESTORE_TO_ARROW[typ])
        return arrays
    for name, typ in specs:
        column = parsed.column(name).combine_chunks()
        arrays[name] = (pa.array(_unbase64(column.to_pylist()), pa.binary())
                        if typ == "BINARY" else column)
    return arrays


def _unbase64(values: list[Any]) -> list[bytes | None]:
    """A BINARY column's base64 texts as bytes (null stays null)."""
    return [None if v is None else base64.b64decode(v) for v in values]


def _read_lines(texts: pa.Array, specs: list[tuple[str, str]]) -> pa.Table:
    """The JSON object texts read by Arrow's JSON reader as one block of lines, each column
    of its declared type (BINARY: its base64 text)."""
    wide = pa.large_string()
    lines = pc.binary_join_element_wise(pc.cast(texts, wide), pa.scalar("\n", wide),
                                        pa.scalar("", wide))
    _, offsets, data = lines.buffers()  # the lines' bytes lie end to end in ``data``
    bounds = np.frombuffer(offsets, dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
    block = data[int(bounds[0]):int(bounds[-1])] if data is not None else pa.py_buffer(b"")
    schema = pa.schema([(name, pa.string() if typ == "BINARY" else TABLESTORE_TO_ARROW[typ])
                        for name, typ in specs])
    return pa_json.read_json(
        pa.BufferReader(block),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(block), 1) + 1),
        parse_options=pa_json.ParseOptions(explicit_schema=schema,
                                           unexpected_field_behavior="ignore"))


def _json_value(value: Any) -> Any:
    """A value as ``json`` writes it here: bytes as their base64 text."""
    return base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value
