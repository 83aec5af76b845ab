"""Rows (``cdc_rows``): what the row API writes and reads, one change record per write.

``LocalTablestore.put_row`` / ``update_row`` / ``delete_row`` / ``batch_write`` come here in a
writer process (a CLI, a demo, a test, the emulator's table API), inside one write transaction:
``write_batch`` validates every operation, applies each to the row and appends its change to
the channel owning the key (``changelog.append_changes``, one statement for the batch),
then seals full segments
(``segments.seal``). The reads serve ``get_row`` / ``scan`` / ``count_rows`` and the tunnel
service's base-data snapshot (``rows_in_hash_range``, on the driver when a tunnel is created).

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

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from connector.errors import InvalidRowError
from connector.tunnel.base import Op, TableSchema
from connector.tunnel.local.changelog import NewChange, append_changes
from connector.tunnel.local.channels import ChannelRow, channel_rows
from connector.tunnel.local.names import name_problem
from connector.tunnel.local.segments import seal
from connector.tunnel.local.values import check_value, dumps_values, key_hash, loads_values

#: one operation of ``batch_write``: ``("put"|"update"|"delete", pk, columns)``
WriteOp = tuple[str, Mapping[str, Any], Mapping[str, Any] | None]


def write_batch(conn: sqlite3.Connection, schema: TableSchema, ops: Sequence[Any]) -> None:
    """Inside a write transaction: validate every operation, then apply them in order, each
    appending its own change record; then seal the segments the writes completed."""
    table = schema.table_name
    prepared = [validate_operation(schema, i, op) for i, op in enumerate(ops)]
    if not prepared:
        return
    open_channels = [c for c in channel_rows(conn, table) if not c.closed]
    now_us = time.time_ns() // 1000
    heads = {c.channel_id: c.head_seq for c in open_channels}  # this transaction's to move
    changes: list[NewChange] = []
    for kind, pk_json, cols in prepared:
        changes.append(_apply(conn, table, open_channels, heads, kind, pk_json, cols, now_us))
    moved = {c.channel_id: heads[c.channel_id] for c in open_channels
             if heads[c.channel_id] != c.head_seq}
    append_changes(conn, table, changes, moved)  # one statement each for the whole batch
    for channel in open_channels:
        if channel.channel_id in moved:
            seal(conn, schema, channel, moved[channel.channel_id])


def validate_operation(
    schema: TableSchema, index: int, op: Any
) -> tuple[str, str, dict[str, Any] | None]:
    """``(kind, key JSON, checked columns or None for a delete)`` of operation #``index``, or
    ``InvalidRowError`` naming the table, the column and what is wrong."""
    table = schema.table_name

    def bad(reason: str) -> InvalidRowError:
        return InvalidRowError(table=table, reason=reason)

    try:
        kind, pk, cols = op
    except (TypeError, ValueError):
        raise bad(f"operation #{index} must be (kind, pk, columns), got {op!r}") from None
    if kind not in ("put", "update", "delete"):
        raise bad(f"operation #{index}: kind {kind!r} is not put/update/delete")
    if not isinstance(pk, Mapping):
        raise bad(f"primary key must be a dict, got {pk!r}")
    declared = [c.name for c in schema.primary_key]
    missing = [c for c in declared if c not in pk]
    if missing:
        raise bad(f"primary key column {missing[0]!r} is missing")
    unknown = [c for c in pk if c not in declared]
    if unknown:
        raise bad(f"column {unknown[0]!r} is not a primary key column "
                  f"(key columns: {', '.join(declared)})")
    key = {
        c.name: check_value(table, c.name, c.type, pk[c.name], key=True)
        for c in schema.primary_key
    }
    if kind == "delete":
        return kind, dumps_values(key), None
    if not isinstance(cols, Mapping):
        raise bad(f"columns must be a dict, got {cols!r}")
    if kind == "update" and not cols:
        raise bad("update_row needs at least one column")
    types = {c.name: c.type for c in schema.columns}
    checked: dict[str, Any] = {}
    for name, value in cols.items():
        if not isinstance(name, str) or not name:
            raise bad(f"column name {name!r} is not valid")
        problem = name_problem(name)
        if problem is not None:
            raise bad(f"column name {name!r}: {problem}")
        if name in key:
            raise bad(f"column {name!r} is a primary key column, not an attribute")
        if value is None:
            if kind == "put":
                raise bad(f"column {name!r} is None; omit it in put_row")
            checked[name] = None
            continue
        checked[name] = check_value(table, name, types.get(name), value, key=False)
    return kind, dumps_values(key), checked


def _apply(
    conn: sqlite3.Connection,
    table: str,
    open_channels: list[ChannelRow],
    heads: dict[str, int],
    kind: str,
    pk_json: str,
    cols: dict[str, Any] | None,
    now_us: int,
) -> NewChange:
    """Apply one change to its row; returns its change record, with the next sequence of its
    channel (``heads`` moves on), for ``changelog.append_changes``."""
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
        record_cols = dumps_values(cols)
        if kind == "put":  # the row is the record's columns (no None in a put)
            op, row_json = Op.PUT, record_cols
        else:
            op = Op.UPDATE
            new = loads_values(before_json) if before_json else {}
            new.update(cols)
            row_json = dumps_values({k: v for k, v in new.items() if v is not None})
        conn.execute(
            "INSERT INTO cdc_rows (table_name, pk, key_hash, attrs) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (table_name, pk) DO UPDATE SET attrs = excluded.attrs",
            (table, pk_json, h, row_json),
        )
    seq = heads[channel.channel_id] = heads[channel.channel_id] + 1
    return channel.channel_id, seq, op, pk_json, record_cols, before_json, now_us


# --- reads (inside a transaction) ----------------------------------------------------------------


def get_row(conn: sqlite3.Connection, schema: TableSchema, pk: Any) -> dict[str, Any] | None:
    """The row's attribute columns, or ``None`` if there is no such row (a bad key raises
    ``InvalidRowError`` as a write would)."""
    _, pk_json, _ = validate_operation(schema, 0, ("delete", pk, None))
    row = conn.execute(
        "SELECT attrs FROM cdc_rows WHERE table_name = ? AND pk = ?",
        (schema.table_name, pk_json),
    ).fetchone()
    return loads_values(row[0]) if row else None


def _key_column_bounds(where: list[str], params: list[Any], column: str,
                       *bounds: tuple[Any, str]) -> None:
    """Add to a query's ``where`` and ``params`` a test of key column ``column``'s value (read
    from the key's JSON) for each (value, comparison) bound whose value is not None."""
    path = f"$.{json.dumps(column)}"  # a JSON path naming the key column, quoted
    for value, test in bounds:
        if isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value):
            raise InvalidRowError(table=params[0], reason=f"a bound of key column {column!r} "
                                  f"is not UTF-8 text: {value!r}")
        if value is not None:
            where.append(f"json_extract(pk, ?) {test} ?")
            params += [path, value]


