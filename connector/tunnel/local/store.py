"""The embedded local table store: one SQLite file holding tables, rows and their change log.

``LocalTablestore`` is the product's default backend and the reference for what a table store
with a CDC tunnel looks like. Its API follows the tablestore SDK's shape (``put_row``,
``update_row``, ``delete_row``, ``batch_write``, ``get_row``) plus the operations a real service
performs on its own (channel split/merge, history trimming) so tests and demos can trigger them.

Who uses it, and where:
- a writer process (the ``tablestore-cdc local write`` CLI, a demo, a test) writes rows;
- ``connector.tunnel.local.LocalTunnelService`` reads the change log and keeps tunnel state in
  the same file: on the Spark driver (planning, checkpoint pushes) and on executors (reads);
- tests and harnesses call ``change_log`` to verify what a consumer received.

Columnar segments: the write that completes ``SEGMENT_RECORDS`` unsealed changes of a channel
also stores them as one Arrow batch (``cdc_change_segments``, LZ4 Arrow IPC) in the page shape
of ``connector.tunnel.page``; ``read_change_page`` slices segments, so the executor's read path
builds no Python object per record. ``cdc_changes`` stays the record of truth (``change_log``,
trimming, ``read_records``); a segment is derived from it in the same transaction.

Concurrency: several processes may open the same file at once. Each ``LocalTablestore`` owns one
connection (never shared across processes: a child process after ``fork`` transparently opens
its own). The file is in WAL mode, so readers never block the writer; every write transaction
starts with ``BEGIN IMMEDIATE`` (take the write lock up front instead of upgrading a read lock,
which in SQLite fails without waiting) and is kept short; ``busy_timeout`` makes a writer wait
for the lock instead of failing. A lock still held after the timeout surfaces as the retryable
``TransientTunnelError``.

Change log model (mirrors Tablestore's stream):
- the key space is a stable 32-bit hash of the primary key (blake2b of its canonical JSON);
- each channel owns a half-open hash range; ``create_table`` cuts the space into N equal
  ranges; the open channels always cover the whole space without overlap;
- every write appends exactly one record to the open channel owning the key, with the next
  per-channel sequence (1, 2, 3, ... allocated inside the write transaction, so gapless);
- ``split_channel`` closes a channel and opens two children on the halves of its range;
  ``merge_channels`` closes two adjacent channels and opens one child on their union. Writes
  after the operation land in the children. Closed channels keep their records.

Write semantics worth knowing:
- ``update_row`` of a missing row creates it (op UPDATE, before-image ``None``), as Tablestore's
  UpdateRow does; a column set to ``None`` is deleted.
- ``delete_row`` of a missing row still appends a DELETE record (before-image ``None``): the
  write happened, and a consumer replicating deletes must see it to stay in sync with
  writers that do not read first.
- Attribute columns not declared in the schema are allowed (Tablestore is schemaless for
  attributes); key columns must be exactly the declared ones. An ``int`` given for a declared
  DOUBLE column is stored as ``float``; a ``bool`` is never an INTEGER.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connector.errors import (
    InvalidChannelOperationError,
    InvalidRowError,
    TableExistsError,
    TransientTunnelError,
    UnknownTableError,
)
from connector.gc_pause import gc_paused
from connector.tunnel.base import ColumnSpec, Op, Record, TableSchema

if TYPE_CHECKING:  # pyarrow is imported where pages are built: writers of small stores skip it
    import pyarrow as pa

    from connector.tunnel.page import EncodedBatch, PageLayout

#: The hash space channels cut into ranges: [0, KEY_SPACE).
KEY_SPACE = 2**32
#: Tablestore's type names -> the Python types a value of that type may have.
COLUMN_TYPES = ("INTEGER", "DOUBLE", "BOOLEAN", "STRING", "BINARY")
#: Tablestore allows only these as primary-key column types.
KEY_TYPES = ("INTEGER", "STRING", "BINARY")
#: Records per sealed columnar segment (``cdc_change_segments``).
SEGMENT_RECORDS = 4096
#: How long a writer waits for the file's write lock before giving up (milliseconds).
BUSY_TIMEOUT_MS = 30_000

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_SCHEMA = """
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

-- Tunnel side, owned by connector.tunnel.local (kept here so one file has one schema).
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


#: every table ``_SCHEMA`` creates
_TABLES = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", _SCHEMA))


# --- value encoding -----------------------------------------------------------------------


def _enc(value: Any) -> Any:
    # JSON has no bytes; a one-key object marks them (only ever a value, never a row).
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode("ascii")}
    return value


def _dec(value: Any) -> Any:
    if isinstance(value, dict):
        return base64.b64decode(value["$b"])
    return value


#: how ``_enc`` marks bytes in stored JSON (``"$b"`` inside a string value would be escaped)
_BYTES_MARK = '{"$b":'
_OPS = {op.value: op for op in Op}


