"""The embedded store's on-disk format, pinned: a file written by one version opens in the next.

What a store file holds is a contract with every file already on a user's disk: the SQLite
tables, their columns and indexes, how values are encoded in JSON, how changes are sealed into
Arrow segments, and the checkpoint tokens a tunnel stores. The literals below were captured
from the store as it was before its code moved into ``connector/tunnel/local/``; a change to
any of them is a format change and needs a migration, not a test update.

The file is built by the real code paths (create, writes that seal a segment, split, merge,
trim, tunnels of both types, reads and a checkpoint push) and then read with plain ``sqlite3``
and ``pyarrow``, not through the store.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa

from connector.local import LocalTablestore
from connector.tunnel.base import Checkpoint, TunnelType
from connector.tunnel.local import LocalTunnelService

#: per table: columns as PRAGMA table_info gives them (name, type, notnull, default, pk),
#: indexes as (name, unique, origin, columns), and whether it is a WITHOUT ROWID table
SCHEMA: dict[str, dict[str, Any]] = {
    "cdc_base_channels": {
        "columns": [
            ("tunnel_id", "TEXT", 1, None, 1),
            ("channel_id", "TEXT", 1, None, 2),
            ("stream_channel_id", "TEXT", 1, None, 0),
            ("head_seq", "INTEGER", 1, None, 0),
            ("created_at", "REAL", 1, None, 0),
        ],
        "indexes": [
            ("sqlite_autoindex_cdc_base_channels_1", True, "pk", ("tunnel_id", "channel_id")),
        ],
        "without_rowid": False,
    },
    "cdc_base_records": {
        "columns": [
            ("tunnel_id", "TEXT", 1, None, 1),
            ("channel_id", "TEXT", 1, None, 2),
            ("seq", "INTEGER", 1, None, 3),
            ("pk", "TEXT", 1, None, 0),
            ("columns", "TEXT", 1, None, 0),
            ("commit_ts_us", "INTEGER", 1, None, 0),
        ],
        "indexes": [
            ("sqlite_autoindex_cdc_base_records_1", True, "pk",
             ("tunnel_id", "channel_id", "seq")),
        ],
        "without_rowid": True,
    },
    "cdc_change_segments": {
        "columns": [
            ("table_name", "TEXT", 1, None, 0),
            ("channel_id", "TEXT", 1, None, 0),
            ("first_seq", "INTEGER", 1, None, 0),
            ("last_seq", "INTEGER", 1, None, 0),
            ("data", "BLOB", 1, None, 0),
        ],
        "indexes": [
            ("sqlite_autoindex_cdc_change_segments_1", True, "u",
             ("table_name", "channel_id", "first_seq")),
        ],
        "without_rowid": False,
    },
    "cdc_changes": {
        "columns": [
            ("table_name", "TEXT", 1, None, 1),
            ("channel_id", "TEXT", 1, None, 2),
            ("seq", "INTEGER", 1, None, 3),
            ("op", "TEXT", 1, None, 0),
            ("pk", "TEXT", 1, None, 0),
            ("columns", "TEXT", 1, None, 0),
            ("before", "TEXT", 0, None, 0),
            ("commit_ts_us", "INTEGER", 1, None, 0),
        ],
        "indexes": [
            ("sqlite_autoindex_cdc_changes_1", True, "pk", ("table_name", "channel_id", "seq")),
        ],
        "without_rowid": True,
    },
    "cdc_channels": {
        "columns": [
            ("table_name", "TEXT", 1, None, 1),
            ("channel_id", "TEXT", 1, None, 2),
            ("channel_no", "INTEGER", 1, None, 0),
            ("parent_ids", "TEXT", 1, None, 0),
            ("range_lo", "INTEGER", 1, None, 0),
            ("range_hi", "INTEGER", 1, None, 0),
            ("closed", "INTEGER", 1, "0", 0),
            ("head_seq", "INTEGER", 1, "0", 0),
            ("trimmed_upto", "INTEGER", 1, "0", 0),
            ("created_at", "REAL", 1, None, 0),
            ("closed_at", "REAL", 0, None, 0),
        ],
        "indexes": [
            ("sqlite_autoindex_cdc_channels_1", True, "pk", ("table_name", "channel_id")),
        ],
        "without_rowid": False,
    },
    "cdc_checkpoints": {
        "columns": [
            ("tunnel_id", "TEXT", 1, None, 1),
            ("channel_id", "TEXT", 1, None, 2),
            ("token", "TEXT", 1, None, 0),
            ("sequence_number", "INTEGER", 1, None, 0),
            ("updated_at", "REAL", 1, None, 0),
        ],
        "indexes": [
            ("sqlite_autoindex_cdc_checkpoints_1", True, "pk", ("tunnel_id", "channel_id")),
        ],
        "without_rowid": False,
    },
    "cdc_reached_end": {
        "columns": [
            ("tunnel_id", "TEXT", 1, None, 1),
            ("channel_id", "TEXT", 1, None, 2),
        ],
        "indexes": [
            ("sqlite_autoindex_cdc_reached_end_1", True, "pk", ("tunnel_id", "channel_id")),
        ],
        "without_rowid": False,
    },
    "cdc_rows": {
        "columns": [
            ("table_name", "TEXT", 1, None, 1),
            ("pk", "TEXT", 1, None, 2),
            ("key_hash", "INTEGER", 1, None, 0),
            ("attrs", "TEXT", 1, None, 0),
        ],
        "indexes": [
            ("cdc_rows_by_hash", False, "c", ("table_name", "key_hash")),
            ("sqlite_autoindex_cdc_rows_1", True, "pk", ("table_name", "pk")),
        ],
        "without_rowid": True,
    },
    "cdc_tables": {
        "columns": [
            ("name", "TEXT", 0, None, 1),
            ("schema_json", "TEXT", 1, None, 0),
            ("next_channel_no", "INTEGER", 1, None, 0),
            ("created_at", "REAL", 1, None, 0),
        ],
        "indexes": [("sqlite_autoindex_cdc_tables_1", True, "pk", ("name",))],
        "without_rowid": False,
    },
    "cdc_tunnels": {
        "columns": [
            ("tunnel_id", "TEXT", 0, None, 1),
            ("table_name", "TEXT", 1, None, 0),
            ("tunnel_name", "TEXT", 1, None, 0),
            ("tunnel_type", "TEXT", 1, None, 0),
            ("start_position", "TEXT", 1, None, 0),
            ("created_at", "REAL", 1, None, 0),
        ],
        "indexes": [
            ("sqlite_autoindex_cdc_tunnels_1", True, "pk", ("tunnel_id",)),
            ("sqlite_autoindex_cdc_tunnels_2", True, "u", ("table_name", "tunnel_name")),
        ],
        "without_rowid": False,
    },
}

#: the Arrow schema of a sealed segment of table ``t`` (id INTEGER key, v STRING, raw BINARY)
SEGMENT_SCHEMA = pa.schema([
    pa.field("id", pa.int64()),
    pa.field("v", pa.string()),
    pa.field("raw", pa.binary()),
    pa.field("_op", pa.string(), False),
    pa.field("_sequence", pa.string(), False),
    pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
    pa.field("_before", pa.string()),
    pa.field("_extra", pa.string()),
])
#: records per sealed segment: a file's segments were cut at this size
SEGMENT_RECORDS = 4096


def _schema_of(path: Path) -> dict[str, dict[str, Any]]:
    conn = sqlite3.connect(path)
    try:
        out: dict[str, dict[str, Any]] = {}
        for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ):
            indexes = sorted(
                (r[1], bool(r[2]), r[3],
                 tuple(c[2] for c in conn.execute(f"PRAGMA index_info({r[1]})")))
                for r in conn.execute(f"PRAGMA index_list({name})")
            )
            out[name] = {
                "columns": [tuple(r[1:6]) for r in conn.execute(f"PRAGMA table_info({name})")],
                "indexes": indexes,
                "without_rowid": sql.rstrip().upper().endswith("WITHOUT ROWID"),
            }
        return out
    finally:
        conn.close()


def _write_every_kind_of_state(path: Path) -> None:
    """Touch every table: rows, a sealed segment, split, merge, trim, both tunnel types, a
    read to a channel's end (``cdc_reached_end``) and a checkpoint push."""
    writer = LocalTablestore(path)
    writer.create_table("t", [("id", "INTEGER")], [("v", "STRING"), ("raw", "BINARY")],
                        channels=1)
    writer.batch_write("t", [("put", {"id": i}, {"v": str(i)}) for i in range(SEGMENT_RECORDS)])
    writer.put_row("t", {"id": -1}, {"v": "bytes", "raw": b"\x00\x01", "free": 1.5})
    writer.update_row("t", {"id": 0}, {"v": None})
    writer.delete_row("t", {"id": 1})
    low, high = writer.split_channel("t", "ch-0000")
    writer.put_row("t", {"id": 7}, {"v": "after split"})
    writer.merge_channels("t", low, high)
    writer.create_table("gone", [("k", "STRING")])
    writer.trim_history("gone", keep_last=0)
    svc = LocalTunnelService(LocalTablestore(path))
    stream = svc.create_tunnel("t", "stream").tunnel_id
    svc.create_tunnel("t", "base", TunnelType.BASE_AND_STREAM)
    token = svc.get_checkpoint(stream, "ch-0000").token
    while True:
        result = svc.read_records(stream, "ch-0000", token, 5000)
        token = result.next_token
        if token == "finished":
            break
    svc.checkpoint(stream, "ch-0000", Checkpoint("finished", 1))
    svc.close()
    writer.close()


