"""``LocalTablestore``: the row API of a table store in one SQLite file.

The product's default backend and the reference for what a table store with a CDC tunnel
looks like. Its API follows the tablestore SDK's shape (``create_table``, ``put_row``,
``update_row``, ``delete_row``, ``batch_write``, ``get_row``) plus the operations a real service
performs on its own (``split_channel``, ``merge_channels``, ``trim_history``) so tests and demos
can trigger them.

Who uses it, and where:
- a writer process (the ``tablestore-cdc local write`` CLI, a demo, a test, the emulator's
  table API) writes rows;
- ``LocalTunnelService`` (``connector.tunnel.local.service``) opens its own instance and reads
  the change log and keeps tunnel state in the same file, inside this class's ``transaction``:
  on the Spark driver (planning, checkpoint pushes) and on executors (reads);
- tests and harnesses call ``change_log`` to verify what a consumer received.

This class owns the connection, the transactions and the cache of table schemas; each method
is one transaction that calls the module owning its concern: ``rows`` (row writes and reads),
``channels`` (key ranges, split, merge, trim), ``changelog`` (the records), ``schema`` (the
tables of the file). The file's format is pinned by tests/test_local_store_format.py.

Concurrency: several processes may open the same file at once. Each ``LocalTablestore`` owns one
connection (never shared across processes: a child process after ``fork`` transparently opens
its own). The file is in WAL mode, so readers never block the writer; every write transaction
starts with ``BEGIN IMMEDIATE`` (take the write lock up front instead of upgrading a read lock,
which in SQLite fails without waiting) and is kept short; ``busy_timeout`` makes a writer wait
for the lock instead of failing. A lock still held after the timeout surfaces as the retryable
``TransientTunnelError``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from connector.errors import (
    InvalidChannelOperationError,
    InvalidRowError,
    TableExistsError,
    TransientTunnelError,
    UnknownTableError,
)
from connector.tunnel.base import ColumnSpec, Record, TableSchema
from connector.tunnel.local import channels, rows
from connector.tunnel.local.changelog import all_changes
from connector.tunnel.local.channels import ChannelRow, cut_key_space
from connector.tunnel.local.names import check_new_name, check_table
from connector.tunnel.local.rows import WriteOp
from connector.tunnel.local.schema import create_tables, delete_table_data, missing_tables
from connector.tunnel.local.values import COLUMN_TYPES, KEY_TYPES, loads_values

T = TypeVar("T")

#: How long a writer waits for the file's write lock before giving up (milliseconds).
BUSY_TIMEOUT_MS = 30_000


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
        with self.transaction() as conn:  # opening an existing store takes no write lock
            missing = missing_tables(conn)
        if missing:  # a new file, or one written by an older version: create what it lacks
            with self.transaction(write=True) as conn:
                create_tables(conn)

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
        check_new_name("table name", name)
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
                check_new_name(f"{kind} name", col)
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
            cut_key_space(conn, name, channels, now)
        self._schemas[name] = schema
        return schema

    def list_tables(self) -> list[str]:
        with self.transaction() as conn:
            return [r[0] for r in conn.execute("SELECT name FROM cdc_tables ORDER BY name")]

    def drop_table(self, table: str) -> None:
        """Delete a table with its rows, change log, channels and tunnels (the emulator's
        DeleteTable). ``UnknownTableError`` if there is no such table. Other processes that
        cached the schema keep it until they reopen the store. A table created again under the
        same name starts empty (``schema.delete_table_data``)."""
        with self.transaction(write=True) as conn:
            self.require_table(conn, table)
            delete_table_data(conn, table)
        self._schemas.pop(table, None)

    def table_schema(self, table: str) -> TableSchema:
        """The declared schema; ``UnknownTableError`` if there is no such table."""
        if table not in self._schemas:
            with self.transaction() as conn:
                self.require_table(conn, table)
        return self._schemas[table]

    def _on_table(self, table: str, call: Callable[..., T], *args: Any, write: bool = False) -> T:
        """``call(conn, table, *args)`` in one transaction, ``table`` checked first (the row,
        channel and trim methods below)."""
        with self.transaction(write=write) as conn:
            self.require_table(conn, table)
            return call(conn, table, *args)

    def require_table(self, conn: sqlite3.Connection, table: str) -> TableSchema:
        """Inside a transaction: the table's schema, or ``UnknownTableError`` (also for a
        name no table can have: ``names.check_table``)."""
        if table in self._schemas:
            return self._schemas[table]
        check_table(table, self.endpoint)
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

    # --- row writes and reads ---------------------------------------------------------------

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
            rows.write_batch(conn, self.require_table(conn, table), op_list)

    def get_row(self, table: str, pk: Mapping[str, Any]) -> dict[str, Any] | None:
        """The row's attribute columns, or ``None`` if there is no such row."""
        with self.transaction() as conn:
            return rows.get_row(conn, self.require_table(conn, table), pk)

    def scan(self, table: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every live row as (primary key, attribute columns); for verification and demos."""
        return self._on_table(table, rows.scan)

    def scan_span(self, table: str, column: str, low: Any, high: Any
                  ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The live rows whose key column ``column`` (INTEGER or STRING) lies in ``[low,
        high]`` (None: unbounded), as (primary key, attribute columns), in no order; for the
        emulator's GetRange, which would otherwise decode every row of the table."""
        return self._on_table(table, rows.scan, column, low, high)

    def scan_pages(self, table: str, page_rows: int = 5000, *, column: str | None = None,
                   low: Any = None, high: Any = None
                   ) -> Iterator[list[tuple[dict[str, Any], dict[str, Any]]]]:
        """Every live row as (primary key, attribute columns), ``page_rows`` at a time in key
        order, each page its own short read transaction (a long scan never holds one open
        while writers go on: a row written during the scan may or may not be in it). With
        ``column`` (a key column), only the rows whose value of it is in ``[low, high)`` (None:
        unbounded on that side), chosen by the query. For ``tablestore-cdc reconcile`` and
        ``resnapshot``, which read the table while the stream runs."""
        after: str | None = None
        while True:
            with self.transaction() as conn:
                self.require_table(conn, table)
                page = rows.scan_page(conn, table, after, page_rows, column, low, high)
            if not page:
                return
            yield [(loads_values(pk), loads_values(attrs)) for pk, attrs in page]
            if len(page) < page_rows:
                return
            after = page[-1][0]

    def count_rows(self, table: str) -> int:
        return self._on_table(table, rows.count_rows)

    # --- channels ---------------------------------------------------------------------------

    def list_channels(self, table: str) -> list[ChannelRow]:
        """All channels of the table, closed ones included, in creation order."""
        return self._on_table(table, channels.channel_rows)

    def split_channel(self, table: str, channel_id: str) -> tuple[str, str]:
        """Close an open channel and open two children on the halves of its key range.

        Returns ``(lower_child, upper_child)``; both have ``parent_ids == (channel_id,)``.
        """
        return self._on_table(table, channels.split_channel, channel_id, time.time(), write=True)

    def merge_channels(self, table: str, a: str, b: str) -> str:
        """Close two adjacent open channels and open one child on the union of their ranges.

        The child's ``parent_ids`` are both parents, the lower range first.
        ``InvalidChannelOperationError`` if either is closed or unknown, or they are not adjacent.
        """
        return self._on_table(table, channels.merge_channels, a, b, time.time(), write=True)

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
        return self._on_table(table, channels.trim_history, keep_last, cutoff_us, write=True)

    # --- change log -------------------------------------------------------------------------

    def change_log(self, table: str) -> list[Record]:
        """Every change record still held (not trimmed), channel by channel in creation order,
        each in sequence order, with ``channel_id`` set. For verification in tests/harnesses."""
        with self.transaction() as conn:
            return all_changes(conn, self.require_table(conn, table))


__all__ = ["BUSY_TIMEOUT_MS", "LocalTablestore"]
