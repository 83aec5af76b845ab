"""How appended rows are laid out in files (driver): clustered by key, so that the files'
key statistics stay narrow and tell later batches which files may hold their keys (pruning.py),
and a MERGE reads only the files whose key range holds its keys.

A batch read from several channels at once holds one run of keys per channel. When the
channels' key ranges do not overlap (Tablestore's partitions are ranges of the first key
column), each channel's rows go to a file of their own; when they do (hash-partitioned
channels), the batch is one file. Every file is sorted by key. ``MAX_FILES`` caps the files of
one batch: neighbouring runs are then merged.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tablestore_cdc.lakehouse.pruning import comparable

#: the most files one appended batch is written as
MAX_FILES = 16


def local_path(location: str) -> str | None:
    """A table's or a file's location (a ``file:`` URI, percent-encoded as delta-rs and
    pyiceberg give them, or a plain path) as a path on the local file system; None for an
    object store."""
    parts = urlsplit(location)
    if parts.scheme in ("", "file"):
        return unquote(parts.path)
    return None


def file_groups(rows: pa.Table, channels: pa.Array | None, key: str) -> list[pa.Table]:
    """``rows`` cut into key-clustered groups (module doc), each sorted by ``key``."""
    if not rows.num_rows:
        return []
    column = rows.column(key).combine_chunks()
    if rows.num_rows > 1 and pc.all(pc.less_equal(column.slice(0, rows.num_rows - 1),
                                                  column.slice(1))).as_py():
        ordered = rows  # the plan's rows come in key order
    else:
        order = pc.sort_indices(rows, sort_keys=[(key, "ascending")])
        ordered = rows.take(order)
        channels = None if channels is None else channels.take(order)
    if channels is None or not comparable(rows.schema.field(key).type):
        return [ordered]
    # in key order, the channels' ranges are disjoint when each channel is one run of rows
    # and each run's first key is above the key before it
    n = ordered.num_rows
    starts = [0, *(pc.add(pc.indices_nonzero(pc.not_equal(channels.slice(0, n - 1),
                                                          channels.slice(1))), 1).to_pylist())]
    if len(starts) < 2 or len(starts) != pc.count_distinct(channels).as_py():
        return [ordered]  # one channel, or channels whose ranges interleave: one file
    keys = ordered.column(key).combine_chunks()
    following = pa.array(starts[1:], pa.int64())
    if not pc.all(pc.greater(keys.take(following),
                             keys.take(pc.subtract(following, 1)))).as_py():
        return [ordered]  # two channels share a key: one file
    per_file = -(-len(starts) // MAX_FILES)
    bounds = [*starts[::per_file], n]  # each group starts at a channel's lowest key
    return [ordered.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]


def write_delta_files(table_uri: str, groups: Sequence[pa.Table], schema: pa.Schema,
                      key_columns: Sequence[str], filesystem: Any = None) -> list[Any]:
    """Write ``groups`` as Parquet files into a local Delta table's directory and return their
    ``AddAction``s (statistics: the row count and the key columns' bounds and null counts),
    for one ``create_write_transaction`` commit. Files of a commit that never happens are not
    referenced by the table (``vacuum`` removes them). One file after the other: the driver's
    cores are Spark's too, and threads cost more than they gained on a busy 2-core driver (a
    batch big enough to gain from parallel writes is written by the executors)."""
    return [_write_delta_file(table_uri, group, schema, key_columns, filesystem)
            for group in groups]


def write_delta_files_on_executors(spark_context: Any, table_uri: str,
                                   groups: Sequence[pa.Table], schema: pa.Schema,
                                   key_columns: Sequence[str], filesystem: Any = None
                                   ) -> tuple[list[Any], set[int]]:
    """``write_delta_files`` with the files written by Spark's executors, one task per group
    (the group shipped as Arrow IPC, each task returns its file's ``AddAction`` fields); the
    caller, on the driver, makes the one commit. ``filesystem``: pyarrow's file system of a
    table in object storage (``table_uri`` then its path there, ``BUCKET/PREFIX``; pickled
    into each task with its settings); None: a local directory. Returns the actions and the ids
    of the processes that wrote the files."""
    from deltalake.transaction import AddAction

    tasks = [(table_uri, to_ipc(group), to_ipc(schema.empty_table()), tuple(key_columns),
              filesystem) for group in groups]
    written = spark_context.parallelize(tasks, len(tasks)).map(_executor_write).collect()
    return ([AddAction(w["path"], w["size"], {}, w["modification_time"], True, w["stats"])
             for w in written], {w["pid"] for w in written})


def to_ipc(table: pa.Table) -> bytes:
    """``table`` as Arrow IPC stream bytes (what a Spark task is sent; ``from_ipc``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table ``to_ipc`` made (in the Spark task that receives it)."""
    return pa.ipc.open_stream(data).read_all()


def _executor_write(task: tuple[str, bytes, bytes, tuple[str, ...], Any]) -> dict[str, Any]:
    """One Spark task (executor): write a group's file, return its ``AddAction`` fields."""
    table_uri, rows, schema, key_columns, filesystem = task
    action = _write_delta_file(table_uri, from_ipc(rows), from_ipc(schema).schema,
                               key_columns, filesystem)
    return {"path": action.path, "size": action.size, "stats": action.stats,
            "modification_time": action.modification_time, "pid": os.getpid()}


def split(groups: Sequence[pa.Table], pieces: int) -> list[pa.Table]:
    """``groups`` cut into at least ``pieces`` key-ordered slices (one file each)."""
    total = sum(g.num_rows for g in groups)
    size = max(1, -(-total // max(1, pieces)))
    return [g.slice(start, size) for g in groups for start in range(0, g.num_rows, size)]


def _write_delta_file(table_uri: str, group: pa.Table, schema: pa.Schema,
                      key_columns: Sequence[str], filesystem: Any = None) -> Any:
    """One Parquet file (pyarrow releases the GIL while it writes) and its ``AddAction``;
    ``filesystem``: pyarrow's, for a table in object storage (one PUT: whole or not there)."""
    from deltalake.transaction import AddAction

    name = f"part-{uuid.uuid4()}-c000.snappy.parquet"
    path = f"{table_uri}/{name}" if filesystem is not None else os.path.join(table_uri, name)
    data = pa.Table.from_arrays([group.column(f.name).cast(f.type) for f in schema],
                                schema=schema)
    # dictionaries for the strings and binaries that are not keys (repeated names, states);
    # keys are (nearly) distinct and numbers rarely repeat enough to repay one
    pq.write_table(data, path, filesystem=filesystem, compression="snappy", use_dictionary=[
        f.name for f in schema if f.name not in key_columns and (
            pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))])
    # a null count for every column: delta-rs' readers take a column missing from the counts
    # of a file that has some as holding no null (an ``IS NULL`` filter skips the file); bounds
    # for the key columns only (they prune later batches, pruning.py)
    stats: dict[str, Any] = {"numRecords": data.num_rows, "minValues": {},
                             "maxValues": {}, "nullCount": {
                                 f.name: data.column(f.name).null_count for f in schema
                                 if not pa.types.is_nested(f.type)}}
    for name_ in key_columns:
        column = data.column(name_)
        if comparable(column.type) and not pa.types.is_binary(column.type):
            bounds = pc.min_max(column)
            stats["minValues"][name_] = bounds["min"].as_py()
            stats["maxValues"][name_] = bounds["max"].as_py()
    size = (os.path.getsize(path) if filesystem is None
            else filesystem.get_file_info(path).size)
    return AddAction(name, size, {}, int(time.time() * 1000), True, json.dumps(stats))
