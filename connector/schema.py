"""Output schema and the conversion of change records to Arrow record batches.

Output row = the table's declared columns (key columns first) with Spark types derived from the
declared Tablestore types, followed by the metadata columns:

====================  =========  ==========================================================
``_op``               string     PUT, UPDATE or DELETE (READ: ``snapshot.op``)
``_channel_id``       string     the channel the change came from
``_sequence``         string     the change's position; sortable within a channel
``_commit_ts``        timestamp  when the change was committed in the source
``_before``           string     JSON of the row's attribute columns before the change
``_extra``            string     JSON of attribute values not declared in the schema, and of
                                 values of another type than their column (or null)
====================  =========  ==========================================================

(``_channel_id``, ``_sequence``) is a stable idempotency key: a replayed batch yields the same
pairs. For PUT and UPDATE the declared columns hold the row *after* the change; for DELETE only
the key columns are set.

``output_schema`` runs on the driver (``DataSource.schema``); ``RecordBatchBuilder`` runs on
executors inside ``read()``: it asks the tunnel for pages of the output's columns
(``connector.tunnel.page``) and projects each page batch onto the output schema, placing values
of another type than their column by the query's ``schema.change.behavior``
(``connector.misfits``).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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

from cdc_common.schema_change import DEFAULT_POLICY, IGNORE, POLICIES_ALLOWED, policy_named
from connector.errors import OptionError
from connector.misfits import MisfitPolicy
from connector.spark_compat import arrow_schema
from connector.tunnel.base import TableSchema
from connector.tunnel.column_values import ColumnValueError, column_array
from connector.tunnel.page import PageLayout, json_value
from connector.tunnel.page import to_json as to_json  # re-exported: tablestore_cdc.lakehouse.plan

log = logging.getLogger("connector.schema")

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


#: ``before.format``: ``_before`` as JSON text (the default) or as a typed struct
BEFORE_JSON, BEFORE_STRUCT = "json", "struct"


def before_struct(fields: list[StructField], keys: set[str]) -> StructType:
    """``_before`` under ``before.format=struct``: the output's attribute columns (every value
    column but the key), nullable, with their types (Debezium's typed before-image)."""
    return StructType([StructField(f.name, f.dataType, True) for f in fields
                       if f.name not in keys and f.name not in METADATA_NAMES])


def output_schema(table: TableSchema, before_format: str = BEFORE_JSON) -> StructType:
    """The default output schema for ``table`` (driver)."""
    fields = [StructField(c.name, TABLESTORE_TO_SPARK[c.type], False) for c in table.primary_key]
    fields += [StructField(c.name, TABLESTORE_TO_SPARK[c.type], True) for c in table.columns]
    meta = list(METADATA_FIELDS)
    if before_format == BEFORE_STRUCT:
        before = before_struct(fields, {c.name for c in table.primary_key})
        meta = [StructField("_before", before, True) if f.name == "_before" else f
                for f in meta]
    return StructType(fields + meta)


def check_user_schema(user: StructType, table: TableSchema,
                      before_format: str = BEFORE_JSON) -> StructType:
    """Validate a ``.schema(...)`` given by the user (driver): every key column must be present;
    metadata columns must keep their types (``_before``: string, or under
    ``before.format=struct`` a struct of the schema's attribute columns with their types).
    Columns not declared in the table are allowed (Tablestore attributes are schemaless)."""
    names = set(user.fieldNames())
    missing = [c.name for c in table.primary_key if c.name not in names]
    if missing:
        raise OptionError(option="schema", value=user.simpleString(),
                          problem=f"lacks primary-key column(s) {missing}",
                          allowed="a schema containing every key column")
    expected = {f.name: f.dataType for f in METADATA_FIELDS}
    expected.update({c.name: TABLESTORE_TO_SPARK[c.type] for c in (*table.primary_key,
                                                                   *table.columns)})
    if before_format == BEFORE_STRUCT:
        expected["_before"] = before_struct(list(user.fields),
                                            {c.name for c in table.primary_key})
    for f in user.fields:
        if f.name in expected and f.dataType != expected[f.name]:
            raise OptionError(option="schema", value=user.simpleString(),
                              problem=f"column {f.name} must be "
                              f"{expected[f.name].simpleString()}",
                              allowed="the declared column types and the metadata column types")
    return user


class UndeclaredValuesError(OptionError):
    """A record carries attribute values the output schema has no column for, and the schema
    has no ``_extra`` column to keep them: refusing to drop them silently."""

    template = (
        "option '{option}': change in channel {channel_id!r} at {sequence} carries column(s) "
        "{columns} that the given schema neither declares nor can keep (add them, or add "
        "'_extra string'); got {value!r}; allowed: {allowed}"
    )


class RecordBatchBuilder:
    """Turns columnar pages (``connector.tunnel.page``) into Arrow record batches matching the
    Spark output schema.

    Built once per ``read()`` call on an executor. The Arrow schema is derived with PySpark's own
    ``to_arrow_schema`` (``spark_compat.arrow_schema``) because Spark checks yielded batches
    against it for equality. ``layout``
    is what to ask the tunnel for; ``project`` picks the output columns of a page batch by name
    (no copy), adds ``_channel_id``, places values of another type than their column by
    ``policy`` (``schema.change.behavior``: ``connector.misfits``; ``table`` names the source
    table in its errors) and refuses undeclared values the schema cannot keep (``ignore``: drops
    them).
    """

    def __init__(self, schema: StructType, *, policy: str = DEFAULT_POLICY,
                 table: str = "") -> None:
        self.schema = schema
        self.arrow_schema = arrow_schema(schema)
        self.names = schema.fieldNames()
        self.layout = PageLayout(tuple((f.name, f.type) for f in self.arrow_schema
                                       if f.name not in METADATA_NAMES))
        self.keeps_extra = "_extra" in self.names
        canonical = policy_named(policy)
        if canonical is None:
            raise OptionError(option="schema.change.behavior", value=policy,
                              problem="unknown policy", allowed=POLICIES_ALLOWED)
        self.policy = policy = canonical
        self._dropped_undeclared = False
        self.misfits = MisfitPolicy(
            policy, table, {f.name: f.dataType.simpleString() for f in schema.fields
                            if f.name not in METADATA_NAMES},
            keys=(f.name for f in schema.fields if not f.nullable
                  and f.name not in METADATA_NAMES), keeps_extra=self.keeps_extra)

    def project(self, page: pa.RecordBatch, channel_id: str | pa.Array) -> pa.RecordBatch:
        """The output batch of one page batch (executor, after the batch's end is claimed);
        ``channel_id``: the partition's channel (or one per row)."""
        n = page.num_rows
        page = self.misfits.apply(page, channel_id)
        if not self.keeps_extra and page.column("_extra").null_count != n:
            if self.policy != IGNORE:
                self._refuse_undeclared(page, channel_id)
            elif not self._dropped_undeclared:
                self._dropped_undeclared = True
                log.warning("table %s: values of attributes the schema does not declare are "
                            "dropped (no _extra column; schema.change.behavior=ignore)",
                            self.misfits.table)
        arrays = []
        for field in self.arrow_schema:
            if field.name == "_channel_id":
                column = (constant_strings(channel_id, n) if isinstance(channel_id, str)
                          else channel_id)
            else:
                column = page.column(field.name)
            if field.name == "_before" and pa.types.is_struct(field.type):
                column = typed_before(column, field.type)
            if column.type != field.type:
                column = column.cast(field.type)
            arrays.append(column)
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def _refuse_undeclared(self, page: pa.RecordBatch, channel_id: str | pa.Array) -> None:
        extra = page.column("_extra")
        first = next(i for i in range(page.num_rows) if extra[i].is_valid)
        channel = channel_id if isinstance(channel_id, str) else channel_id[first].as_py()
        raise UndeclaredValuesError(
            option="schema", value=self.schema.simpleString(), channel_id=channel,
            sequence=page.column("_sequence")[first].as_py(),
            columns=sorted(json.loads(extra[first].as_py())),
            allowed="a schema that declares every column, or one with _extra",
        )


def typed_before(texts: pa.Array, typ: pa.StructType) -> pa.StructArray:
    """``_before`` under ``before.format=struct`` (executor): the page's JSON before-images as
    a struct of the output's attribute columns. A value of another type than its column, or an
    attribute the schema does not declare, is null here (the JSON form keeps it, and the change
    that wrote it carried it in ``_extra``); a row without a before-image is a null struct."""
    fields = [typ.field(i) for i in range(typ.num_fields)]
    if texts.null_count == len(texts):
        return pa.nulls(len(texts), typ)
    images = [None if text is None else json.loads(text) for text in texts.to_pylist()]
    children = []
    for f in fields:
        values = [None if image is None or image.get(f.name) is None
                  else json_value(image[f.name]) for image in images]
        try:
            array, _ = column_array(values, f.name, f.type)
        except ColumnValueError:  # pyarrow refused the column as a whole: no value is lost
            array = pa.nulls(len(values), f.type)
        children.append(array)
    mask = pa.array([image is None for image in images], pa.bool_())
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def constant_strings(value: str, n: int) -> pa.Array:
    """A string array of ``n`` times ``value``, built from two buffers (no per-row object)."""
    raw = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


#: ``_op`` of a row of base data under ``snapshot.op=READ`` (Debezium's snapshot read, op r)
READ_OP = "READ"


def mark_snapshot_reads(batch: pa.RecordBatch, snapshot: bool | pa.Array) -> pa.RecordBatch:
    """``snapshot.op=READ`` (executor, ``connector.source.TablestoreStreamReader.read``): ``_op``
    READ instead of PUT in the rows ``snapshot`` marks as base data (the channel reader's
    ``snapshot_rows``: a bool for the whole page or a boolean array); unchanged when it marks
    none or the output has no ``_op``."""
    names = batch.schema.names
    if snapshot is False or "_op" not in names or not batch.num_rows:
        return batch
    i = names.index("_op")
    ops = batch.column(i)
    marked = pc.equal(ops, "PUT") if snapshot is True else pc.and_(snapshot, pc.equal(ops, "PUT"))
    return batch.set_column(i, batch.schema.field(i),
                            pc.if_else(marked, READ_OP, ops).cast(ops.type))
