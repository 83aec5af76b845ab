"""Copy-on-write of the data files that hold a batch's keys, whatever the format (driver,
Arrow compute; called by the Delta and Iceberg sinks).

A sink reads the files whose rows hold one of the batch's keys (the format decides which:
``delta._held_files``, ``iceberg._held_files``), ``rewritten`` turns those rows and the batch's
plan into the rows that replace them, and ``rewrite_groups`` cuts these into files; the sink
then commits, in one commit of its format, the old files removed and the new ones added. Files
that hold none of the batch's keys are not rewritten (at most their key column is read), so a
batch costs what the files it touches hold, not what the table holds.

The cut keeps that true over a long stream: a stream's new keys land beside the rows of the
file that held the table's highest keys, and written back as one file it would grow by every
batch's new keys, and every later batch would rewrite it whole. Cut into files of at most
``REWRITE_FILE_ROWS`` rows (and ``REWRITE_FILE_BYTES``), a file whose keys no batch touches
any more is left alone.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tablestore_cdc.lakehouse.layout import file_groups
from tablestore_cdc.lakehouse.plan import CLOSE_AT, END_AT, ApplyOptions, ApplyPlan

#: the most rows (and bytes, as Arrow holds them) of one file a rewrite writes
REWRITE_FILE_ROWS = 65_536
REWRITE_FILE_BYTES = 64 << 20
#: the most rows of the files one batch rewrites here (they are all in the driver's memory
#: at once); a Delta batch that would rewrite more goes through delta-rs' MERGE, which
#: streams them (updates spread over a large table: every file holds one of the keys)
REWRITE_MAX_ROWS = 2_000_000


def rewritten(current: pa.Table, plan: ApplyPlan, options: ApplyOptions) -> pa.Table:
    """The rows that replace the files a sink read (``current``, every row of those files):
    their untouched rows, the batch's images (SCD 1; with a soft-delete column, keys deleted
    here without an image in the batch keep their current row, flagged) or versions (SCD 2;
    open versions (``__END_AT IS NULL``) of touched keys closed at the key's first change
    time here)."""
    keys = list(options.key_columns)
    touched = pa.concat_tables([t.select(keys).cast(current.select(keys).schema) for t in (
        plan.upsert_table, plan.delete_keys, plan.close_table)]).group_by(keys).aggregate([])
    schema = plan.upsert_table.schema
    if len(keys) == 1:  # one key column: a membership mask, cheaper than two hash joins
        held = pc.is_in(current.column(keys[0]),
                        value_set=touched.column(keys[0]).combine_chunks())
        untouched, hit = current.filter(pc.invert(held)), current.filter(held)
    else:
        untouched = current.join(touched, keys=keys, join_type="left anti")
        hit = current.join(touched, keys=keys, join_type="left semi")
    parts = [conformed(untouched, schema), plan.upsert_table]
    flag = options.soft_delete_column
    if options.scd == 2:
        ended = pc.is_valid(hit.column(END_AT))
        parts.append(conformed(hit.filter(ended), schema))  # history of touched keys
        closing = hit.filter(pc.invert(ended)).drop_columns([END_AT]).join(
            plan.close_table, keys=keys)
        parts.append(conformed(closing.rename_columns(
            [END_AT if n == CLOSE_AT else n for n in closing.column_names]), schema))
    elif flag and plan.delete_keys.num_rows:  # deleted here, last image in the table: flagged
        gone = hit.join(plan.delete_keys.cast(hit.select(keys).schema), keys=keys,
                        join_type="left semi")
        gone = gone.set_column(gone.schema.get_field_index(flag), flag,
                               pa.repeat(True, gone.num_rows))
        parts.append(conformed(gone, schema))
    return pa.concat_tables(parts)


def rewrite_groups(rows: pa.Table, key: str, max_rows: int = REWRITE_FILE_ROWS,
                   max_bytes: int = REWRITE_FILE_BYTES) -> list[pa.Table]:
    """``rows`` cut into groups of at most ``max_rows`` rows and about ``max_bytes`` bytes, as
    even as the cut allows (one file each), each a range of keys: sorted by ``key`` when
    there are several (rows that fit in one file are left in their order: a file's bounds do
    not depend on it, and a sort of the rewritten rows cost as much as their read)."""
    n = rows.num_rows
    if not n:
        return []
    limit = max(1, min(max_rows, max_bytes // max(1, rows.nbytes // n)))
    if n <= limit:
        return [rows]
    (ordered,) = file_groups(rows, None, key)
    files = -(-n // limit)
    bounds = [i * n // files for i in range(files + 1)]
    return [ordered.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]


def conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with ``schema``'s columns in its order and types (missing ones null)."""
    return pa.Table.from_arrays([rows.column(f.name).cast(f.type) if f.name in rows.column_names
                                 else pa.nulls(rows.num_rows, f.type) for f in schema],
                                schema=schema)
