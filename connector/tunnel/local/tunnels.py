"""The tunnel's half of a local store file: tunnels, checkpoints, base data, tokens.

Everything ``LocalTunnelService`` (``service``) keeps in the tunnel's tables (``schema``:
``cdc_tunnels``, ``cdc_checkpoints``, ``cdc_reached_end``, ``cdc_base_channels``,
``cdc_base_records``), the tokens it issues, and the rule that gives a channel its status for
one tunnel. The service holds the ``TunnelService`` contract and calls these inside its
transactions: on the Spark driver (tunnel creation, planning, checkpoint pushes), on executors
(reads), and in the emulator's tunnel routes.

Tokens are standard base64 of a small JSON ``{"t": table, "c": channel, "s": sequence}``:
"after sequence s of channel c". They do not depend on the tunnel, so a position can be
compared across tunnels of a table. ``FINISHED`` is the literal ``"finished"``. Stored
checkpoints hold them, so their format is part of the file's (tests/test_local_store_format.py).
A token comes back from anywhere (a meta-table row, a Spark checkpoint, the emulator's
requests): one longer than ``MAX_TOKEN_CHARS`` or whose JSON nests deeper than
``MAX_TOKEN_DEPTH`` is a ``MalformedTokenError`` before any JSON parser sees it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connector.errors import MalformedTokenError, UnknownChannelError, UnknownTunnelError
from connector.tunnel.base import (
    FINISHED,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    Op,
    Record,
    StartPosition,
    TableSchema,
    TunnelInfo,
    TunnelType,
)
from connector.tunnel.local.changelog import records_from_rows
from connector.tunnel.local.channels import (
    CHANNEL_COLUMNS,
    ChannelRow,
    channel_from_row,
    channel_row,
    channel_rows,
)
from connector.tunnel.local.names import check_channel, check_tunnel, name_problem
from connector.tunnel.local.rows import rows_in_hash_range

#: the channel columns of ``channels.CHANNEL_COLUMNS`` as ``c.``-qualified (a join's)
_CHANNEL_COLS_OF_C = ", ".join("c." + c.strip() for c in CHANNEL_COLUMNS.split(","))

#: the id of a BaseAndStream tunnel's base-data channel is this + its stream channel's id
BASE_PREFIX = "base-"


@dataclass(frozen=True)
class TunnelRow:
    """One tunnel as ``cdc_tunnels`` keeps it."""

    tunnel_id: str
    table: str
    name: str
    tunnel_type: TunnelType
    start_position: StartPosition
    created_at: float

    def info(self) -> TunnelInfo:
        return TunnelInfo(
            self.tunnel_id,
            self.name,
            self.table,
            self.tunnel_type,
            self.start_position,
            self.created_at,
        )


@dataclass(frozen=True)
class TunnelChannel:
    """A channel as one tunnel sees it (stream or this tunnel's base-data channel)."""

    channel_id: str
    channel_type: ChannelType
    parent_ids: tuple[str, ...]  # includes the base-data channel for BaseAndStream tunnels
    closed: bool
    head_seq: int
    trimmed_upto: int


# --- tokens --------------------------------------------------------------------------------------


def encode_token(table: str, channel_id: str, seq: int) -> str:
    """The token "after sequence ``seq`` of ``channel_id``" (0 = the channel's beginning)."""
    raw = json.dumps({"t": table, "c": channel_id, "s": seq}, separators=(",", ":"))
    return base64.b64encode(raw.encode("utf-8")).decode("ascii")


#: the longest token text decoded (the store's own are base64 of a table and a channel name
#: and a number: far shorter); a longer one is malformed without being decoded or cached
MAX_TOKEN_CHARS = 64 * 1024
#: how deep a token's JSON may nest: the store writes one flat object (depth 1); a deeper one
#: is malformed before ``json.loads``, whose recursion a nested text would exhaust
MAX_TOKEN_DEPTH = 4


def json_depth_exceeds(text: bytes, limit: int) -> bool:
    """Whether the JSON ``text`` nests arrays and objects deeper than ``limit``: one linear
    scan, brackets inside strings skipped (no recursion, whatever the text)."""
    depth, in_string, escaped = 0, False, False
    for byte in text:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def _token_fields(token: str) -> tuple[Any, Any, Any] | str:
    """(table, channel id, sequence) a token's text holds, else why it is no local-store
    token (an over-long text is refused before the cache)."""
    if len(token) > MAX_TOKEN_CHARS:
        return f"longer than {MAX_TOKEN_CHARS} characters"
    return _cached_token_fields(token)


@functools.lru_cache(maxsize=4096)
def _cached_token_fields(token: str) -> tuple[Any, Any, Any] | str:
    """``_token_fields``, parsed once per text (a driver pushes and reads the same tokens
    again and again)."""
    try:
        raw = base64.b64decode(token.encode("ascii"), validate=True)
    except (ValueError, UnicodeError, binascii.Error):
        return "not base64 of a local-store token"
    if json_depth_exceeds(raw, MAX_TOKEN_DEPTH):
        return f"its JSON nests deeper than {MAX_TOKEN_DEPTH} levels"
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeError, RecursionError):
        return "not base64 of a local-store token"
    if not isinstance(body, dict) or set(body) != {"t", "c", "s"}:
        return "not a local-store token"
    return body["t"], body["c"], body["s"]


