"""What one micro-batch does to a target table, whatever its format (driver, Arrow compute:
no Python object per change).

The Delta and Iceberg sinks (``delta.py``, ``iceberg.py``) call ``plan_batch`` with the batch
as an Arrow table and the target's current schema; they turn the returned ``ApplyPlan`` (Arrow
tables) into one commit of their format. Three steps:

1. ``changes.ordered``: each key's changes in the source's order. Within a channel that is
   ``_sequence`` order (``_sequence`` is not comparable across channels). A key moves to another
   channel only when its channel splits or merges, and the source reads a parent to its end
   before any record of its children, so every change of a key in the parent was committed
   before any in the child: a key's channels are ordered by the commit time of their first
   change (then of their last; the channel id breaks an exact tie). Fed straight from the
   source a batch holds one channel per key (docs/schema.md, "Order"); a batch read back from
   a change log (``tablestore-cdc replicate``) may span a split, and this rule orders it.
2. ``drift.plan_layout``: the target's columns after this batch under the schema-drift policy.
   Attributes the reader's schema does not declare arrive in ``_extra`` (JSON); with the
   declared attribute columns they make a change's *image*. Each image value goes into its
   column when it fits (widening the column or adding one where the policy and the format
   allow), else into the target's ``_extra`` or, under the strict policies, fails the batch.
3. ``reduce_scd1`` / ``reduce_scd2`` (row indices of the ordered batch, then ``_rows``):
   SCD type 1 keeps each key's final image (or its delete);
   SCD type 2 keeps every version, valid from its change's commit time (``__START_AT``) to the
   next change's (``__END_AT``, null while current), as Spark's auto-CDC flows name them; a
   delete ends the current version and opens none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_common.schema_change import DEFAULT_POLICY, EVOLVE, EXCEPTION, IGNORE, TIMESTAMP
from tablestore_cdc.lakehouse.changes import (
    META_COLUMNS,
    attributes,
    declared_columns,
    key_boundaries,
    ordered,
)
from tablestore_cdc.lakehouse.drift import (
    EXTRA_COLUMN,
    Promotions,
    TargetLayout,
    canonical_policy,
    no_promotions,
    plan_layout,
)
from tablestore_cdc.lakehouse.errors import ApplyOptionError, ChangeBatchError
from tablestore_cdc.lakehouse.images import Images, representative_images, route

REQUIRED_META = ("_op", "_channel_id", "_sequence", "_commit_ts")
#: SCD type 2 validity columns, named as Spark's auto-CDC flows (``create_auto_cdc_flow``) name them
START_AT = "__START_AT"
END_AT = "__END_AT"


@dataclass(frozen=True)
class ApplyOptions:
    """How changes are applied; shared by every target.

    ``key_columns``: the table's primary key (the source marks them non-nullable, see
    ``key_columns_of``). ``scd``: 1 (current state) or 2 (history). ``schema_drift``: one of
    ``POLICIES`` (``cdc_common.schema_change``) or an alias (stored as the policy it stands for).
    ``widen_to_string``:
    any value fits a string column, as its text. ``soft_delete_column`` (SCD 1 only): a DELETE
    sets this boolean column to true and keeps the row instead of removing it."""

    key_columns: tuple[str, ...]
    scd: int = 1
    schema_drift: str = DEFAULT_POLICY
    soft_delete_column: str | None = None
    widen_to_string: bool = False

    def __post_init__(self) -> None:
        if not self.key_columns:
            raise ApplyOptionError(option="key_columns", value=self.key_columns,
                                   problem="no key column", allowed="the table's primary key")
        if self.scd not in (1, 2):
            raise ApplyOptionError(option="scd", value=self.scd, problem="unknown SCD type",
                                   allowed="1 (current state) or 2 (history)")
        object.__setattr__(self, "schema_drift", canonical_policy(self.schema_drift))
        if self.soft_delete_column is not None:
            if self.scd == 2:
                raise ApplyOptionError(
                    option="soft_delete_column", value=self.soft_delete_column,
                    problem="SCD type 2 already keeps deleted rows (a delete ends the current "
                    "version)", allowed="no soft-delete column with scd=2")
            reserved = {*self.key_columns, *META_COLUMNS, START_AT, END_AT}
            if self.soft_delete_column in reserved:
                raise ApplyOptionError(option="soft_delete_column",
                                       value=self.soft_delete_column,
                                       problem="the name is taken by a key or system column",
                                       allowed="a new column name, e.g. _deleted")

    def system_fields(self) -> list[pa.Field]:
        """Columns the sink adds after the table's own: soft-delete flag or SCD2 validity."""
        if self.scd == 2:
            return [pa.field(START_AT, TIMESTAMP), pa.field(END_AT, TIMESTAMP)]
        if self.soft_delete_column:
            return [pa.field(self.soft_delete_column, pa.bool_())]
        return []


