"""SQLite meta store: the embedded default for one machine (driver + local executors).

URI: ``sqlite:///abs/path/meta.db``; its parameters (``SqliteUriQuery``: ``busy_timeout_ms``,
a statement's wait for another process's write lock, and ``lock_retries``, further attempts of
a whole transaction) are described in docs/operations.md.

The path must be absolute and its directory must exist; the file and the schema are created
when absent. Who opens it: the driver's planning process (``latestOffset``, ``partitions``,
``commit``), every executor inside ``read()`` (to claim end checkpoints), and the inspection
CLI. Each process opens its own connection; the file is shared.

Concurrency and atomicity: the file is in WAL mode (readers never block the writer), every
write is one ``BEGIN IMMEDIATE`` transaction (the write lock is taken up front, so two writers
never deadlock on a lock upgrade), and put-if-absent is ``INSERT OR IGNORE`` followed by a read
of the stored row inside that same transaction: of N concurrent claimers exactly one row is
written and all N see it. ``synchronous=FULL``: a committed claim survives a power loss, which
exactly-once replay depends on. A manifest is written in the same statement as the state
change, so no half-written batch is ever visible.

Layout (schema version ``SCHEMA_VERSION``, recorded in ``cdc_meta_schema``):

- ``cdc_batches(ns, uuid, created_at, state_rank, record, manifest)``: ``record`` is the
  ``BatchRecord`` JSON without its manifest, ``manifest`` the ``Manifest`` JSON or NULL;
- ``cdc_end_checkpoints(ns, uuid, channel_id, record)``: ``record`` is the ``EndCheckpoint`` JSON;
- ``cdc_namespaces(ns, info)``: the namespace description, a JSON object of strings;
- index ``cdc_batches_state(ns, state_rank)``: committed-not-pushed batches without a listing
  (created on open when missing);
- ``cdc_leases(key, lease)``: a source's lease (``MetaStore.take_lease``), the ``Lease`` JSON
  under the source's identity (created on open when missing; files from before it have none).

A file that is not a meta store of ours (not SQLite, another application's database, a newer
schema) is refused at open with ``MetaStoreUriError``; a row that does not decode raises
``CorruptMetaRecordError`` when read.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar
from urllib.parse import unquote

from pydantic import Field

from cdc_common.uris import UriQuery, parse_query
from meta_store import query_text, split_store_uri
from meta_store.base import (
    UNREAD_MANIFEST,
    BatchRecord,
    BatchState,
    EndCheckpoint,
    Manifest,
    MetaStore,
    first_times,
    namespace_info_json,
    parse_manifest,
    parse_record,
    stored_manifest_json,
    with_manifest,
)
from meta_store.errors import (
    CorruptMetaRecordError,
    MetaStoreRequestError,
    MetaStoreUriError,
    TransientMetaStoreError,
    UnknownBatchError,
)

T = TypeVar("T")
R = TypeVar("R", bound=BatchRecord | EndCheckpoint)

#: Marker and version of our schema; a file with another product or a newer version is refused.
PRODUCT = "tablestore-cdc-meta"
SCHEMA_VERSION = 1

_SCHEMA_TABLE = "cdc_meta_schema"
#: table -> its columns, in order; checked at open so a same-named foreign table is refused
_TABLES: dict[str, tuple[str, ...]] = {
    _SCHEMA_TABLE: ("key", "value"),
    "cdc_batches": ("ns", "uuid", "created_at", "state_rank", "record", "manifest"),
    "cdc_end_checkpoints": ("ns", "uuid", "channel_id", "record"),
    "cdc_namespaces": ("ns", "info"),
}
_DDL = (
    f"CREATE TABLE {_SCHEMA_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE cdc_batches (ns TEXT NOT NULL, uuid TEXT NOT NULL, created_at REAL NOT NULL,"
    " state_rank INTEGER NOT NULL, record TEXT NOT NULL, manifest TEXT,"
    " PRIMARY KEY (ns, uuid))",
    "CREATE TABLE cdc_end_checkpoints (ns TEXT NOT NULL, uuid TEXT NOT NULL,"
    " channel_id TEXT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (ns, uuid, channel_id))",
    "CREATE TABLE cdc_namespaces (ns TEXT PRIMARY KEY, info TEXT NOT NULL)",
)

#: committed-not-pushed batches are looked up on every commit (an index, not part of the
#: schema version: created when missing)
_STATE_INDEX = ("CREATE INDEX IF NOT EXISTS cdc_batches_state ON cdc_batches (ns, state_rank)")
#: sources' leases (added after the schema version: created when missing, like the index)
_LEASE_TABLE = "CREATE TABLE IF NOT EXISTS cdc_leases (key TEXT PRIMARY KEY, lease TEXT NOT NULL)"

#: SQLite result codes (primary, low byte) meaning "another connection holds the lock"
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
#: rows per ``IN (...)`` list (well under SQLite's variable limit)
_CHUNK = 500


def _is_locked(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    text = str(exc).lower()  # "database is locked", "table ... is locked", "database is busy"
    return (code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
            or "is locked" in text or "database is busy" in text)


def _chunks(values: Sequence[str]) -> Iterator[tuple[list[str], str]]:
    """``values`` in slices of ``_CHUNK``, each with its ``IN (...)`` placeholders."""
    for i in range(0, len(values), _CHUNK):
        chunk = list(values[i:i + _CHUNK])
        yield chunk, ", ".join("?" * len(chunk))


class SqliteUriQuery(UriQuery):
    """The query of a ``sqlite:///abs/path/meta.db?...`` URI (module docstring)."""

    credentials_hint: ClassVar[str] = "a SQLite file takes no credentials"

    busy_timeout_ms: int = Field(10_000, ge=1, le=600_000,
                                 description="an integer from 1 to 600000")
    lock_retries: int = Field(3, ge=0, le=100,
                              description="an integer from 0 to 100")


