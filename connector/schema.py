"""Output schema and the conversion of change records to Arrow record batches.

Output row = the table's declared columns (key columns first) with Spark types derived from the
declared Tablestore types, followed by the metadata columns:

====================  =========  ==========================================================
``_op``               string     PUT, UPDATE or DELETE
``_channel_id``       string     the channel the change came from
``_sequence``         string     the change's position; sortable within a channel
``_commit_ts``        timestamp  when the change was committed in the source
``_before``           string     JSON of the row's attribute columns before the change
``_extra``            string     JSON of attribute values not declared in the schema (or null)
====================  =========  ==========================================================

(``_channel_id``, ``_sequence``) is a stable idempotency key: a replayed batch yields the same
pairs. For PUT and UPDATE the declared columns hold the row *after* the change; for DELETE only
the key columns are set.

``output_schema`` runs on the driver (``DataSource.schema``); ``RecordBatchBuilder`` runs on
executors inside ``read()``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from connector.errors import OptionError
from connector.gc_pause import gc_paused
from connector.tunnel.base import Op, Record, TableSchema

TABLESTORE_TO_SPARK: dict[str, DataType] = {
    "INTEGER": LongType(),
    "DOUBLE": DoubleType(),
    "BOOLEAN": BooleanType(),
    "STRING": StringType(),
    "BINARY": BinaryType(),
}

METADATA_FIELDS: tuple[StructField, ...] = (
    StructField("_op", StringType(), False),
    StructField("_channel_id", StringType(), False),
    StructField("_sequence", StringType(), False),
    StructField("_commit_ts", TimestampType(), True),
    StructField("_before", StringType(), True),
    StructField("_extra", StringType(), True),
)
METADATA_NAMES = frozenset(f.name for f in METADATA_FIELDS)


def output_schema(table: TableSchema) -> StructType:
    """The default output schema for ``table`` (driver)."""
    fields = [StructField(c.name, TABLESTORE_TO_SPARK[c.type], False) for c in table.primary_key]
    fields += [StructField(c.name, TABLESTORE_TO_SPARK[c.type], True) for c in table.columns]
    return StructType(fields + list(METADATA_FIELDS))


def check_user_schema(user: StructType, table: TableSchema) -> StructType:
    """Validate a ``.schema(...)`` given by the user (driver): every key column must be present;
    metadata columns must keep their types. Columns not declared in the table are allowed
    (Tablestore attributes are schemaless)."""
    names = set(user.fieldNames())
    missing = [c.name for c in table.primary_key if c.name not in names]
    if missing:
        raise OptionError(option="schema", value=user.simpleString(),
                          problem=f"lacks primary-key column(s) {missing}",
                          allowed="a schema containing every key column")
    expected = {f.name: f.dataType for f in METADATA_FIELDS}
    expected.update({c.name: TABLESTORE_TO_SPARK[c.type] for c in (*table.primary_key,
                                                                   *table.columns)})
    for f in user.fields:
        if f.name in expected and f.dataType != expected[f.name]:
            raise OptionError(option="schema", value=user.simpleString(),
                              problem=f"column {f.name} must be "
                              f"{expected[f.name].simpleString()}",
                              allowed="the declared column types and the metadata column types")
    return user


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"$binary": base64.b64encode(value).decode()}
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


#: ``json.dumps(value, default=_json_default, sort_keys=True, separators=(",", ":"))``
_ENCODE = json.JSONEncoder(default=_json_default, sort_keys=True, separators=(",", ":")).encode


def to_json(values: dict[str, Any] | None) -> str | None:
    if values is None:
        return None
    return _ENCODE(values)


class UndeclaredValuesError(OptionError):
    """A record carries attribute values the output schema has no column for, and the schema
    has no ``_extra`` column to keep them: refusing to drop them silently."""

    template = (
        "option '{option}': change in channel {channel_id!r} at {sequence} carries column(s) "
        "{columns} that the given schema neither declares nor can keep (add them, or add "
        "'_extra string'); got {value!r}; allowed: {allowed}"
    )


class RecordBatchBuilder:
    """Turns change records into Arrow record batches matching the Spark output schema.

    Built once per ``read()`` call on an executor. The Arrow schema is derived with PySpark's own
    ``to_arrow_schema`` because Spark checks yielded batches against it for equality.
    """

    def __init__(self, schema: StructType, batch_rows: int = 8192) -> None:
        self.schema = schema
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.names = schema.fieldNames()
        self.data_columns = [n for n in self.names if n not in METADATA_NAMES]
        self.data_column_set = frozenset(self.data_columns)
        self.keeps_extra = "_extra" in self.names
        self.batch_rows = batch_rows

    def batches(self, records: Iterable[Record]) -> Iterator[pa.RecordBatch]:
        """Batches of ``batch_rows`` records (the last one shorter), built lazily."""
        it = iter(records)
        while chunk := list(islice(it, self.batch_rows)):
            yield self._build(chunk)

    def _build(self, records: list[Record]) -> pa.RecordBatch:
        """One Arrow batch of ``records``, built column by column.

        Per record only the merged row (key + after image) is made; every output column is
        then one list comprehension and one ``pa.array`` call, ``_commit_ts`` is cast from the
        integer microseconds without a ``datetime`` per row, and JSON columns use one prebuilt
        encoder (``json.dumps`` with options builds a new encoder on every call). The cyclic
        garbage collector is paused meanwhile (``gc_paused``).
        """
        with gc_paused():
            return self._build_columns(records)

    def _build_columns(self, records: list[Record]) -> pa.RecordBatch:
        data_set = self.data_column_set
        rows: list[Any] = []
        extras: list[str | None] = []
        for r in records:
            op = r.op
            pk = r.primary_key
            # the row after the change: key columns + ``Record.after_image()``
            if op is Op.DELETE:
                values = pk if type(pk) is dict else dict(pk)
            elif op is Op.UPDATE and r.before is not None:
                values = dict(pk)
                after = r.after_image()
                if after:
                    values.update(after)
            else:  # PUT, or UPDATE without before-image: after_image() is the columns
                values = {**pk, **r.columns}
            rows.append(values)
            if values.keys() <= data_set:
                extras.append(None)
                continue
            undeclared = {k: v for k, v in values.items() if k not in data_set}
            if not self.keeps_extra:
                raise UndeclaredValuesError(
                    option="schema", value=self.schema.simpleString(), channel_id=r.channel_id,
                    sequence=r.sequence, columns=sorted(undeclared),
                    allowed="a schema that declares every column, or one with _extra",
                )
            extras.append(to_json(undeclared))
        arrays = []
        for field in self.arrow_schema:
            name = field.name
            if name not in METADATA_NAMES:
                arrays.append(pa.array([v.get(name) for v in rows], type=field.type))
            elif name == "_commit_ts":
                micros = pa.array([r.commit_ts_us for r in records], type=pa.int64())
                arrays.append(micros.cast(field.type))
            else:
                arrays.append(pa.array(self._metadata(name, records, extras), type=field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    @staticmethod
    def _metadata(name: str, records: list[Record], extras: list[str | None]) -> list[Any]:
        if name == "_op":
            return [r.op.value for r in records]
        if name == "_channel_id":
            return [r.channel_id for r in records]
        if name == "_sequence":
            return [r.sequence for r in records]
        if name == "_before":
            return [None if r.before is None else _ENCODE(
                r.before if type(r.before) is dict else dict(r.before)) for r in records]
        assert name == "_extra", name
        return extras