def key_columns_of(schema: pa.Schema | Any) -> tuple[str, ...]:
    """The key columns of a change schema (Arrow or Spark): the non-nullable non-metadata
    columns, as ``connector.schema.output_schema`` declares them."""
    fields = list(schema)
    return tuple(f.name for f in fields if not f.nullable and f.name not in META_COLUMNS)


# --- 2. the target's columns (schema drift: drift.py) ------------------------------------------


def initial_schema(declared: pa.Schema, options: ApplyOptions) -> pa.Schema:
    """The schema of a new target: the batch's key and declared attribute columns, then
    ``_extra`` (``ignore``) and the system columns."""
    fields = [_normal_field(declared.field(k), nullable=False) for k in options.key_columns]
    fields += [_normal_field(f, nullable=True) for f in declared
               if f.name not in META_COLUMNS and f.name not in options.key_columns]
    if options.schema_drift == IGNORE:
        fields.append(pa.field(EXTRA_COLUMN, pa.string()))
    return pa.schema(fields + options.system_fields())


def _normal_field(f: pa.Field, nullable: bool) -> pa.Field:
    typ = TIMESTAMP if pa.types.is_timestamp(f.type) else f.type
    return pa.field(f.name, typ, nullable=nullable)


# --- 3. reduce --------------------------------------------------------------------------------

#: the close time of a key's open SCD 2 version, in ``ApplyPlan.close_table``
CLOSE_AT = "__close_at"


@dataclass
class ApplyPlan:
    """One batch's effect on the target, as Arrow tables.

    SCD 1: ``upsert_table`` holds final images (rows of ``layout.schema``, with the soft-delete
    flag when that option is on); ``delete_keys`` keys to remove, or, with a soft-delete column,
    keys whose row is only flagged (their last image is not in this batch). SCD 2:
    ``upsert_table`` holds the new versions; ``close_table`` each touched key and the time its
    open version ends (its first change here, ``CLOSE_AT``)."""

    layout: TargetLayout
    changes: int
    upsert_table: pa.Table
    delete_keys: pa.Table
    close_table: pa.Table
    #: values written into ``_extra`` because they fit no column (or, ``ignore``, have none)
    values_in_extra: int = 0
    #: the channel each row of ``upsert_table`` came from (how appended rows are laid out)
    upsert_channels: pa.Array | None = None

    def touched_keys(self, key_column: str) -> pa.Array:
        """Every key the batch touches (its upserts, deletes and closes), one key column."""
        return pa.chunked_array([t.column(key_column).combine_chunks() for t in (
            self.upsert_table, self.delete_keys, self.close_table)]).combine_chunks()


def plan_batch(batch: pa.Table, target: pa.Schema | None, options: ApplyOptions,
               table: str, promotions: Promotions = no_promotions) -> ApplyPlan:
    """The whole plan for one batch (``target`` None: the table does not exist yet).
    ``promotions``: the type widenings the target's format makes in place (drift.py)."""
    keys = options.key_columns
    for name in (*keys, *REQUIRED_META):
        if name not in batch.column_names:
            raise ChangeBatchError(column=name)
    rows = ordered(batch, keys)
    values = attributes(rows, keys)
    schema = target if target is not None else initial_schema(batch.schema, options)
    # a new table is made with the first batch's attributes (under ignore: into _extra)
    creating = target is None and options.schema_drift == EXCEPTION
    extra = batch.column("_extra") if "_extra" in batch.column_names else None
    layout = plan_layout(schema, declared_columns(batch.schema, extra),
                         representative_images(
        rows, values, schema, options.widen_to_string), dataclasses
                         .replace(options, schema_drift=EVOLVE) if creating else options,
                         table, promotions)
    if target is None:  # a new table is created with its columns, not evolved into them
        layout = TargetLayout(layout.schema, [], {}, layout.widen_to_string, layout.checked)
    images = route(rows, values, layout)
    last = key_boundaries(rows, keys)
    deleted = pc.equal(rows.column("_op"), "DELETE").combine_chunks()
    reduce = reduce_scd2 if options.scd == 2 else reduce_scd1
    return reduce(rows, images, last, deleted, options, layout)


