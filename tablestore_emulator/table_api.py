"""The table API of the emulator: tables and rows over the embedded store.

Called by ``server`` (one thread per connection) with an authenticated request body; each
route decodes the request with the SDK's generated protobuf classes and PlainBuffer
(``plainbuffer``), acts on ``ctx.store`` (a ``LocalTablestore``) and returns the serialized
response. Service errors are raised as ``OtsError`` with the service's codes and statuses.

How Tablestore maps onto the embedded store (a table is a store table, its defined columns
declared ones, ``ctx.channels`` channels each; every row write one store write, whose record
carries the before-image; one version per cell) is docs/emulator.md's "How Tablestore maps
onto the embedded store".

Row conditions (row existence, and column conditions: single-column comparisons combined with
AND/OR/NOT) are checked and applied under ``ctx.write_lock``, so they are atomic for all
clients of this emulator (not against other processes writing the store file directly).
Read filters (``column_filter`` of GetRow/GetRange/BatchGetRow) are not supported.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tablestore.protobuf import table_store_filter_pb2 as fpb
from tablestore.protobuf import table_store_pb2 as pb

from connector.errors import (
    InvalidRowError,
    TableExistsError,
    TransientTunnelError,
    UnknownTableError,
)
from connector.tunnel.base import TableSchema
from connector.tunnel.tablestore.plainbuffer import CellOp, Row, Special
from connector.tunnel.tablestore.proto_text import invalid_string_field
from tablestore_emulator import column_filter
from tablestore_emulator import plainbuffer as plb
from tablestore_emulator.context import EmulatorContext, Handler
from tablestore_emulator.errors import (
    OtsError,
    condition_check_fail,
    object_already_exist,
    object_not_exist,
    parameter_invalid,
    server_unavailable,
    unsupported_operation,
)

# --- the service's limits that the emulator enforces ------------------------------------------

#: Table and column names: a letter or underscore, then letters, digits, underscores.
#: Matched whole (``fullmatch``): a trailing newline is not part of a name.
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
MAX_PK_COLUMNS = 4
MAX_PK_STRING_BYTES = 1024
MAX_COLUMN_VALUE_BYTES = 2 * 1024 * 1024
MAX_COLUMNS_PER_WRITE = 1024
MAX_BATCH_WRITE_ROWS = 200
MAX_BATCH_GET_ROWS = 100
#: A GetRange page stops at this many rows or bytes (the service's 5000 rows / 4 MB).
MAX_RANGE_ROWS = 5000
MAX_RANGE_BYTES = 4 * 1024 * 1024

_PK_TYPES = {pb.INTEGER: "INTEGER", pb.STRING: "STRING", pb.BINARY: "BINARY"}
_PK_TYPE_ENUM = {v: k for k, v in _PK_TYPES.items()}
_DEFINED_TYPES = {
    pb.DCT_INTEGER: "INTEGER",
    pb.DCT_DOUBLE: "DOUBLE",
    pb.DCT_BOOLEAN: "BOOLEAN",
    pb.DCT_STRING: "STRING",
    pb.DCT_BLOB: "BINARY",
}
_DEFINED_TYPE_ENUM = {v: k for k, v in _DEFINED_TYPES.items()}


# --- helpers ------------------------------------------------------------------------------


def _parse(message: Any, body: bytes) -> Any:
    try:
        message.ParseFromString(body)
    except Exception as exc:  # DecodeError, or a proto2 required field missing
        raise parameter_invalid(f"Invalid request body: {exc}.") from None
    bad = invalid_string_field(message)  # proto2: the runtime leaves string bytes unchecked
    if bad is not None:
        raise parameter_invalid(f"Invalid request body: field {bad} is not UTF-8 text.")
    return message


def _store_call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call the store, turning its typed errors into the service's."""
    try:
        return fn(*args)
    except UnknownTableError:
        raise object_not_exist() from None
    except TableExistsError:
        raise object_already_exist() from None
    except InvalidRowError as exc:
        raise parameter_invalid(str(exc)) from None
    except TransientTunnelError as exc:
        raise server_unavailable(f"Store is busy: {exc}") from None


def _schema(ctx: EmulatorContext, table: str) -> TableSchema:
    return _store_call(ctx.store.table_schema, table)  # type: ignore[no-any-return]