def decode_token(token: Any, table: str, channel: TunnelChannel) -> int:
    """The sequence a (non-FINISHED) token stands for; ``MalformedTokenError`` if it is not a
    token this store issued for ``channel``."""
    cid = channel.channel_id

    def bad(reason: str) -> MalformedTokenError:
        shown = token if not isinstance(token, str) or len(token) <= 120 else token[:100] + "…"
        return MalformedTokenError(channel_id=cid, token=shown, reason=reason)

    if not isinstance(token, str) or not token:
        raise bad("a token is a non-empty string")
    fields = _token_fields(token)
    if isinstance(fields, str):
        raise bad(fields)
    token_table, token_channel, seq = fields
    if token_table != table or token_channel != cid:
        raise bad(f"it belongs to channel {token_channel!r} of table {token_table!r}")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise bad(f"bad sequence {seq!r}")
    if seq > channel.head_seq:
        raise bad(f"sequence {seq} is past the channel's head {channel.head_seq}")
    return seq


# --- tunnels -------------------------------------------------------------------------------------


def tunnel_by_id(conn: sqlite3.Connection, tunnel_id: str) -> TunnelRow:
    """The tunnel, or ``UnknownTunnelError``."""
    check_tunnel(tunnel_id)
    row = conn.execute(
        "SELECT tunnel_id, table_name, tunnel_name, tunnel_type, start_position, created_at "
        "FROM cdc_tunnels WHERE tunnel_id = ?",
        (tunnel_id,),
    ).fetchone()
    if row is None:
        raise UnknownTunnelError(tunnel=tunnel_id, table="(any table)")
    return _tunnel_from_row(tuple(row))


@functools.lru_cache(maxsize=256)
def _tunnel_from_row(row: tuple[Any, ...]) -> TunnelRow:
    """A ``cdc_tunnels`` row as a (frozen) ``TunnelRow``: the same row, the same object."""
    return TunnelRow(row[0], row[1], row[2], TunnelType(row[3]), StartPosition(row[4]), row[5])


def tunnel_id_by_name(conn: sqlite3.Connection, table: str, name: str) -> str | None:
    """The id of the tunnel named ``name`` on ``table``, or ``None``."""
    if name_problem(name) is not None or name_problem(table) is not None:
        return None  # no tunnel has such a name
    row = conn.execute(
        "SELECT tunnel_id FROM cdc_tunnels WHERE table_name = ? AND tunnel_name = ?",
        (table, name),
    ).fetchone()
    return None if row is None else str(row[0])


def tunnel_ids(conn: sqlite3.Connection, table: str | None) -> list[str]:
    """The ids of every tunnel (ordered by table and name), or of ``table``'s (by name)."""
    where, args = ("", ()) if table is None else ("WHERE table_name = ? ", (table,))
    rows = conn.execute(
        f"SELECT tunnel_id FROM cdc_tunnels {where}ORDER BY table_name, tunnel_name", args
    ).fetchall()
    return [r[0] for r in rows]