def dumps_values(values: Mapping[str, Any]) -> str:
    """Canonical JSON of a column -> value mapping (sorted keys, bytes as base64)."""
    return json.dumps(
        {k: _enc(v) for k, v in values.items()}, sort_keys=True, separators=(",", ":")
    )


def loads_values(text: str) -> dict[str, Any]:
    """Inverse of ``dumps_values``."""
    return {k: _dec(v) for k, v in json.loads(text).items()}


def _IPC_OPTIONS() -> Any:  # noqa: N802 - a constant, built on first use (pyarrow is lazy)
    import pyarrow as pa

    return pa.ipc.IpcWriteOptions(compression="lz4")


def key_hash(pk_json: str) -> int:
    """The key's position in the hash space [0, 2**32): stable across processes and runs."""
    return int.from_bytes(hashlib.blake2b(pk_json.encode("utf-8"), digest_size=4).digest(), "big")


def sequence_str(seq: int) -> str:
    """``Record.sequence`` of per-channel sequence ``seq`` (sortable as a string)."""
    return f"{seq:020d}"


# --- rows returned by the store -------------------------------------------------------------


@dataclass(frozen=True)
class ChannelRow:
    """One channel of a table as the store keeps it (independent of any tunnel)."""

    table_name: str
    channel_id: str
    channel_no: int
    parent_ids: tuple[str, ...]
    range_lo: int
    range_hi: int
    closed: bool
    head_seq: int
    trimmed_upto: int
    created_at: float
    closed_at: float | None

    def owns(self, h: int) -> bool:
        return self.range_lo <= h < self.range_hi

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel_id": self.channel_id,
            "parent_ids": list(self.parent_ids),
            "range": [self.range_lo, self.range_hi],
            "closed": self.closed,
            "head_seq": self.head_seq,
            "trimmed_upto": self.trimmed_upto,
            "created_at": self.created_at,
            "closed_at": self.closed_at,
        }


_CHANNEL_COLS = (
    "table_name, channel_id, channel_no, parent_ids, range_lo, range_hi, closed, head_seq, "
    "trimmed_upto, created_at, closed_at"
)


def _channel_from_row(r: Sequence[Any]) -> ChannelRow:
    return ChannelRow(
        table_name=r[0],
        channel_id=r[1],
        channel_no=r[2],
        parent_ids=tuple(json.loads(r[3])),
        range_lo=r[4],
        range_hi=r[5],
        closed=bool(r[6]),
        head_seq=r[7],
        trimmed_upto=r[8],
        created_at=r[9],
        closed_at=r[10],
    )


WriteOp = tuple[str, Mapping[str, Any], Mapping[str, Any] | None]