def _check_name(kind: str, name: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise parameter_invalid(f"Invalid {kind} name: '{name}'.")


def _value_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes | bytearray):
        return len(value)
    return 8


def _vt_name(value: Any) -> str:
    if isinstance(value, bool):
        return "VT_BOOLEAN"
    if isinstance(value, int):
        return "VT_INTEGER"
    if isinstance(value, str):
        return "VT_STRING"
    if isinstance(value, bytes):
        return "VT_BLOB"
    return repr(value)


def _key(
    schema: TableSchema, pk: Sequence[tuple[str, Any]], *, bounds: bool = False
) -> dict[str, Any]:
    """A request's key checked against the table's: names, order, types (bounds may be INF)."""
    declared = schema.primary_key
    if len(pk) != len(declared):
        raise parameter_invalid(
            f"Validate PK size fail. Input: {len(pk)}, Meta: {len(declared)}."
        )
    out: dict[str, Any] = {}
    for (name, value), spec in zip(pk, declared, strict=True):
        if name != spec.name:
            raise parameter_invalid(f"Validate PK name fail. Input: {name}, Meta: {spec.name}.")
        if value is Special.INF_MIN or value is Special.INF_MAX:
            if not bounds:
                raise parameter_invalid("INF_MIN or INF_MAX is only allowed in a range bound.")
        elif value is Special.AUTO_INCREMENT:
            raise unsupported_operation("Auto-increment primary key columns are not supported.")
        else:
            meta = "VT_BLOB" if spec.type == "BINARY" else f"VT_{spec.type}"
            if _vt_name(value) != meta:
                raise parameter_invalid(
                    f"Validate PK type fail. Input: {_vt_name(value)}, Meta: {meta}."
                )
            if spec.type != "INTEGER" and _value_size(value) > MAX_PK_STRING_BYTES:
                raise parameter_invalid(
                    f"The length of primary key column '{name}' exceeds "
                    f"{MAX_PK_STRING_BYTES} bytes."
                )
        out[name] = value
    return out


def _check_attribute(name: str, value: Any) -> None:
    _check_name("column", name)
    if value is not None and _value_size(value) > MAX_COLUMN_VALUE_BYTES:
        raise parameter_invalid(
            f"The length of attribute column: '{name}' exceeds the MaxLength:"
            f"{MAX_COLUMN_VALUE_BYTES} with CurrentLength:{_value_size(value)}."
        )


def _check_condition(condition: Any, current: Mapping[str, Any] | None) -> None:
    """Raise ``OTSConditionCheckFail`` unless the row's existence and column condition hold."""
    expected = {pb.EXPECT_EXIST: True, pb.EXPECT_NOT_EXIST: False}.get(condition.row_existence)
    if expected is not None and expected != (current is not None):
        raise condition_check_fail()
    if condition.HasField("column_condition") and condition.column_condition:
        if not _filter_passes(condition.column_condition, current or {}):
            raise condition_check_fail()


def _filter_passes(raw: bytes, row: Mapping[str, Any]) -> bool:
    """A column condition (``table_store_filter.Filter``) evaluated on the current row: decoded
    in one bounded pass (``column_filter``), then evaluated on the tree (at most
    ``MAX_FILTER_DEPTH`` deep)."""
    return _node_passes(column_filter.decode_filter(raw), row)


def _node_passes(node: column_filter.Single | column_filter.Composite,
                 row: Mapping[str, Any]) -> bool:
    if isinstance(node, column_filter.Single):
        if node.column_name not in row:
            return not node.filter_if_missing
        return _compare(node.comparator, row[node.column_name],
                        plb.read_value(node.column_value))
    results = [_node_passes(sub, row) for sub in node.subs]
    if node.combinator == fpb.LO_NOT:
        return not results[0]
    return all(results) if node.combinator == fpb.LO_AND else any(results)


def _compare(comparator: int, have: Any, want: Any) -> bool:
    numeric = (int, float)
    if isinstance(have, bool) != isinstance(want, bool) or not (
        type(have) is type(want)
        or (isinstance(have, numeric) and isinstance(want, numeric))
    ):
        return comparator == fpb.CT_NOT_EQUAL  # values of different types are never equal
    ops: dict[int, Callable[[Any, Any], bool]] = {
        fpb.CT_EQUAL: lambda a, b: a == b,
        fpb.CT_NOT_EQUAL: lambda a, b: a != b,
        fpb.CT_GREATER_THAN: lambda a, b: a > b,
        fpb.CT_GREATER_EQUAL: lambda a, b: a >= b,
        fpb.CT_LESS_THAN: lambda a, b: a < b,
        fpb.CT_LESS_EQUAL: lambda a, b: a <= b,
    }
    if comparator not in ops:
        raise unsupported_operation(f"Comparator {comparator} is not supported.")
    return ops[comparator](have, want)