def insert_tunnel(conn: sqlite3.Connection, tunnel: TunnelRow) -> None:
    conn.execute(
        "INSERT INTO cdc_tunnels (tunnel_id, table_name, tunnel_name, tunnel_type, "
        "start_position, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (
            tunnel.tunnel_id,
            tunnel.table,
            tunnel.name,
            tunnel.tunnel_type.value,
            tunnel.start_position.value,
            tunnel.created_at,
        ),
    )


def delete_tunnel(conn: sqlite3.Connection, tunnel_id: str) -> None:
    """Delete the tunnel, its checkpoints and its base-data snapshot."""
    for t in (
        "cdc_tunnels",
        "cdc_checkpoints",
        "cdc_reached_end",
        "cdc_base_channels",
        "cdc_base_records",
    ):
        conn.execute(f"DELETE FROM {t} WHERE tunnel_id = ?", (tunnel_id,))


# --- channels as one tunnel sees them ------------------------------------------------------------


def tunnel_channels(conn: sqlite3.Connection, tunnel: TunnelRow) -> dict[str, TunnelChannel]:
    """Every channel the tunnel knows: its base-data channels first, then stream channels."""
    bases = conn.execute(
        "SELECT channel_id, stream_channel_id, head_seq FROM cdc_base_channels "
        "WHERE tunnel_id = ? ORDER BY channel_id",
        (tunnel.tunnel_id,),
    ).fetchall()
    out: dict[str, TunnelChannel] = {
        b[0]: TunnelChannel(b[0], ChannelType.BASE_DATA, (), True, b[2], 0) for b in bases
    }
    base_of = {b[1]: b[0] for b in bases}
    for ch in channel_rows(conn, tunnel.table):
        out[ch.channel_id] = _stream_channel(ch, base_of.get(ch.channel_id))
    return out


def tunnel_and_channel(conn: sqlite3.Connection, tunnel_id: str,
                       channel_id: str) -> tuple[TunnelRow, TunnelChannel]:
    """The tunnel and one of its channels (``UnknownTunnelError`` / ``UnknownChannelError``):
    for a stream channel, the tunnel's row, the channel's and its base channel's in one query
    (every checkpoint push and every read asks for both)."""
    check_tunnel(tunnel_id)
    check_channel(channel_id, tunnel_id)
    if channel_id.startswith(BASE_PREFIX):
        tunnel = tunnel_by_id(conn, tunnel_id)
        return tunnel, tunnel_channel(conn, tunnel, channel_id)
    row = conn.execute(
        "SELECT t.tunnel_id, t.table_name, t.tunnel_name, t.tunnel_type, t.start_position, "
        f"t.created_at, {_CHANNEL_COLS_OF_C}, (SELECT b.channel_id FROM cdc_base_channels b "
        "WHERE b.tunnel_id = t.tunnel_id AND b.stream_channel_id = c.channel_id) "
        "FROM cdc_tunnels t LEFT JOIN cdc_channels c "
        "ON c.table_name = t.table_name AND c.channel_id = ? WHERE t.tunnel_id = ?",
        (channel_id, tunnel_id),
    ).fetchone()
    if row is None:
        raise UnknownTunnelError(tunnel=tunnel_id, table="(any table)")
    tunnel = _tunnel_from_row(tuple(row[:6]))
    if row[7] is None:  # the join found no channel of that id on the tunnel's table
        raise UnknownChannelError(channel_id=channel_id, tunnel_id=tunnel_id)
    return tunnel, _stream_channel(channel_from_row(row[6:-1]), row[-1])


def _stream_channel(ch: ChannelRow, base_id: str | None) -> TunnelChannel:
    """A stream channel as the tunnel sees it: its base channel (BaseAndStream), if any, is one
    more parent."""
    return TunnelChannel(
        ch.channel_id,
        ChannelType.STREAM,
        ch.parent_ids + ((base_id,) if base_id else ()),
        ch.closed,
        ch.head_seq,
        ch.trimmed_upto,
    )