def reduce_scd1(rows: pa.Table, images: Images, last: pa.Array, deleted: pa.Array,
                options: ApplyOptions, layout: TargetLayout) -> ApplyPlan:
    keys, flag = options.key_columns, options.soft_delete_column
    kept = pc.indices_nonzero(pc.and_(last, pc.invert(deleted)))
    gone = pc.indices_nonzero(pc.and_(last, deleted))
    upserts = [images.rows(kept, rows, keys, layout, {flag: pa.repeat(False, len(kept))}
                           if flag else {})]
    in_extra = images.in_extra(kept)
    picked = [kept]
    if flag is not None and len(gone):  # the row's last image in this batch: kept, flagged
        image_at = _last_image(rows, last, deleted).take(gone)
        flagged = pc.drop_null(image_at)
        upserts.append(images.rows(flagged, rows, keys, layout,
                                   {flag: pa.repeat(True, len(flagged))}))
        in_extra += images.in_extra(flagged)
        picked.append(flagged)
        gone = gone.filter(pc.is_null(image_at))
    return ApplyPlan(layout, rows.num_rows, pa.concat_tables(upserts),
                     _keys(rows, gone, keys, layout.schema),
                     _closes(rows, pa.array([], pa.int64()), keys, layout), in_extra,
                     pa.concat_arrays([rows.column("_channel_id").take(at).combine_chunks()
                                       for at in picked]))


def reduce_scd2(rows: pa.Table, images: Images, last: pa.Array, deleted: pa.Array,
                options: ApplyOptions, layout: TargetLayout) -> ApplyPlan:
    keys = options.key_columns
    commit_ts = rows.column("_commit_ts").combine_chunks()
    if commit_ts.null_count:
        raise ChangeBatchError(column="_commit_ts (null: SCD type 2 needs it)")
    n = rows.num_rows
    first = pc.indices_nonzero(pa.concat_arrays([pa.array([True]), last.slice(0, n - 1)])
                               if n else pa.array([], pa.bool_()))
    versions = pc.indices_nonzero(pc.invert(deleted))
    following = pa.concat_arrays([commit_ts.slice(1), pa.nulls(1, commit_ts.type)]) if n \
        else commit_ts
    end_at = pc.if_else(last, pa.nulls(n, commit_ts.type), following)
    upserts = images.rows(versions, rows, keys, layout, {
        START_AT: commit_ts.take(versions), END_AT: end_at.take(versions)})
    return ApplyPlan(layout, n, upserts, _keys(rows, pa.array([], pa.int64()), keys,
                                               layout.schema),
                     _closes(rows, first, keys, layout), images.in_extra(versions),
                     rows.column("_channel_id").take(versions).combine_chunks())


def _last_image(rows: pa.Table, last: pa.Array, deleted: pa.Array) -> pa.Array:
    """Per row: the index of its key's latest change so far that is not a DELETE (null when
    the key has none up to there)."""
    n = rows.num_rows
    index = pa.array(np.arange(n, dtype=np.int64))
    images = pc.fill_null_forward(pc.if_else(deleted, pa.nulls(n, pa.int64()), index))
    starts = pa.concat_arrays([pa.array([True]), last.slice(0, n - 1)]) if n else last
    group = pc.cumulative_sum(starts.cast(pa.int64()))
    same_key = pc.equal(group.take(pc.fill_null(images, 0)), group)
    return pc.if_else(pc.fill_null(same_key, False), images, pa.nulls(n, pa.int64()))


def _keys(rows: pa.Table, at: Any, keys: Sequence[str], schema: pa.Schema) -> pa.Table:
    return pa.table({k: rows.column(k).take(at).cast(schema.field(k).type) for k in keys})


def _closes(rows: pa.Table, at: Any, keys: Sequence[str], layout: TargetLayout) -> pa.Table:
    table = _keys(rows, at, keys, layout.schema)
    return table.append_column(CLOSE_AT, rows.column("_commit_ts").take(at).cast(TIMESTAMP))