def _consumed(read_bytes: int = 0, write_bytes: int = 0) -> Any:
    """Capacity units as estimates: 4 KB a unit, rounded up (a read reports at least 1 byte)."""
    cu = pb.CapacityUnit(read=math.ceil(read_bytes / 4096), write=math.ceil(write_bytes / 4096))
    return pb.ConsumedCapacity(capacity_unit=cu)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _row_bytes(
    schema: TableSchema,
    pk: Mapping[str, Any],
    attrs: Mapping[str, Any],
    columns_to_get: Sequence[str],
) -> bytes:
    """A stored row in the service's reply form; ``b""`` when the selection leaves nothing."""
    wanted = set(columns_to_get)
    key_names = [c.name for c in schema.primary_key]
    if wanted:
        cells = sorted((k, v) for k, v in attrs.items() if k in wanted)
        if not cells and not wanted.intersection(key_names):
            return b""
    else:
        cells = sorted(attrs.items())
    return plb.write_row([(n, pk[n]) for n in key_names], cells, _now_ms())


def _return_pk(schema: TableSchema, key: Mapping[str, Any], return_content: Any) -> bytes:
    if return_content.return_type == pb.RT_PK:
        return plb.write_row([(c.name, key[c.name]) for c in schema.primary_key])
    return b""


# --- tables -------------------------------------------------------------------------------


def create_table(ctx: EmulatorContext, body: bytes) -> bytes:
    req = _parse(pb.CreateTableRequest(), body)
    meta = req.table_meta
    _check_name("table", meta.table_name)
    if not 1 <= len(meta.primary_key) <= MAX_PK_COLUMNS:
        raise parameter_invalid(
            f"The number of primary key columns must be in range: [1, {MAX_PK_COLUMNS}]."
        )
    key: list[tuple[str, str]] = []
    for col in meta.primary_key:
        _check_name("column", col.name)
        if col.HasField("option"):
            raise unsupported_operation("Auto-increment primary key columns are not supported.")
        if col.type not in _PK_TYPES:
            raise parameter_invalid(f"Unsupported primary key type for column '{col.name}'.")
        key.append((col.name, _PK_TYPES[col.type]))
    defined: list[tuple[str, str]] = []
    for col in meta.defined_column:
        _check_name("column", col.name)
        defined.append((col.name, _DEFINED_TYPES[col.type]))
    if len(req.index_metas):
        raise unsupported_operation("Secondary indexes are not supported.")
    with ctx.write_lock:
        _store_call(ctx.store.create_table, meta.table_name, key, defined, ctx.channels)
    return pb.CreateTableResponse().SerializeToString()


def list_table(ctx: EmulatorContext, body: bytes) -> bytes:
    _parse(pb.ListTableRequest(), body)
    names = _store_call(ctx.store.list_tables)
    return pb.ListTableResponse(table_names=names).SerializeToString()  # type: ignore[no-any-return]


def describe_table(ctx: EmulatorContext, body: bytes) -> bytes:
    req = _parse(pb.DescribeTableRequest(), body)
    schema = _schema(ctx, req.table_name)
    resp = pb.DescribeTableResponse()
    resp.table_meta.table_name = schema.table_name
    for c in schema.primary_key:
        resp.table_meta.primary_key.add(name=c.name, type=_PK_TYPE_ENUM[c.type])
    for c in schema.columns:
        resp.table_meta.defined_column.add(name=c.name, type=_DEFINED_TYPE_ENUM[c.type])
    resp.reserved_throughput_details.capacity_unit.read = 0
    resp.reserved_throughput_details.capacity_unit.write = 0
    resp.reserved_throughput_details.last_increase_time = 0
    # Data never expires and one version is kept: what the emulator actually does.
    resp.table_options.time_to_live = -1
    resp.table_options.max_versions = 1
    resp.table_options.deviation_cell_version_in_sec = 86400
    resp.table_options.allow_update = True
    resp.stream_details.enable_stream = False
    return resp.SerializeToString()  # type: ignore[no-any-return]