def tunnel_channel(conn: sqlite3.Connection, tunnel: TunnelRow, channel_id: str) -> TunnelChannel:
    """One channel of the tunnel (cheaper than ``tunnel_channels``), or
    ``UnknownChannelError``."""
    check_channel(channel_id, tunnel.tunnel_id)
    if channel_id.startswith(BASE_PREFIX):
        row = conn.execute(
            "SELECT head_seq FROM cdc_base_channels WHERE tunnel_id = ? AND channel_id = ?",
            (tunnel.tunnel_id, channel_id),
        ).fetchone()
        if row is not None:
            return TunnelChannel(channel_id, ChannelType.BASE_DATA, (), True, row[0], 0)
    else:
        ch = channel_row(conn, tunnel.table, channel_id)
        if ch is not None:
            base = conn.execute(
                "SELECT channel_id FROM cdc_base_channels WHERE tunnel_id = ? "
                "AND stream_channel_id = ?",
                (tunnel.tunnel_id, channel_id),
            ).fetchone()
            return _stream_channel(ch, base[0] if base else None)
    raise UnknownChannelError(channel_id=channel_id, tunnel_id=tunnel.tunnel_id)


# --- checkpoints and status ----------------------------------------------------------------------


def stored_checkpoints(
    conn: sqlite3.Connection, tunnel_id: str, ids: list[str] | None = None
) -> dict[str, Checkpoint]:
    """The checkpoints stored for the tunnel: of every channel, or of ``ids`` only."""
    only = "" if ids is None else f" AND channel_id IN ({','.join('?' * len(ids))})"
    rows = conn.execute(
        f"SELECT channel_id, token, sequence_number FROM cdc_checkpoints WHERE tunnel_id = ?{only}",
        (tunnel_id, *(ids or ())),
    ).fetchall()
    return {r[0]: Checkpoint(r[1], r[2]) for r in rows}


def channel_status(ch: TunnelChannel, stored: Mapping[str, Checkpoint]) -> ChannelStatus:
    """TERMINATED once the channel's FINISHED was stored; WAIT while a parent is not
    TERMINATED; OPEN otherwise."""
    own = stored.get(ch.channel_id)
    if own is not None and own.finished:
        return ChannelStatus.TERMINATED
    for parent in ch.parent_ids:
        cp = stored.get(parent)
        if cp is None or not cp.finished:
            return ChannelStatus.WAIT
    return ChannelStatus.OPEN


def position(
    tunnel: TunnelRow, ch: TunnelChannel, stored: Mapping[str, Checkpoint]
) -> Checkpoint:
    """The stored checkpoint, else the start position (beginning of the channel); the
    LATEST / BaseAndStream / trimmed-EARLIEST starts are stored at tunnel creation."""
    return stored.get(ch.channel_id) or Checkpoint(
        encode_token(tunnel.table, ch.channel_id, 0), 0
    )


def store_start_positions(
    conn: sqlite3.Connection, tunnel: TunnelRow, starts: Mapping[str, str]
) -> None:
    """At tunnel creation: the start token of each channel that does not start at its
    beginning, as a checkpoint with sequence number 0."""
    conn.executemany(
        "INSERT INTO cdc_checkpoints (tunnel_id, channel_id, token, sequence_number, "
        "updated_at) VALUES (?, ?, ?, 0, ?)",
        [(tunnel.tunnel_id, c, tok, tunnel.created_at) for c, tok in starts.items()],
    )


def put_checkpoint(
    conn: sqlite3.Connection, tunnel_id: str, channel_id: str, checkpoint: Checkpoint, now: float
) -> None:
    """Store (insert or replace) the channel's checkpoint for the tunnel."""
    conn.execute(
        "INSERT INTO cdc_checkpoints (tunnel_id, channel_id, token, sequence_number, "
        "updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (tunnel_id, channel_id) DO "
        "UPDATE SET token = excluded.token, sequence_number = excluded.sequence_number, "
        "updated_at = excluded.updated_at",
        (tunnel_id, channel_id, checkpoint.token, checkpoint.sequence_number, now),
    )


def end_reached(conn: sqlite3.Connection, tunnel_id: str, channel_id: str) -> bool:
    """Whether a read of this tunnel returned FINISHED for the channel."""
    return conn.execute(
        "SELECT 1 FROM cdc_reached_end WHERE tunnel_id = ? AND channel_id = ?",
        (tunnel_id, channel_id),
    ).fetchone() is not None