def scan(conn: sqlite3.Connection, table: str, column: str | None = None, low: Any = None,
         high: Any = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every live row as (primary key, attribute columns); with ``column`` (an INTEGER or
    STRING key column), those whose value of it is in ``[low, high]`` (None: unbounded on that
    side), chosen in SQL from the key's JSON (SQLite compares integers as numbers and text by
    its UTF-8 bytes, as Tablestore orders keys)."""
    where, params = ["table_name = ?"], [table]
    if column is not None:
        _key_column_bounds(where, params, column, (low, ">="), (high, "<="))
    rows = conn.execute(f"SELECT pk, attrs FROM cdc_rows WHERE {' AND '.join(where)}",
                        params).fetchall()
    return [(loads_values(pk), loads_values(attrs)) for pk, attrs in rows]


def scan_page(conn: sqlite3.Connection, table: str, after_pk: str | None, limit: int,
              column: str | None = None, low: Any = None, high: Any = None
              ) -> list[tuple[str, str]]:
    """Up to ``limit`` rows as ``(pk_json, attrs_json)`` in key-JSON order, after the row whose
    key JSON is ``after_pk`` (None: from the first): one page of a scan that holds no read
    transaction between pages (``LocalTablestore.scan_pages``). With ``column``, only the rows
    whose key column ``column`` is in ``[low, high)`` (None: unbounded on that side), chosen in
    SQL from the key's JSON."""
    where, params = ["table_name = ?"], [table]
    if after_pk is not None:
        where.append("pk > ?")
        params.append(after_pk)
    if column is not None:
        _key_column_bounds(where, params, column, (low, ">="), (high, "<"))
    return conn.execute(
        f"SELECT pk, attrs FROM cdc_rows WHERE {' AND '.join(where)} ORDER BY pk LIMIT ?",
        (*params, limit)).fetchall()


def count_rows(conn: sqlite3.Connection, table: str) -> int:
    (n,) = conn.execute(
        "SELECT count(*) FROM cdc_rows WHERE table_name = ?", (table,)
    ).fetchone()
    return int(n)


def rows_in_hash_range(
    conn: sqlite3.Connection, table: str, lo: int, hi: int
) -> list[tuple[str, str]]:
    """``(pk_json, attrs_json)`` of the rows hashing into [lo, hi), in a stable order (the
    tunnel service's base-data snapshot)."""
    return conn.execute(
        "SELECT pk, attrs FROM cdc_rows WHERE table_name = ? AND key_hash >= ? "
        "AND key_hash < ? ORDER BY key_hash, pk",
        (table, lo, hi),
    ).fetchall()


__all__ = [
    "WriteOp",
    "count_rows",
    "get_row",
    "rows_in_hash_range",
    "scan",
    "scan_page",
    "validate_operation",
    "write_batch",
]