def delete_table(ctx: EmulatorContext, body: bytes) -> bytes:
    req = _parse(pb.DeleteTableRequest(), body)
    _schema(ctx, req.table_name)
    with ctx.write_lock:
        _store_call(ctx.store.drop_table, req.table_name)
    return pb.DeleteTableResponse().SerializeToString()  # type: ignore[no-any-return]


# --- single-row writes and reads ------------------------------------------------------------


def _put(ctx: EmulatorContext, table: str, key: dict[str, Any], row: Row, condition: Any) -> int:
    if len(row.cells) > MAX_COLUMNS_PER_WRITE:
        raise parameter_invalid(f"The number of columns exceeds {MAX_COLUMNS_PER_WRITE}.")
    columns: dict[str, Any] = {}
    for cell in row.cells:
        if cell.op is not CellOp.PUT:
            raise parameter_invalid(f"Column '{cell.name}' of a PutRow has no value.")
        _check_attribute(cell.name, cell.value)
        columns[cell.name] = cell.value
    with ctx.write_lock:
        _check_condition(condition, _store_call(ctx.store.get_row, table, key))
        _store_call(ctx.store.put_row, table, key, columns)
    return sum(len(k) + _value_size(v) for k, v in columns.items())


def _update(ctx: EmulatorContext, table: str, key: dict[str, Any], row: Row,
            condition: Any) -> int:
    if not row.cells:
        raise parameter_invalid("No attribute column is specified in UpdateRow.")
    if len(row.cells) > MAX_COLUMNS_PER_WRITE:
        raise parameter_invalid(f"The number of columns exceeds {MAX_COLUMNS_PER_WRITE}.")
    for cell in row.cells:
        _check_attribute(cell.name, cell.value)
    size = 0
    with ctx.write_lock:
        current = _store_call(ctx.store.get_row, table, key)
        _check_condition(condition, current)
        changes: dict[str, Any] = {}
        for cell in row.cells:
            if cell.op in (CellOp.DELETE_ALL_VERSION, CellOp.DELETE_ONE_VERSION):
                changes[cell.name] = None
            elif cell.op is CellOp.INCREMENT:
                old = (current or {}).get(cell.name, 0)
                if not isinstance(cell.value, int) or isinstance(cell.value, bool) or (
                    not isinstance(old, int) or isinstance(old, bool)
                ):
                    raise parameter_invalid(f"Increment of column '{cell.name}' needs integers.")
                changes[cell.name] = old + cell.value
            else:  # a put: the decoder refuses a put without a value
                changes[cell.name] = cell.value
            size += len(cell.name) + _value_size(changes[cell.name])
        _store_call(ctx.store.update_row, table, key, changes)
    return size


def _delete(ctx: EmulatorContext, table: str, key: dict[str, Any], row: Row,
            condition: Any) -> int:
    if condition.row_existence == pb.EXPECT_NOT_EXIST:
        raise parameter_invalid("Invalid condition: EXPECT_NOT_EXIST while deleting row.")
    with ctx.write_lock:
        _check_condition(condition, _store_call(ctx.store.get_row, table, key))
        _store_call(ctx.store.delete_row, table, key)
    return 0


def _write(ctx: EmulatorContext, write: Callable[..., int], table: str, row_bytes: bytes,
           condition: Any, return_content: Any) -> tuple[bytes, Any]:
    """One row write (``_put``, ``_update`` or ``_delete``: each returns the bytes of the
    attributes it wrote), alone or in a batch: the key read and checked against the table's
    first; returns the answer's row and consumed capacity."""
    schema = _schema(ctx, table)
    row = plb.read_row(row_bytes)
    key = _key(schema, row.primary_key)
    size = write(ctx, table, key, row, condition) + sum(_value_size(v) for v in key.values())
    return _return_pk(schema, key, return_content), _consumed(write_bytes=size)


def _write_route(request: Any, response: Any, write: Callable[..., int], field: str) -> Handler:
    """The route of one single-row write: the request's ``field`` holds the row."""

    def route(ctx: EmulatorContext, body: bytes) -> bytes:
        req = _parse(request(), body)
        row, consumed = _write(ctx, write, req.table_name, getattr(req, field), req.condition,
                               req.return_content)
        return bytes(response(consumed=consumed, row=row).SerializeToString())

    return route