class SqliteMetaStore(MetaStore):
    """A meta table in one SQLite file (see the module docstring for the layout and the
    concurrency rules). Open with ``from_uri`` or ``meta_store.open_meta_store``; one instance
    per process, usable from several threads of that process (calls are serialized)."""

    def __init__(self, path: str, query: SqliteUriQuery) -> None:
        self.path = path
        self.busy_timeout_ms = query.busy_timeout_ms
        self.lock_retries = query.lock_retries
        self.uri = "sqlite://" + path + query_text(query)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = sqlite3.connect(
                path, timeout=self.busy_timeout_ms / 1000.0, isolation_level=None,
                check_same_thread=False,
            )
            self._run("open", self._init_schema)
        except MetaStoreUriError:
            self.close()
            raise
        except (sqlite3.Error, CorruptMetaRecordError, MetaStoreRequestError) as exc:
            self.close()
            reason = getattr(exc, "reason", None) or str(exc)
            raise MetaStoreUriError(uri=self.uri, reason=f"cannot open {path}: {reason}") from None

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def from_uri(cls, uri: str) -> SqliteMetaStore:
        """Open ``sqlite:///abs/path/meta.db[?busy_timeout_ms=..&lock_retries=..]``
        (driver, executors, CLI). Creates the file and schema when absent."""
        parts, refuse = split_store_uri(uri, "sqlite", SqliteUriQuery, user_info=True)
        if parts.netloc:
            raise refuse("the path must be absolute: sqlite:///abs/path/meta.db (three slashes); "
                         f"{parts.netloc.rpartition('@')[2]!r} was read as a host name")
        path = unquote(parts.path)
        if not path or not os.path.isabs(path) or path.endswith("/"):
            raise refuse("the path must be an absolute file path, as in sqlite:///abs/path/meta.db")
        if parts.fragment:
            raise refuse("a fragment (#...) is not allowed")
        query = parse_query(parts.query, SqliteUriQuery, refuse)
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            raise refuse(f"directory {directory!r} does not exist; create it first")
        if os.path.isdir(path):
            raise refuse(f"{path!r} is a directory, not a file")
        return cls(path, query)

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise MetaStoreUriError(
                    uri=self.uri, reason=f"cannot switch {self.path} to WAL mode (got {mode!r}); "
                    "put the file on a local file system",
                )
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("BEGIN IMMEDIATE")
        self._check_or_create(conn)  # a failure is rolled back by ``_run``
        conn.execute("COMMIT")

    def _check_or_create(self, conn: sqlite3.Connection) -> None:
        tables = {row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        if _SCHEMA_TABLE not in tables:
            if tables:
                raise MetaStoreUriError(
                    uri=self.uri, reason=f"{self.path} is an SQLite database but not a "
                    f"tablestore-cdc meta store (it has tables {', '.join(sorted(tables))} and no "
                    f"{_SCHEMA_TABLE}); use a new file",
                )
            for statement in (*_DDL, _STATE_INDEX, _LEASE_TABLE):
                conn.execute(statement)
            conn.executemany(
                f"INSERT INTO {_SCHEMA_TABLE} (key, value) VALUES (?, ?)",
                [("product", PRODUCT), ("schema_version", str(SCHEMA_VERSION))],
            )
            return
        for table, columns in _TABLES.items():
            found = tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
            if found != columns:
                raise MetaStoreUriError(
                    uri=self.uri, reason=f"{self.path}: table {table} has columns "
                    f"{list(found) or 'none (missing)'}, expected {list(columns)}; this file is "
                    "not a tablestore-cdc meta store or it is damaged",
                )
        marker = dict(conn.execute(f"SELECT key, value FROM {_SCHEMA_TABLE}").fetchall())
        if marker.get("product") != PRODUCT:
            raise MetaStoreUriError(
                uri=self.uri, reason=f"{self.path}: schema marker says product "
                f"{marker.get('product')!r}, expected {PRODUCT!r}; not a tablestore-cdc meta store",
            )
        version = marker.get("schema_version", "")
        if not version.isdigit() or int(version) != SCHEMA_VERSION:
            raise MetaStoreUriError(
                uri=self.uri, reason=f"{self.path} has meta-store schema version {version!r}; "
                f"this package reads version {SCHEMA_VERSION} (upgrade tablestore-cdc to open a "
                "newer file)",
            )
        conn.execute(_STATE_INDEX)
        conn.execute(_LEASE_TABLE)

    # --- transaction plumbing -------------------------------------------------------------

    def _run(self, operation: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` (one statement or one whole transaction) with bounded retries when the
        lock is still held by another process after ``busy_timeout_ms``."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise MetaStoreRequestError(store=self.uri, operation=operation,
                                            reason="the store is closed")
            for attempt in range(self.lock_retries + 1):
                try:
                    return fn(conn)
                except BaseException as exc:
                    # whatever failed (SQLite, a corrupt row, an interrupt): release the lock
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    if not isinstance(exc, sqlite3.Error):
                        raise
                    if not _is_locked(exc):
                        raise MetaStoreRequestError(
                            store=self.uri, operation=operation, reason=str(exc)) from None
                if attempt < self.lock_retries:
                    time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
            raise TransientMetaStoreError(
                detail=f"{self.uri}: {operation}: database is locked by another process "
                f"({self.lock_retries + 1} attempts of {self.busy_timeout_ms} ms each)",
            )

    def _write(self, operation: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside ``BEGIN IMMEDIATE ... COMMIT`` (retried whole when locked)."""

        def transaction(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            result = fn(conn)
            conn.execute("COMMIT")
            return result

        return self._run(operation, transaction)

    # --- row decoding ---------------------------------------------------------------------

    def _parse(self, model: type[R], key: str, record: Any) -> R:
        if not isinstance(record, str | bytes):
            raise self._corrupt(key, f"record column holds {type(record).__name__}, not JSON")
        return parse_record(model, record, store=self.uri, key=key)

    def _decode_batch(self, namespace: str, uuid: str, record: Any,
                      manifest: Any) -> BatchRecord:
        key = f"{namespace}/batch/{uuid}"
        batch = self._parse(BatchRecord, key, record)
        if batch.uuid != uuid:
            raise self._corrupt(key, f"the row holds batch {batch.uuid!r}")
        if manifest is not None:
            if not isinstance(manifest, str | bytes):
                raise self._corrupt(key, f"manifest column holds {type(manifest).__name__}")
            batch = batch.model_copy(update={"manifest": parse_manifest(self.uri, key, manifest)})
        return batch

    def _decode_end(self, namespace: str, uuid: str, channel_id: str, record: Any) -> EndCheckpoint:
        key = f"{namespace}/end/{uuid}/{channel_id}"
        end = self._parse(EndCheckpoint, key, record)
        if end.channel_id != channel_id:
            raise self._corrupt(key, f"the row holds channel {end.channel_id!r}")
        return end

    @staticmethod
    def _batch_json(batch: BatchRecord) -> str:
        return batch.model_dump_json(exclude={"manifest"})

    def _select_batch(self, conn: sqlite3.Connection, namespace: str,
                      uuid: str) -> BatchRecord | None:
        row = conn.execute(
            "SELECT record, manifest FROM cdc_batches WHERE ns = ? AND uuid = ?",
            (namespace, uuid),
        ).fetchone()
        return None if row is None else self._decode_batch(namespace, uuid, row[0], row[1])

    # --- primitives -----------------------------------------------------------------------

    def _put_batch_if_absent(self, namespace: str, record: BatchRecord) -> BatchRecord:
        manifest = (stored_manifest_json(self.uri, record.uuid, record.manifest)
                    if record.manifest is not None else None)

        def put(conn: sqlite3.Connection) -> BatchRecord:
            conn.execute(
                "INSERT OR IGNORE INTO cdc_batches"
                " (ns, uuid, created_at, state_rank, record, manifest)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (namespace, record.uuid, record.created_at, record.state.rank,
                 self._batch_json(record), manifest),
            )
            stored = self._select_batch(conn, namespace, record.uuid)
            assert stored is not None
            return stored

        return self._write("create_batch", put)

    def find_batch(self, namespace: str, uuid: str) -> BatchRecord | None:
        return self._run("get_batch", lambda conn: self._select_batch(conn, namespace, uuid))

    def _set_manifest_if_absent(
        self, namespace: str, uuid: str, manifest: Manifest
    ) -> BatchRecord:
        stored_json = stored_manifest_json(self.uri, uuid, manifest)

        def put(conn: sqlite3.Connection) -> BatchRecord:
            stored = self._select_batch(conn, namespace, uuid)
            if stored is None:
                raise UnknownBatchError(uuid=uuid, namespace=namespace)
            if stored.manifest is not None:
                return stored
            updated = with_manifest(stored, manifest)
            conn.execute(
                "UPDATE cdc_batches SET record = ?, manifest = ?, state_rank = ?"
                " WHERE ns = ? AND uuid = ? AND manifest IS NULL",
                (self._batch_json(updated), stored_json, updated.state.rank, namespace, uuid),
            )
            return updated

        return self._write("put_manifest", put)

    def _advance_state(
        self, namespace: str, uuid: str, state: BatchState, at: float,
        spark_batch_id: int | None = None,
    ) -> None:
        def advance(conn: sqlite3.Connection) -> None:
            stored = self._select_batch(conn, namespace, uuid)
            if stored is None or stored.state.rank >= state.rank:
                return
            updated = stored.model_copy(
                update={"state": state, **first_times(stored, state, at, spark_batch_id)})
            conn.execute(
                "UPDATE cdc_batches SET record = ?, state_rank = ?"
                " WHERE ns = ? AND uuid = ? AND state_rank < ?",
                (self._batch_json(updated), state.rank, namespace, uuid, state.rank),
            )

        self._write(f"mark {state.value}", advance)

    def _select_end(self, conn: sqlite3.Connection, namespace: str, uuid: str,
                    channel_id: str) -> EndCheckpoint | None:
        row = conn.execute(
            "SELECT record FROM cdc_end_checkpoints WHERE ns = ? AND uuid = ? AND channel_id = ?",
            (namespace, uuid, channel_id),
        ).fetchone()
        return None if row is None else self._decode_end(namespace, uuid, channel_id, row[0])

    def _put_end_if_absent(self, namespace: str, uuid: str, end: EndCheckpoint) -> EndCheckpoint:
        def put(conn: sqlite3.Connection) -> EndCheckpoint:
            conn.execute(
                "INSERT OR IGNORE INTO cdc_end_checkpoints (ns, uuid, channel_id, record)"
                " VALUES (?, ?, ?, ?)",
                (namespace, uuid, end.channel_id, end.model_dump_json()),
            )
            stored = self._select_end(conn, namespace, uuid, end.channel_id)
            assert stored is not None
            return stored

        return self._write("put_end_checkpoint", put)

    def get_end_checkpoint(self, namespace: str, uuid: str,
                           channel_id: str) -> EndCheckpoint | None:
        return self._run("get_end_checkpoint",
                         lambda conn: self._select_end(conn, namespace, uuid, channel_id))

    def _list_ends(self, namespace: str, uuid: str) -> list[EndCheckpoint]:
        rows = self._run("get_end_checkpoints", lambda conn: conn.execute(
            "SELECT channel_id, record FROM cdc_end_checkpoints WHERE ns = ? AND uuid = ?"
            " ORDER BY channel_id", (namespace, uuid),
        ).fetchall())
        return [self._decode_end(namespace, uuid, channel, record) for channel, record in rows]

    def _select_batches(self, namespace: str, where: str = "", *params: Any,
                        unread: bool = False) -> list[BatchRecord]:
        """The namespace's batches (``where``: more conditions), oldest first; ``unread``: a
        planned batch's manifest is not read, ``UNREAD_MANIFEST`` stands for it."""
        column = "manifest IS NOT NULL" if unread else "manifest"
        rows = self._run("list_batches", lambda conn: conn.execute(
            f"SELECT uuid, record, {column} FROM cdc_batches WHERE ns = ?{where}"
            " ORDER BY created_at, uuid", (namespace, *params),
        ).fetchall())
        batches = []
        for uuid, record, cell in rows:
            batch = self._decode_batch(namespace, uuid, record, None if unread else cell)
            batches.append(batch.model_copy(update={"manifest": UNREAD_MANIFEST})
                           if unread and cell else batch)
        return batches

    def _list_batches(self, namespace: str) -> list[BatchRecord]:
        return self._select_batches(namespace)

    def _list_batches_for_retention(self, namespace: str) -> list[BatchRecord]:
        return self._select_batches(namespace, unread=True)

    def _list_batches_in_state(self, namespace: str, state: BatchState) -> list[BatchRecord]:
        return self._select_batches(namespace, " AND state_rank = ?", state.rank)

    def _list_ends_of(self, namespace: str, uuids: Sequence[str]
                      ) -> dict[str, list[EndCheckpoint]]:
        def select(conn: sqlite3.Connection) -> list[Any]:
            return [row for chunk, marks in _chunks(uuids) for row in conn.execute(
                "SELECT uuid, channel_id, record FROM cdc_end_checkpoints WHERE ns = ?"
                f" AND uuid IN ({marks}) ORDER BY uuid, channel_id", (namespace, *chunk),
            ).fetchall()]

        out: dict[str, list[EndCheckpoint]] = {u: [] for u in uuids}
        for uuid, channel, record in self._run("get_end_checkpoints", select):
            out[uuid].append(self._decode_end(namespace, uuid, channel, record))
        return out

    def _delete_batches(self, namespace: str, uuids: Sequence[str]) -> None:
        unique = list(dict.fromkeys(uuids))

        def delete(conn: sqlite3.Connection) -> None:
            for table in ("cdc_end_checkpoints", "cdc_batches"):  # ends first
                for chunk, marks in _chunks(unique):
                    conn.execute(f"DELETE FROM {table} WHERE ns = ? AND uuid IN ({marks})",
                                 (namespace, *chunk))

        if unique:
            self._write("gc", delete)

    def list_namespaces(self) -> list[str]:
        """Namespaces that have a description (``set_namespace_info``), sorted. CLI, read-only."""
        rows = self._run("list_namespaces", lambda conn: conn.execute(
            "SELECT ns FROM cdc_namespaces ORDER BY ns").fetchall())
        return self._sorted_namespaces(row[0] for row in rows)

    def set_namespace_info(self, namespace: str, info: dict[str, str]) -> None:
        payload = namespace_info_json(info)
        self._write("set_namespace_info", lambda conn: conn.execute(
            "INSERT INTO cdc_namespaces (ns, info) VALUES (?, ?)"
            " ON CONFLICT (ns) DO UPDATE SET info = excluded.info", (namespace, payload),
        ))

    def get_namespace_info(self, namespace: str) -> dict[str, str] | None:
        row = self._run("get_namespace_info", lambda conn: conn.execute(
            "SELECT info FROM cdc_namespaces WHERE ns = ?", (namespace,)).fetchone())
        return None if row is None else self._parse_namespace_info(f"{namespace}/info", row[0])

    def _get_lease_json(self, key: str) -> str | None:
        row = self._run("get_lease", lambda conn: conn.execute(
            "SELECT lease FROM cdc_leases WHERE key = ?", (key,)).fetchone())
        return None if row is None else str(row[0])

    def _swap_lease_json(self, key: str, expected: str | None, new: str) -> bool:
        def swap(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT lease FROM cdc_leases WHERE key = ?", (key,)).fetchone()
            if (None if row is None else row[0]) != expected:
                return False
            conn.execute("INSERT INTO cdc_leases (key, lease) VALUES (?, ?) ON CONFLICT (key)"
                         " DO UPDATE SET lease = excluded.lease", (key, new))
            return True

        return self._write("take_lease", swap)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