class LocalTablestore:
    """A table store in one SQLite file. One instance per process; cheap to open.

    ``path`` is created (with its schema) when it does not exist, unless ``create=False``.
    Methods are synchronous; each write is one short transaction.
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = str(Path(path).absolute())
        if not create and not os.path.exists(self.path):
            raise FileNotFoundError(self.path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._in_tx = False
        self._schemas: dict[str, TableSchema] = {}  # schemas never change once created
        self._ensure_schema()

    # --- connection and transactions ----------------------------------------------------------

    def _ensure_schema(self) -> None:
        statements = [s for s in _SCHEMA.split(";") if s.strip()]
        with self.transaction() as conn:  # opening an existing store takes no write lock
            have = {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'cdc_%'"
            )}
        if have >= _TABLES:  # a file written by an older version gets its new tables below
            return
        with self.transaction(write=True) as conn:
            for statement in statements:
                conn.execute(statement)

    @property
    def endpoint(self) -> str:
        """How errors name this store."""
        return f"local store {self.path}"

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            # After fork the inherited connection belongs to the parent: leave it alone.
            conn = sqlite3.connect(
                self.path,
                timeout=BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL is durable against process crashes in WAL mode (not power loss): enough
            # for an embedded development store, and several times faster than FULL.
            conn.execute("PRAGMA synchronous = NORMAL")
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    @contextmanager
    def transaction(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction on this instance's connection (used by the tunnel backend too).

        ``write=True`` takes the write lock at once (``BEGIN IMMEDIATE``); a read transaction
        sees one consistent snapshot of the file. Not reentrant.
        """
        with self._lock:
            if self._in_tx:
                raise RuntimeError("LocalTablestore transactions do not nest")
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.OperationalError as exc:
                raise TransientTunnelError(detail=f"{self.path}: {exc}") from exc
            self._in_tx = True
            try:
                yield conn
            except sqlite3.OperationalError as exc:
                conn.execute("ROLLBACK")
                if "locked" in str(exc) or "busy" in str(exc):
                    raise TransientTunnelError(detail=f"{self.path}: {exc}") from exc
                raise
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.OperationalError as exc:
                    conn.execute("ROLLBACK")
                    raise TransientTunnelError(detail=f"{self.path}: {exc}") from exc
            finally:
                self._in_tx = False

    def close(self) -> None:
        """Close this process's connection. Safe to call twice."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> LocalTablestore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- tables ---------------------------------------------------------------------------------

    def create_table(
        self,
        name: str,
        primary_key: Sequence[tuple[str, str]],
        columns: Sequence[tuple[str, str]] = (),
        channels: int = 4,
    ) -> TableSchema:
        """Create a table whose change log is cut into ``channels`` equal key ranges.

        ``primary_key`` and ``columns`` are ``(name, type)`` pairs with Tablestore type names;
        key columns may be INTEGER, STRING or BINARY. ``TableExistsError`` if the name is taken.
        """
        if not isinstance(name, str) or not name:
            raise InvalidRowError(table=name, reason="a table name must be a non-empty string")
        if not primary_key:
            raise InvalidRowError(table=name, reason="a table needs at least one key column")
        if not isinstance(channels, int) or isinstance(channels, bool) or not 1 <= channels <= 1024:
            raise InvalidChannelOperationError(
                table=name, reason=f"channels must be an integer in 1..1024, got {channels!r}"
            )
        seen: set[str] = set()
        specs: list[list[ColumnSpec]] = [[], []]
        parts = ((primary_key, KEY_TYPES), (columns, COLUMN_TYPES))
        for part, (pairs, allowed) in enumerate(parts):
            kind = "key column" if part == 0 else "column"
            for col, typ in pairs:
                typ_u = str(typ).upper()
                if not isinstance(col, str) or not col:
                    raise InvalidRowError(table=name, reason=f"{kind} name {col!r} is not valid")
                if col in seen:
                    raise InvalidRowError(table=name, reason=f"column {col!r} is declared twice")
                if typ_u not in allowed:
                    raise InvalidRowError(
                        table=name,
                        reason=f"{kind} {col!r} has type {typ!r}; allowed: {', '.join(allowed)}",
                    )
                seen.add(col)
                specs[part].append(ColumnSpec(col, typ_u))
        schema = TableSchema(name, tuple(specs[0]), tuple(specs[1]))
        schema_json = json.dumps(
            {
                "primary_key": [[c.name, c.type] for c in schema.primary_key],
                "columns": [[c.name, c.type] for c in schema.columns],
            }
        )
        now = time.time()
        with self.transaction(write=True) as conn:
            if conn.execute("SELECT 1 FROM cdc_tables WHERE name = ?", (name,)).fetchone():
                raise TableExistsError(table=name, endpoint=self.endpoint)
            conn.execute(
                "INSERT INTO cdc_tables (name, schema_json, next_channel_no, created_at) "
                "VALUES (?, ?, ?, ?)",
                (name, schema_json, channels, now),
            )
            step = KEY_SPACE // channels
            for i in range(channels):
                hi = KEY_SPACE if i == channels - 1 else (i + 1) * step
                self._insert_channel(conn, name, i, (), i * step, hi, now)
        self._schemas[name] = schema
        return schema

    def list_tables(self) -> list[str]:
        with self.transaction() as conn:
            return [r[0] for r in conn.execute("SELECT name FROM cdc_tables ORDER BY name")]

    def drop_table(self, table: str) -> None:
        """Delete a table with its rows, change log, channels and tunnels (the emulator's
        DeleteTable). ``UnknownTableError`` if there is no such table. Other processes that
        cached the schema keep it until they reopen the store.

        Every table of the schema keyed by ``table_name`` (or by the ``tunnel_id`` of one of
        the table's tunnels) is cleared, so a table created again under the same name starts
        empty whatever the layout holds."""
        with self.transaction(write=True) as conn:
            self.require_table(conn, table)
            tunnels = "SELECT tunnel_id FROM cdc_tunnels WHERE table_name = ?"
            by_table = []
            for t in sorted(_TABLES - {"cdc_tables", "cdc_tunnels"}):
                cols = {r[1] for r in conn.execute(f"PRAGMA table_info({t})")}
                if "table_name" in cols:
                    by_table.append(t)
                elif "tunnel_id" in cols:
                    conn.execute(f"DELETE FROM {t} WHERE tunnel_id IN ({tunnels})", (table,))
            for t in [*by_table, "cdc_tunnels"]:
                conn.execute(f"DELETE FROM {t} WHERE table_name = ?", (table,))
            conn.execute("DELETE FROM cdc_tables WHERE name = ?", (table,))
        self._schemas.pop(table, None)

    def table_schema(self, table: str) -> TableSchema:
        """The declared schema; ``UnknownTableError`` if there is no such table."""
        if table not in self._schemas:
            with self.transaction() as conn:
                self.require_table(conn, table)
        return self._schemas[table]

    def require_table(self, conn: sqlite3.Connection, table: str) -> TableSchema:
        """Inside a transaction: the table's schema, or ``UnknownTableError``."""
        if table in self._schemas:
            return self._schemas[table]
        row = conn.execute("SELECT schema_json FROM cdc_tables WHERE name = ?", (table,)).fetchone()
        if row is None:
            raise UnknownTableError(table=table, endpoint=self.endpoint)
        raw = json.loads(row[0])
        schema = TableSchema(
            table,
            tuple(ColumnSpec(n, t) for n, t in raw["primary_key"]),
            tuple(ColumnSpec(n, t) for n, t in raw["columns"]),
        )
        self._schemas[table] = schema
        return schema

    # --- row writes -------------------------------------------------------------------------

    def put_row(self, table: str, pk: Mapping[str, Any], columns: Mapping[str, Any]) -> None:
        """Write the whole row (replacing any previous one). Appends a PUT record."""
        self.batch_write(table, [("put", pk, columns)])

    def update_row(self, table: str, pk: Mapping[str, Any], columns: Mapping[str, Any]) -> None:
        """Change some columns (``None`` deletes one); creates a missing row. Appends an UPDATE."""
        self.batch_write(table, [("update", pk, columns)])

    def delete_row(self, table: str, pk: Mapping[str, Any]) -> None:
        """Delete the row. Appends a DELETE record even when the row did not exist."""
        self.batch_write(table, [("delete", pk, None)])

    def batch_write(self, table: str, ops: Iterable[WriteOp]) -> None:
        """Apply ``("put"|"update"|"delete", pk, columns)`` operations atomically, in order.

        Every operation is validated before anything is written; an invalid one raises
        ``InvalidRowError`` and nothing of the batch is written. Each operation appends its
        own change record (the same key twice gives two records, in order).
        """
        op_list = list(ops)
        with self.transaction(write=True) as conn:
            schema = self.require_table(conn, table)
            prepared = [self._validate(schema, i, op) for i, op in enumerate(op_list)]
            if not prepared:
                return
            open_channels = [c for c in self._channel_rows(conn, table) if not c.closed]
            now_us = time.time_ns() // 1000
            heads: dict[str, int] = {}
            for kind, pk_json, cols in prepared:
                channel, seq = self._apply(conn, table, open_channels, kind, pk_json, cols,
                                           now_us)
                heads[channel.channel_id] = seq
            for channel in open_channels:
                if channel.channel_id in heads:
                    self._seal(conn, schema, channel, heads[channel.channel_id])

    def _validate(
        self, schema: TableSchema, index: int, op: Any
    ) -> tuple[str, str, dict[str, Any] | None]:
        table = schema.table_name
        try:
            kind, pk, cols = op
        except (TypeError, ValueError):
            raise InvalidRowError(
                table=table, reason=f"operation #{index} must be (kind, pk, columns), got {op!r}"
            ) from None
        if kind not in ("put", "update", "delete"):
            raise InvalidRowError(
                table=table, reason=f"operation #{index}: kind {kind!r} is not put/update/delete"
            )
        if not isinstance(pk, Mapping):
            raise InvalidRowError(table=table, reason=f"primary key must be a dict, got {pk!r}")
        declared = [c.name for c in schema.primary_key]
        missing = [c for c in declared if c not in pk]
        if missing:
            raise InvalidRowError(
                table=table, reason=f"primary key column {missing[0]!r} is missing"
            )
        unknown = [c for c in pk if c not in declared]
        if unknown:
            raise InvalidRowError(
                table=table,
                reason=f"column {unknown[0]!r} is not a primary key column "
                f"(key columns: {', '.join(declared)})",
            )
        key = {
            c.name: _check_value(table, c.name, c.type, pk[c.name], key=True)
            for c in schema.primary_key
        }
        if kind == "delete":
            return kind, dumps_values(key), None
        if not isinstance(cols, Mapping):
            raise InvalidRowError(table=table, reason=f"columns must be a dict, got {cols!r}")
        if kind == "update" and not cols:
            raise InvalidRowError(table=table, reason="update_row needs at least one column")
        types = {c.name: c.type for c in schema.columns}
        checked: dict[str, Any] = {}
        for name, value in cols.items():
            if not isinstance(name, str) or not name:
                raise InvalidRowError(table=table, reason=f"column name {name!r} is not valid")
            if name in key:
                raise InvalidRowError(
                    table=table, reason=f"column {name!r} is a primary key column, not an attribute"
                )
            if value is None:
                if kind == "put":
                    raise InvalidRowError(
                        table=table, reason=f"column {name!r} is None; omit it in put_row"
                    )
                checked[name] = None
                continue
            checked[name] = _check_value(table, name, types.get(name), value, key=False)
        return kind, dumps_values(key), checked

    def _apply(
        self,
        conn: sqlite3.Connection,
        table: str,
        open_channels: list[ChannelRow],
        kind: str,
        pk_json: str,
        cols: dict[str, Any] | None,
        now_us: int,
    ) -> tuple[ChannelRow, int]:
        """Append one change; returns its channel and sequence."""
        h = key_hash(pk_json)
        channel = next(c for c in open_channels if c.owns(h))  # open ranges cover the space
        row = conn.execute(
            "SELECT attrs FROM cdc_rows WHERE table_name = ? AND pk = ?", (table, pk_json)
        ).fetchone()
        before_json = row[0] if row else None
        if kind == "delete":
            op, record_cols = Op.DELETE, "{}"
            conn.execute("DELETE FROM cdc_rows WHERE table_name = ? AND pk = ?", (table, pk_json))
        else:
            assert cols is not None
            if kind == "put":
                op, new = Op.PUT, dict(cols)
            else:
                op = Op.UPDATE
                new = loads_values(before_json) if before_json else {}
                new.update(cols)
                new = {k: v for k, v in new.items() if v is not None}
            record_cols = dumps_values(cols)
            conn.execute(
                "INSERT INTO cdc_rows (table_name, pk, key_hash, attrs) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (table_name, pk) DO UPDATE SET attrs = excluded.attrs",
                (table, pk_json, h, dumps_values(new)),
            )
        (seq,) = conn.execute(
            "UPDATE cdc_channels SET head_seq = head_seq + 1 "
            "WHERE table_name = ? AND channel_id = ? RETURNING head_seq",
            (table, channel.channel_id),
        ).fetchone()
        conn.execute(
            "INSERT INTO cdc_changes (table_name, channel_id, seq, op, pk, columns, before, "
            "commit_ts_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (table, channel.channel_id, seq, op.value, pk_json, record_cols, before_json, now_us),
        )
        return channel, seq

    def _seal(
        self, conn: sqlite3.Connection, schema: TableSchema, channel: ChannelRow, head: int
    ) -> None:
        """Inside the write that appended up to ``head``: seal every complete run of
        ``SEGMENT_RECORDS`` unsealed records of the channel into a columnar segment."""
        (sealed,) = conn.execute(
            "SELECT coalesce(max(last_seq), 0) FROM cdc_change_segments WHERE table_name = ? "
            "AND channel_id = ?",
            (schema.table_name, channel.channel_id),
        ).fetchone()
        sealed = max(sealed, channel.trimmed_upto)  # nothing to seal below the trim point
        if head - sealed < SEGMENT_RECORDS:
            return
        import pyarrow as pa

        from connector.tunnel.page import PageLayout, records_to_page

        layout = PageLayout.of_table(schema)
        while head - sealed >= SEGMENT_RECORDS:
            records = self.read_changes(
                conn, schema.table_name, channel.channel_id, sealed, SEGMENT_RECORDS
            )
            with gc_paused():
                batch = records_to_page(records, layout)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema, options=_IPC_OPTIONS()) as writer:
                writer.write_batch(batch)
            conn.execute(
                "INSERT INTO cdc_change_segments (table_name, channel_id, first_seq, last_seq, "
                "data) VALUES (?, ?, ?, ?, ?)",
                (schema.table_name, channel.channel_id, sealed + 1, sealed + SEGMENT_RECORDS,
                 sink.getvalue().to_pybytes()),
            )
            sealed += SEGMENT_RECORDS

    def get_row(self, table: str, pk: Mapping[str, Any]) -> dict[str, Any] | None:
        """The row's attribute columns, or ``None`` if there is no such row."""
        with self.transaction() as conn:
            schema = self.require_table(conn, table)
            _, pk_json, _ = self._validate(schema, 0, ("delete", pk, None))
            row = conn.execute(
                "SELECT attrs FROM cdc_rows WHERE table_name = ? AND pk = ?", (table, pk_json)
            ).fetchone()
        return loads_values(row[0]) if row else None

    def scan(self, table: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every live row as (primary key, attribute columns); for verification and demos."""
        with self.transaction() as conn:
            self.require_table(conn, table)
            rows = conn.execute(
                "SELECT pk, attrs FROM cdc_rows WHERE table_name = ?", (table,)
            ).fetchall()
        return [(loads_values(pk), loads_values(attrs)) for pk, attrs in rows]

    def count_rows(self, table: str) -> int:
        with self.transaction() as conn:
            self.require_table(conn, table)
            (n,) = conn.execute(
                "SELECT count(*) FROM cdc_rows WHERE table_name = ?", (table,)
            ).fetchone()
        return int(n)

    # --- channels ---------------------------------------------------------------------------

    def list_channels(self, table: str) -> list[ChannelRow]:
        """All channels of the table, closed ones included, in creation order."""
        with self.transaction() as conn:
            self.require_table(conn, table)
            return self._channel_rows(conn, table)

    def channel_rows(self, conn: sqlite3.Connection, table: str) -> list[ChannelRow]:
        """Inside a transaction: all channels of ``table`` in creation order (no table check)."""
        return self._channel_rows(conn, table)

    def _channel_rows(self, conn: sqlite3.Connection, table: str) -> list[ChannelRow]:
        rows = conn.execute(
            f"SELECT {_CHANNEL_COLS} FROM cdc_channels WHERE table_name = ? ORDER BY channel_no",
            (table,),
        ).fetchall()
        return [_channel_from_row(r) for r in rows]

    def channel_row(
        self, conn: sqlite3.Connection, table: str, channel_id: str
    ) -> ChannelRow | None:
        """Inside a transaction: one channel, or ``None``."""
        row = conn.execute(
            f"SELECT {_CHANNEL_COLS} FROM cdc_channels WHERE table_name = ? AND channel_id = ?",
            (table, channel_id),
        ).fetchone()
        return _channel_from_row(row) if row else None

    def _insert_channel(
        self,
        conn: sqlite3.Connection,
        table: str,
        no: int,
        parents: tuple[str, ...],
        lo: int,
        hi: int,
        now: float,
    ) -> str:
        channel_id = f"ch-{no:04d}"
        conn.execute(
            "INSERT INTO cdc_channels (table_name, channel_id, channel_no, parent_ids, range_lo, "
            "range_hi, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (table, channel_id, no, json.dumps(list(parents)), lo, hi, now),
        )
        return channel_id

    def _new_channel(
        self,
        conn: sqlite3.Connection,
        table: str,
        parents: tuple[str, ...],
        lo: int,
        hi: int,
        now: float,
    ) -> str:
        (no,) = conn.execute(
            "UPDATE cdc_tables SET next_channel_no = next_channel_no + 1 WHERE name = ? "
            "RETURNING next_channel_no - 1",
            (table,),
        ).fetchone()
        return self._insert_channel(conn, table, no, parents, lo, hi, now)

    def _open_channel(self, conn: sqlite3.Connection, table: str, channel_id: str) -> ChannelRow:
        ch = self.channel_row(conn, table, channel_id)
        if ch is None:
            raise InvalidChannelOperationError(
                table=table, reason=f"there is no channel {channel_id!r}"
            )
        if ch.closed:
            raise InvalidChannelOperationError(
                table=table, reason=f"channel {channel_id!r} is closed (split or merged before)"
            )
        return ch

    def _close(self, conn: sqlite3.Connection, table: str, channel_id: str, now: float) -> None:
        conn.execute(
            "UPDATE cdc_channels SET closed = 1, closed_at = ? WHERE table_name = ? "
            "AND channel_id = ?",
            (now, table, channel_id),
        )

    def split_channel(self, table: str, channel_id: str) -> tuple[str, str]:
        """Close an open channel and open two children on the halves of its key range.

        Returns ``(lower_child, upper_child)``; both have ``parent_ids == (channel_id,)``.
        """
        now = time.time()
        with self.transaction(write=True) as conn:
            self.require_table(conn, table)
            ch = self._open_channel(conn, table, channel_id)
            if ch.range_hi - ch.range_lo < 2:
                raise InvalidChannelOperationError(
                    table=table, reason=f"channel {channel_id!r} owns a single hash; cannot split"
                )
            mid = ch.range_lo + (ch.range_hi - ch.range_lo) // 2
            self._close(conn, table, channel_id, now)
            a = self._new_channel(conn, table, (channel_id,), ch.range_lo, mid, now)
            b = self._new_channel(conn, table, (channel_id,), mid, ch.range_hi, now)
        return a, b

    def merge_channels(self, table: str, a: str, b: str) -> str:
        """Close two adjacent open channels and open one child on the union of their ranges.

        The child's ``parent_ids`` are both parents, the lower range first.
        ``InvalidChannelOperationError`` if either is closed or unknown, or they are not adjacent.
        """
        now = time.time()
        with self.transaction(write=True) as conn:
            self.require_table(conn, table)
            if a == b:
                raise InvalidChannelOperationError(
                    table=table, reason=f"cannot merge channel {a!r} with itself"
                )
            ca, cb = self._open_channel(conn, table, a), self._open_channel(conn, table, b)
            lo_ch, hi_ch = (ca, cb) if ca.range_lo < cb.range_lo else (cb, ca)
            if lo_ch.range_hi != hi_ch.range_lo:
                raise InvalidChannelOperationError(
                    table=table,
                    reason=f"channels {a!r} and {b!r} are not adjacent "
                    f"([{ca.range_lo}, {ca.range_hi}) and [{cb.range_lo}, {cb.range_hi}))",
                )
            self._close(conn, table, a, now)
            self._close(conn, table, b, now)
            return self._new_channel(
                conn,
                table,
                (lo_ch.channel_id, hi_ch.channel_id),
                lo_ch.range_lo,
                hi_ch.range_hi,
                now,
            )

    def trim_history(
        self, table: str, *, keep_last: int | None = None, older_than_s: float | None = None
    ) -> int:
        """Delete old change records, as a service's retention does; returns how many.

        A record is deleted when every given rule allows it: it is not among the newest
        ``keep_last`` of its channel, and it is older than ``older_than_s`` seconds.
        ``keep_last=0`` trims everything. Trimming always removes a prefix of a channel; the
        channel remembers its trim point (``trimmed_upto``) so readers asking for trimmed
        records get ``TrimmedDataError`` instead of a silent gap.
        """
        if keep_last is None and older_than_s is None:
            raise InvalidChannelOperationError(
                table=table, reason="trim_history needs keep_last or older_than_s"
            )
        if keep_last is not None and keep_last < 0:
            raise InvalidChannelOperationError(table=table, reason="keep_last must be >= 0")
        cutoff_us = None if older_than_s is None else int((time.time() - older_than_s) * 1e6)
        deleted = 0
        with self.transaction(write=True) as conn:
            self.require_table(conn, table)
            for ch in self._channel_rows(conn, table):
                upto = ch.head_seq if keep_last is None else ch.head_seq - keep_last
                if cutoff_us is not None:
                    (old,) = conn.execute(
                        "SELECT max(seq) FROM cdc_changes WHERE table_name = ? AND channel_id = ? "
                        "AND commit_ts_us < ?",
                        (table, ch.channel_id, cutoff_us),
                    ).fetchone()
                    upto = min(upto, old or 0)
                if upto <= ch.trimmed_upto:
                    continue
                cur = conn.execute(
                    "DELETE FROM cdc_changes WHERE table_name = ? AND channel_id = ? AND seq <= ?",
                    (table, ch.channel_id, upto),
                )
                deleted += cur.rowcount
                conn.execute(
                    "DELETE FROM cdc_change_segments WHERE table_name = ? AND channel_id = ? "
                    "AND last_seq <= ?",
                    (table, ch.channel_id, upto),
                )
                conn.execute(
                    "UPDATE cdc_channels SET trimmed_upto = ? WHERE table_name = ? "
                    "AND channel_id = ?",
                    (upto, table, ch.channel_id),
                )
        return deleted

    # --- change log -------------------------------------------------------------------------

    def change_log(self, table: str) -> list[Record]:
        """Every change record still held (not trimmed), channel by channel in creation order,
        each in sequence order, with ``channel_id`` set. For verification in tests/harnesses."""
        with self.transaction() as conn:
            schema = self.require_table(conn, table)
            rows = conn.execute(
                "SELECT c.channel_id, c.seq, c.op, c.pk, c.columns, c.before, c.commit_ts_us "
                "FROM cdc_changes c JOIN cdc_channels h "
                "ON h.table_name = c.table_name AND h.channel_id = c.channel_id "
                "WHERE c.table_name = ? ORDER BY h.channel_no, c.seq",
                (table,),
            ).fetchall()
        return [self.record_from_row(schema, r[0], r[1:]) for r in rows]

    def read_changes(
        self, conn: sqlite3.Connection, table: str, channel_id: str, after_seq: int, limit: int
    ) -> list[Record]:
        """Inside a transaction: up to ``limit`` records with sequence > ``after_seq``."""
        schema = self.require_table(conn, table)
        rows = conn.execute(
            "SELECT seq, op, pk, columns, before, commit_ts_us FROM cdc_changes "
            "WHERE table_name = ? AND channel_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (table, channel_id, after_seq, limit),
        ).fetchall()
        return self.records_from_rows(schema, channel_id, rows)

    def read_change_page(
        self,
        conn: sqlite3.Connection,
        table: str,
        channel_id: str,
        after_seq: int,
        limit: int,
        layout: PageLayout,
    ) -> pa.RecordBatch | EncodedBatch:
        """Inside a transaction: up to ``limit`` records with sequence > ``after_seq`` as one
        page batch (``connector.tunnel.page``) shaped by ``layout`` (executor read path).

        When ``layout`` has the table's declared columns, as the default output schema does,
        and a sealed segment holds ``after_seq + 1``, the page is a slice of that segment,
        returned still encoded (``EncodedBatch``: the compressed bytes, decoded when the page
        is handed on; no per-record work) and ending with the segment, so it may hold fewer
        than ``limit`` records. Records past the last segment, and every record for another
        layout, are decoded and converted."""
        from connector.tunnel.page import (
            PAGE_METADATA,
            EncodedBatch,
            PageLayout,
            empty_page_batch,
            records_to_page,
        )

        schema = self.require_table(conn, table)
        if limit and layout.same_columns(PageLayout.of_table(schema)):
            # the segment holding after_seq + 1, found on the index
            rows = self._segments(
                conn,
                "SELECT first_seq, last_seq, data FROM cdc_change_segments WHERE table_name = ?1 "
                "AND channel_id = ?2 AND last_seq > ?3 AND first_seq = (SELECT max(first_seq) "
                "FROM cdc_change_segments WHERE table_name = ?1 AND channel_id = ?2 "
                "AND first_seq <= ?3 + 1)",
                (table, channel_id, after_seq),
            )
            if rows:
                first, last, data = rows[0]
                # the page ends with the segment (a page may be short); kept compressed until
                # the reader hands it on
                count = min(last - after_seq, limit)
                names = tuple(name for name, _ in layout.columns)
                declared = tuple(c.name for c in (*schema.primary_key, *schema.columns))
                return EncodedBatch(
                    data, after_seq + 1 - first, count, sequence_str(after_seq + count),
                    None if names == declared else (*names, *(f.name for f in PAGE_METADATA)),
                )
        records = self.read_changes(conn, table, channel_id, after_seq, limit)
        if not records:
            return empty_page_batch(layout)
        with gc_paused():
            return records_to_page(records, layout)

    @staticmethod
    def _segments(conn: sqlite3.Connection, query: str, args: tuple[Any, ...]) -> list[Any]:
        try:
            return conn.execute(query, args).fetchall()
        except sqlite3.OperationalError as exc:  # a file from before segments, opened read-only
            if "no such table" in str(exc):
                return []
            raise

    def records_from_rows(
        self, schema: TableSchema, channel_id: str, rows: Sequence[Sequence[Any]]
    ) -> list[Record]:
        """``[record_from_row(schema, channel_id, r) for r in rows]``, decoded a page at a time.

        Where records are decoded (``read_changes``: the tail past the last sealed segment,
        sealing a segment, ``read_records``; base-data reads): every JSON value of the
        page is parsed by one ``json.loads`` of one array instead of up to three calls per row
        (a call costs more than parsing a small object), bytes markers are decoded only when
        the page contains one, and the cyclic garbage collector is paused meanwhile
        (``gc_paused``). The result is equal to ``record_from_row`` row by row.
        """
        if not rows:
            return []
        with gc_paused():
            return self._decode_page(schema, channel_id, rows)

    def _decode_page(
        self, schema: TableSchema, channel_id: str, rows: Sequence[Sequence[Any]]
    ) -> list[Record]:
        text = "[" + ",".join([
            f"{r[2]},{r[3]},{'null' if r[4] is None else r[4]}" for r in rows
        ]) + "]"
        values = json.loads(text)
        if _BYTES_MARK in text:  # a marker can only be a value: JSON strings escape quotes
            values = [v if v is None else {k: _dec(x) for k, x in v.items()} for v in values]
        names = [c.name for c in schema.primary_key]
        # the stored key JSON has sorted keys: already in declared order when that is sorted
        key_in_order = names == sorted(names)
        n_keys = len(names)
        ops = _OPS
        out = []
        it = iter(values)
        for r, pk, columns, before in zip(rows, it, it, it, strict=True):
            if not (key_in_order and len(pk) == n_keys):
                pk = {name: pk[name] for name in names}  # declared order
            op = ops.get(r[1]) or Op(r[1])
            out.append(Record(op, pk, columns, before, sequence_str(r[0]), r[5], channel_id))
        return out

    def record_from_row(self, schema: TableSchema, channel_id: str, r: Sequence[Any]) -> Record:
        """A ``Record`` from ``(seq, op, pk_json, columns_json, before_json|None, ts_us)``."""
        seq, op, pk_json, cols_json, before_json, ts = r
        pk = loads_values(pk_json)
        return Record(
            op=Op(op),
            primary_key={c.name: pk[c.name] for c in schema.primary_key},  # declared order
            columns=loads_values(cols_json),
            before=loads_values(before_json) if before_json is not None else None,
            sequence=sequence_str(seq),
            commit_ts_us=ts,
            channel_id=channel_id,
        )

    def snapshot_rows(
        self, conn: sqlite3.Connection, table: str, lo: int, hi: int
    ) -> list[tuple[str, str]]:
        """Inside a transaction: ``(pk_json, attrs_json)`` of the rows hashing into [lo, hi),
        in a stable order (for base-data snapshots)."""
        return conn.execute(
            "SELECT pk, attrs FROM cdc_rows WHERE table_name = ? AND key_hash >= ? "
            "AND key_hash < ? ORDER BY key_hash, pk",
            (table, lo, hi),
        ).fetchall()


def _check_value(table: str, column: str, typ: str | None, value: Any, *, key: bool) -> Any:
    """Validate one value against its declared type (``None`` = undeclared attribute)."""
    kind = "key column" if key else "column"

    def bad(expected: str) -> InvalidRowError:
        return InvalidRowError(
            table=table,
            reason=f"{kind} {column!r} expects {expected}, got {type(value).__name__} {value!r}",
        )

    if typ is None:  # undeclared attribute: any of the five Tablestore value types
        if isinstance(value, bool | str | float):
            return value
        if isinstance(value, int):
            typ = "INTEGER"
        elif isinstance(value, bytes | bytearray):
            return bytes(value)
        else:
            raise bad("one of int, float, bool, str, bytes")
    if typ == "INTEGER":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("INTEGER (int)")
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise bad("INTEGER within 64 bits")
        return value
    if typ == "DOUBLE":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("DOUBLE (float)")
        return float(value)
    if typ == "BOOLEAN":
        if not isinstance(value, bool):
            raise bad("BOOLEAN (bool)")
        return value
    if typ == "STRING":
        if not isinstance(value, str):
            raise bad("STRING (str)")
        return value
    if typ == "BINARY":
        if not isinstance(value, bytes | bytearray):
            raise bad("BINARY (bytes)")
        return bytes(value)
    raise bad(typ)  # pragma: no cover - schemas are validated at create_table


__all__ = [
    "BUSY_TIMEOUT_MS",
    "COLUMN_TYPES",
    "KEY_SPACE",
    "KEY_TYPES",
    "ChannelRow",
    "LocalTablestore",
    "dumps_values",
    "key_hash",
    "loads_values",
    "sequence_str",
]