put_row = _write_route(pb.PutRowRequest, pb.PutRowResponse, _put, "row")
update_row = _write_route(pb.UpdateRowRequest, pb.UpdateRowResponse, _update, "row_change")
delete_row = _write_route(pb.DeleteRowRequest, pb.DeleteRowResponse, _delete, "primary_key")


def _get(
    ctx: EmulatorContext, table: str, pk_bytes: bytes, columns_to_get: Sequence[str]
) -> tuple[bytes, Any]:
    """One row read, alone or in a batch: the answer's row and consumed capacity."""
    schema = _schema(ctx, table)
    key = _key(schema, plb.read_row(pk_bytes).primary_key)
    attrs = _store_call(ctx.store.get_row, table, key)
    row = b"" if attrs is None else _row_bytes(schema, key, attrs, columns_to_get)
    return row, _consumed(read_bytes=max(len(row), 1))


def get_row(ctx: EmulatorContext, body: bytes) -> bytes:
    req = _parse(pb.GetRowRequest(), body)
    if req.HasField("filter") and req.filter:
        raise unsupported_operation("Filters are not supported.")
    row, consumed = _get(ctx, req.table_name, req.primary_key, list(req.columns_to_get))
    return bytes(pb.GetRowResponse(consumed=consumed, row=row).SerializeToString())


# --- range reads ----------------------------------------------------------------------------


def _order_key(schema: TableSchema, key: Mapping[str, Any]) -> tuple[tuple[Any, ...], ...]:
    """Tablestore's key order: column by column; INF_MIN below and INF_MAX above any value.

    Integers compare as numbers, strings by their UTF-8 bytes (= code point order), binaries
    by bytes.
    """
    out = []
    for c in schema.primary_key:
        v = key[c.name]
        out.append((0,) if v is Special.INF_MIN else (2,) if v is Special.INF_MAX else (1, v))
    return tuple(out)


def _first_column_span(schema: TableSchema, low: tuple[tuple[Any, ...], ...],
                       high: tuple[tuple[Any, ...], ...]) -> tuple[str, Any, Any]:
    """The first key column and the span ``[low, high]`` of its values that rows between the
    order keys ``low`` and ``high`` can have (None: unbounded; always unbounded for a BINARY
    column, which the store's JSON does not order): the store picks the rows in SQL, and
    ``get_range`` keeps the exact range of them."""
    first = schema.primary_key[0]

    def bound(order_key: tuple[tuple[Any, ...], ...]) -> Any:
        return order_key[0][1] if order_key[0][0] == 1 and first.type != "BINARY" else None

    return first.name, bound(low), bound(high)


def get_range(ctx: EmulatorContext, body: bytes) -> bytes:
    """One page of rows between two keys, with ``next_start_primary_key`` when it stops early.

    A page ends at the request's ``limit``, ``MAX_RANGE_ROWS`` rows or ``MAX_RANGE_BYTES``
    bytes (``ctx.range_page_rows`` can lower the row cap, for tests). Reads the rows whose
    first key column is in the range's span (chosen by the store in SQL) and sorts them (the
    store keeps no key order): fine for an emulator's table sizes.
    """
    req = _parse(pb.GetRangeRequest(), body)
    if req.HasField("filter") and req.filter:
        raise unsupported_operation("Filters are not supported.")
    schema = _schema(ctx, req.table_name)
    start = _order_key(schema, _key(schema, plb.read_row(req.inclusive_start_primary_key)
                                    .primary_key, bounds=True))
    end = _order_key(schema, _key(schema, plb.read_row(req.exclusive_end_primary_key)
                                  .primary_key, bounds=True))
    if req.HasField("limit") and req.limit <= 0:
        raise parameter_invalid("The limit must be greater than 0.")
    forward = req.direction == pb.FORWARD
    if (start > end) if forward else (start < end):
        raise parameter_invalid(
            "Begin key must less than end key in FORWARD" if forward
            else "Begin key must more than end key in BACKWARD"
        )
    cap = min(MAX_RANGE_ROWS, ctx.range_page_rows)
    if req.HasField("limit"):
        cap = min(cap, req.limit)
    rows = _store_call(ctx.store.scan_span, req.table_name, *_first_column_span(
        schema, start if forward else end, end if forward else start))
    keyed = [(_order_key(schema, pk), pk, attrs) for pk, attrs in rows]
    if forward:
        selected = sorted((r for r in keyed if start <= r[0] < end), key=lambda r: r[0])
    else:
        selected = sorted((r for r in keyed if end < r[0] <= start), key=lambda r: r[0],
                          reverse=True)
    columns = list(req.columns_to_get)
    encoded: list[bytes] = []
    total = 0
    next_key: Mapping[str, Any] | None = None
    for i, (_, pk, attrs) in enumerate(selected):
        if len(encoded) >= cap or total >= MAX_RANGE_BYTES:
            next_key = selected[i][1]
            break
        row = _row_bytes(schema, pk, attrs, columns)
        if row:
            encoded.append(row)
            total += len(row)
    resp = pb.GetRangeResponse(consumed=_consumed(read_bytes=max(total, 1)))
    resp.rows = plb.write_rows(encoded)
    if next_key is not None:
        resp.next_start_primary_key = plb.write_row(
            [(c.name, next_key[c.name]) for c in schema.primary_key]
        )
    return resp.SerializeToString()  # type: ignore[no-any-return]