def mark_end_reached(conn: sqlite3.Connection, tunnel_id: str, channel_id: str) -> None:
    """Inside a write transaction: record that a read of this tunnel reached the channel's end
    (the only write a read ever does)."""
    conn.execute(
        "INSERT OR IGNORE INTO cdc_reached_end (tunnel_id, channel_id) VALUES (?, ?)",
        (tunnel_id, channel_id),
    )


# --- base data (BaseAndStream tunnels) -----------------------------------------------------------


def snapshot_base_data(conn: sqlite3.Connection, tunnel: TunnelRow, stream: ChannelRow) -> None:
    """At tunnel creation, in its write transaction: the base-data channel of the open channel
    ``stream``, one PUT per row in its key range (``base-<channel id>``)."""
    base_id = BASE_PREFIX + stream.channel_id
    rows = rows_in_hash_range(conn, tunnel.table, stream.range_lo, stream.range_hi)
    conn.execute(
        "INSERT INTO cdc_base_channels (tunnel_id, channel_id, stream_channel_id,"
        " head_seq, created_at) VALUES (?, ?, ?, ?, ?)",
        (tunnel.tunnel_id, base_id, stream.channel_id, len(rows), tunnel.created_at),
    )
    ts_us = int(tunnel.created_at * 1e6)
    conn.executemany(
        "INSERT INTO cdc_base_records (tunnel_id, channel_id, seq, pk, columns, "
        "commit_ts_us) VALUES (?, ?, ?, ?, ?, ?)",
        [
            (tunnel.tunnel_id, base_id, i, pk, attrs, ts_us)
            for i, (pk, attrs) in enumerate(rows, start=1)
        ],
    )


def read_base(
    conn: sqlite3.Connection,
    schema: TableSchema,
    tunnel_id: str,
    channel_id: str,
    after: int,
    limit: int,
) -> list[Record]:
    """Up to ``limit`` records of a base-data channel with sequence > ``after``."""
    rows = conn.execute(
        "SELECT seq, pk, columns, commit_ts_us FROM cdc_base_records WHERE tunnel_id = ? "
        "AND channel_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (tunnel_id, channel_id, after, limit),
    ).fetchall()
    return records_from_rows(
        schema, channel_id, [(r[0], Op.PUT.value, r[1], r[2], None, r[3]) for r in rows]
    )


def first_unread_commit_ts(
    conn: sqlite3.Connection, tunnel: TunnelRow, ch: TunnelChannel, after: int
) -> int | None:
    """The commit time (µs) of the channel's first record after sequence ``after``, or
    ``None`` when there is none (how old the oldest unread change is: ``lag``)."""
    base = ch.channel_type is ChannelType.BASE_DATA
    records, column, key = (
        ("cdc_base_records", "tunnel_id", tunnel.tunnel_id) if base
        else ("cdc_changes", "table_name", tunnel.table)
    )
    row = conn.execute(
        f"SELECT commit_ts_us FROM {records} WHERE {column} = ? "
        "AND channel_id = ? AND seq > ? ORDER BY seq LIMIT 1",
        (key, ch.channel_id, after),
    ).fetchone()
    return None if row is None else int(row[0])


def start_at(conn: sqlite3.Connection, table: str, ch: ChannelRow, at_us: int) -> str:
    """The start token of a tunnel created to begin at ``at_us``: right before the channel's
    first change committed at or after it; its head when it has none (``FINISHED`` for a closed
    channel); and, when changes were trimmed and the first one still held is already at or
    after the instant (the trimmed ones may have been too), before the trimmed ones, so the
    first read reports the loss (``TrimmedDataError``)."""
    row = conn.execute(
        "SELECT MIN(seq) FROM cdc_changes WHERE table_name = ? AND channel_id = ? "
        "AND commit_ts_us >= ?", (table, ch.channel_id, at_us)).fetchone()
    first = row[0] if row is not None else None
    if first is None:
        return FINISHED if ch.closed else encode_token(table, ch.channel_id, ch.head_seq)
    if ch.trimmed_upto > 0 and first == ch.trimmed_upto + 1:
        return encode_token(table, ch.channel_id, 0)
    return encode_token(table, ch.channel_id, int(first) - 1)
