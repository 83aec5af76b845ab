"""The schema of a local store file: every table the store and its tunnel service keep.

One file, one schema, written here once. The store's tables (``cdc_tables``, ``cdc_channels``,
``cdc_rows``, ``cdc_changes``, ``cdc_change_segments``) are written by ``LocalTablestore`` in
writer processes; the tunnel's tables (``cdc_tunnels``, ``cdc_checkpoints``, ``cdc_reached_end``,
``cdc_base_channels``, ``cdc_base_records``) by ``LocalTunnelService`` on the Spark driver (and,
for the "end reached" mark, on executors). ``LocalTablestore`` creates the tables a file lacks
when it opens it, so a file written by an older version gains the newer tables.

This is a file format: files on users' disks hold these tables. tests/test_local_store_format.py
pins every table, column and index.
"""

from __future__ import annotations

import re
import sqlite3

SCHEMA = """
-- Store side: written by LocalTablestore (connector.tunnel.local.store).
CREATE TABLE IF NOT EXISTS cdc_tables (
    name            TEXT PRIMARY KEY,
    schema_json     TEXT NOT NULL,
    next_channel_no INTEGER NOT NULL,
    created_at      REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cdc_channels (
    table_name   TEXT NOT NULL,
    channel_id   TEXT NOT NULL,
    channel_no   INTEGER NOT NULL,
    parent_ids   TEXT NOT NULL,              -- JSON list of channel ids
    range_lo     INTEGER NOT NULL,           -- owns key hashes in [range_lo, range_hi)
    range_hi     INTEGER NOT NULL,
    closed       INTEGER NOT NULL DEFAULT 0,
    head_seq     INTEGER NOT NULL DEFAULT 0, -- sequence of the newest record (0 = none yet)
    trimmed_upto INTEGER NOT NULL DEFAULT 0, -- records with seq <= this were trimmed
    created_at   REAL NOT NULL,
    closed_at    REAL,
    PRIMARY KEY (table_name, channel_id)
);
CREATE TABLE IF NOT EXISTS cdc_rows (
    table_name TEXT NOT NULL,
    pk         TEXT NOT NULL,                -- canonical JSON of the primary key
    key_hash   INTEGER NOT NULL,
    attrs      TEXT NOT NULL,                -- JSON of the attribute columns
    PRIMARY KEY (table_name, pk)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS cdc_rows_by_hash ON cdc_rows (table_name, key_hash);
CREATE TABLE IF NOT EXISTS cdc_changes (
    table_name   TEXT NOT NULL,
    channel_id   TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    op           TEXT NOT NULL,
    pk           TEXT NOT NULL,
    columns      TEXT NOT NULL,
    before       TEXT,                       -- NULL: the row did not exist
    commit_ts_us INTEGER NOT NULL,
    PRIMARY KEY (table_name, channel_id, seq)
) WITHOUT ROWID;
-- Changes sealed into columnar segments: SEGMENT_RECORDS consecutive records of a channel as
-- one LZ4-compressed Arrow IPC stream of their page batch (connector.tunnel.page, the table's
-- declared columns). Derived from cdc_changes in the write that completes them: the read path
-- slices them instead of decoding JSON per record. A rowid table: SQLite reads large blobs
-- from one about six times faster than from a WITHOUT ROWID table (measured, 500 kB rows).
CREATE TABLE IF NOT EXISTS cdc_change_segments (
    table_name TEXT NOT NULL,
    channel_id TEXT NOT NULL,
    first_seq  INTEGER NOT NULL,
    last_seq   INTEGER NOT NULL,
    data       BLOB NOT NULL,
    UNIQUE (table_name, channel_id, first_seq)
);

-- Tunnel side: written by the tunnel service (connector.tunnel.local.service).
CREATE TABLE IF NOT EXISTS cdc_tunnels (
    tunnel_id      TEXT PRIMARY KEY,
    table_name     TEXT NOT NULL,
    tunnel_name    TEXT NOT NULL,
    tunnel_type    TEXT NOT NULL,
    start_position TEXT NOT NULL,
    created_at     REAL NOT NULL,
    UNIQUE (table_name, tunnel_name)
);
CREATE TABLE IF NOT EXISTS cdc_checkpoints (
    tunnel_id       TEXT NOT NULL,
    channel_id      TEXT NOT NULL,
    token           TEXT NOT NULL,
    sequence_number INTEGER NOT NULL,
    updated_at      REAL NOT NULL,
    PRIMARY KEY (tunnel_id, channel_id)
);
CREATE TABLE IF NOT EXISTS cdc_reached_end (
    tunnel_id  TEXT NOT NULL,
    channel_id TEXT NOT NULL,
    PRIMARY KEY (tunnel_id, channel_id)
);
CREATE TABLE IF NOT EXISTS cdc_base_channels (
    tunnel_id         TEXT NOT NULL,
    channel_id        TEXT NOT NULL,
    stream_channel_id TEXT NOT NULL,
    head_seq          INTEGER NOT NULL,
    created_at        REAL NOT NULL,
    PRIMARY KEY (tunnel_id, channel_id)
);
CREATE TABLE IF NOT EXISTS cdc_base_records (
    tunnel_id    TEXT NOT NULL,
    channel_id   TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    pk           TEXT NOT NULL,
    columns      TEXT NOT NULL,
    commit_ts_us INTEGER NOT NULL,
    PRIMARY KEY (tunnel_id, channel_id, seq)
) WITHOUT ROWID;
"""

#: every table ``SCHEMA`` creates
TABLES = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA))


def missing_tables(conn: sqlite3.Connection) -> frozenset[str]:
    """Inside a transaction: the tables of ``SCHEMA`` the file does not hold yet."""
    have = {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'cdc_%'"
    )}
    return TABLES - have


def create_tables(conn: sqlite3.Connection) -> None:
    """Inside a write transaction: create every table and index the file lacks."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def delete_table_data(conn: sqlite3.Connection, table: str) -> None:
    """Inside a write transaction: delete everything of ``table`` (``LocalTablestore.drop_table``).

    Every table of the schema keyed by ``table_name`` (or by the ``tunnel_id`` of one of the
    table's tunnels) is cleared, so a table created again under the same name starts empty
    whatever the layout holds."""
    tunnels = "SELECT tunnel_id FROM cdc_tunnels WHERE table_name = ?"
    by_table = []
    for t in sorted(TABLES - {"cdc_tables", "cdc_tunnels"}):
        cols = {r[1] for r in conn.execute(f"PRAGMA table_info({t})")}
        if "table_name" in cols:
            by_table.append(t)
        elif "tunnel_id" in cols:
            conn.execute(f"DELETE FROM {t} WHERE tunnel_id IN ({tunnels})", (table,))
    for t in [*by_table, "cdc_tunnels"]:
        conn.execute(f"DELETE FROM {t} WHERE table_name = ?", (table,))
    conn.execute("DELETE FROM cdc_tables WHERE name = ?", (table,))