# --- batches --------------------------------------------------------------------------------


def _batch_item(item: Any, answer: Callable[[], tuple[bytes, Any]]) -> None:
    """One row of a batch, answered on its own: its row and consumed capacity, or the 4xx
    error it met (a 5xx fails the whole batch)."""
    try:
        row, consumed = answer()
    except OtsError as exc:
        if exc.http_status >= 500:
            raise
        item.is_ok = False
        item.error.CopyFrom(pb.Error(code=exc.code, message=exc.message))
        return
    item.is_ok = True
    item.consumed.CopyFrom(consumed)
    item.row = row


def batch_write_row(ctx: EmulatorContext, body: bytes) -> bytes:
    """Each row is written on its own (the service's batch is not atomic across rows)."""
    req = _parse(pb.BatchWriteRowRequest(), body)
    n = sum(len(t.rows) for t in req.tables)
    if n > MAX_BATCH_WRITE_ROWS:
        raise parameter_invalid(f"Rows count exceeds the upper limit: {MAX_BATCH_WRITE_ROWS}.")
    if n == 0:
        raise parameter_invalid("No row specified in the request of BatchWriteRow.")
    names = [t.table_name for t in req.tables]
    if len(set(names)) != len(names):
        raise parameter_invalid("Duplicated table name in the request of BatchWriteRow.")
    ops = {pb.PUT: _put, pb.UPDATE: _update, pb.DELETE: _delete}
    resp = pb.BatchWriteRowResponse()
    for table in req.tables:
        out = resp.tables.add(table_name=table.table_name)
        for row in table.rows:
            _batch_item(out.rows.add(), functools.partial(
                _write, ctx, ops[row.type], table.table_name, row.row_change, row.condition,
                row.return_content))
    return resp.SerializeToString()  # type: ignore[no-any-return]


def batch_get_row(ctx: EmulatorContext, body: bytes) -> bytes:
    req = _parse(pb.BatchGetRowRequest(), body)
    n = sum(len(t.primary_key) for t in req.tables)
    if n > MAX_BATCH_GET_ROWS:
        raise parameter_invalid(f"Rows count exceeds the upper limit: {MAX_BATCH_GET_ROWS}.")
    resp = pb.BatchGetRowResponse()
    for table in req.tables:
        if table.HasField("filter") and table.filter:
            raise unsupported_operation("Filters are not supported.")
        out = resp.tables.add(table_name=table.table_name)
        columns = list(table.columns_to_get)
        for pk_bytes in table.primary_key:
            _batch_item(out.rows.add(),
                        functools.partial(_get, ctx, table.table_name, pk_bytes, columns))
    return resp.SerializeToString()  # type: ignore[no-any-return]


ROUTES: dict[str, Handler] = {
    "/CreateTable": create_table,
    "/ListTable": list_table,
    "/DescribeTable": describe_table,
    "/DeleteTable": delete_table,
    "/PutRow": put_row,
    "/UpdateRow": update_row,
    "/DeleteRow": delete_row,
    "/GetRow": get_row,
    "/GetRange": get_range,
    "/BatchWriteRow": batch_write_row,
    "/BatchGetRow": batch_get_row,
}