def test_tables_columns_and_indexes_are_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    _write_every_kind_of_state(path)
    assert _schema_of(path) == SCHEMA


def test_values_tokens_and_segments_keep_their_encoding(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    _write_every_kind_of_state(path)
    conn = sqlite3.connect(path)
    try:
        # values: canonical JSON (sorted keys, compact), bytes as {"$b": base64}
        (attrs,) = conn.execute("SELECT attrs FROM cdc_rows WHERE pk = '{\"id\":-1}'").fetchone()
        assert attrs == '{"free":1.5,"raw":{"$b":"AAE="},"v":"bytes"}'
        (schema_json,) = conn.execute("SELECT schema_json FROM cdc_tables WHERE name = 't'"
                                      ).fetchone()
        assert json.loads(schema_json) == {
            "primary_key": [["id", "INTEGER"]], "columns": [["v", "STRING"], ["raw", "BINARY"]]}
        channels = conn.execute(
            "SELECT channel_id, channel_no, parent_ids, range_lo, range_hi, closed, head_seq "
            "FROM cdc_channels WHERE table_name = 't' ORDER BY channel_no").fetchall()
        assert channels == [
            ("ch-0000", 0, "[]", 0, 2**32, 1, SEGMENT_RECORDS + 3),
            ("ch-0001", 1, '["ch-0000"]', 0, 2**31, 1, channels[1][6]),
            ("ch-0002", 2, '["ch-0000"]', 2**31, 2**32, 1, channels[2][6]),
            ("ch-0003", 3, '["ch-0001", "ch-0002"]', 0, 2**32, 0, 0),
        ]
        assert channels[1][6] + channels[2][6] == 1
        # a tunnel's stored positions: FINISHED, or base64 of {"t": table, "c": channel, "s": seq}
        tokens = dict(conn.execute(
            "SELECT c.channel_id, c.token FROM cdc_checkpoints c JOIN cdc_tunnels t "
            "ON t.tunnel_id = c.tunnel_id WHERE t.tunnel_name = 'base'").fetchall())
        assert tokens["ch-0000"] == "finished"
        assert json.loads(base64.b64decode(tokens["ch-0003"])) == {"t": "t", "c": "ch-0003",
                                                                  "s": 0}
        # segments: one LZ4-compressed Arrow IPC stream of one page batch per 4,096 records
        segments = conn.execute(
            "SELECT channel_id, first_seq, last_seq, data FROM cdc_change_segments").fetchall()
    finally:
        conn.close()
    assert [s[:3] for s in segments] == [("ch-0000", 1, SEGMENT_RECORDS)]
    reader = pa.ipc.open_stream(segments[0][3])
    assert reader.schema == SEGMENT_SCHEMA
    batch = reader.read_next_batch()
    assert batch.num_rows == SEGMENT_RECORDS
    assert batch.slice(5, 1).to_pylist()[0]["_sequence"] == f"{6:020d}"
    for compression, same in (("lz4", True), (None, False)):
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression=compression)
        with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
            writer.write_batch(batch)
        assert (sink.getvalue().to_pybytes() == segments[0][3]) is same
