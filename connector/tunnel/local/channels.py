"""Channels: the key ranges a table's change log is cut into, and what a service does to them.

The model mirrors Tablestore's stream:

- the key space is a stable 32-bit hash of the primary key (``values.key_hash``);
- each channel owns a half-open hash range; ``cut_key_space`` (``create_table``) cuts the space
  into N equal ranges; the open channels always cover the whole space without overlap;
- every write appends exactly one record to the open channel owning the key, with the next
  per-channel sequence (``changelog.append_changes``);
- ``split_channel`` closes a channel and opens two children on the halves of its range;
  ``merge_channels`` closes two adjacent channels and opens one child on their union. Writes
  after the operation land in the children. Closed channels keep their records;
- ``trim_history`` deletes a prefix of each channel's records, as a service's retention does.

Who calls what: ``LocalTablestore`` (a writer process, the ``tablestore-cdc local`` CLI, a test)
splits, merges and trims, and finds the open channel of each write; the tunnel service reads
``channel_rows`` / ``channel_row`` on the Spark driver and on executors. Every function runs
inside a transaction its caller opened (a write transaction for those that write).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from connector.errors import InvalidChannelOperationError
from connector.tunnel.local.names import name_problem

#: The hash space channels cut into ranges: [0, KEY_SPACE).
KEY_SPACE = 2**32


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


#: the ``cdc_channels`` columns a ``ChannelRow`` is made of, in ``channel_from_row``'s order
CHANNEL_COLUMNS = (
    "table_name, channel_id, channel_no, parent_ids, range_lo, range_hi, closed, head_seq, "
    "trimmed_upto, created_at, closed_at"
)


@functools.lru_cache(maxsize=1024)
def _parent_ids(text: str) -> tuple[str, ...]:
    """``parent_ids`` as stored (JSON), parsed once per text: every read of a channel meets it."""
    return tuple(json.loads(text))


def channel_from_row(r: Sequence[Any]) -> ChannelRow:
    return ChannelRow(
        table_name=r[0],
        channel_id=r[1],
        channel_no=r[2],
        parent_ids=_parent_ids(r[3]),
        range_lo=r[4],
        range_hi=r[5],
        closed=bool(r[6]),
        head_seq=r[7],
        trimmed_upto=r[8],
        created_at=r[9],
        closed_at=r[10],
    )


# --- reads ---------------------------------------------------------------------------------------


def channel_rows(conn: sqlite3.Connection, table: str) -> list[ChannelRow]:
    """All channels of ``table`` in creation order, closed ones included (no table check)."""
    rows = conn.execute(
        f"SELECT {CHANNEL_COLUMNS} FROM cdc_channels WHERE table_name = ? ORDER BY channel_no",
        (table,),
    ).fetchall()
    return [channel_from_row(r) for r in rows]


def channel_row(conn: sqlite3.Connection, table: str, channel_id: str) -> ChannelRow | None:
    """One channel, or ``None`` (also for an id no channel can have: ``names``)."""
    if name_problem(channel_id) is not None or name_problem(table) is not None:
        return None
    row = conn.execute(
        f"SELECT {CHANNEL_COLUMNS} FROM cdc_channels WHERE table_name = ? AND channel_id = ?",
        (table, channel_id),
    ).fetchone()
    return channel_from_row(row) if row else None


# --- operations ----------------------------------------------------------------------------------


def cut_key_space(conn: sqlite3.Connection, table: str, count: int, now: float) -> None:
    """Open the first ``count`` channels of a new table, on equal ranges of the key space (the
    table's ``next_channel_no`` is already ``count``)."""
    step = KEY_SPACE // count
    for i in range(count):
        hi = KEY_SPACE if i == count - 1 else (i + 1) * step
        _new_channel(conn, table, (), i * step, hi, now, no=i)


def split_channel(
    conn: sqlite3.Connection, table: str, channel_id: str, now: float
) -> tuple[str, str]:
    """Close an open channel and open two children on the halves of its key range; returns
    ``(lower_child, upper_child)``."""
    ch = _open_channel(conn, table, channel_id)
    if ch.range_hi - ch.range_lo < 2:
        raise InvalidChannelOperationError(
            table=table, reason=f"channel {channel_id!r} owns a single hash; cannot split"
        )
    mid = ch.range_lo + (ch.range_hi - ch.range_lo) // 2
    _close(conn, table, channel_id, now)
    a = _new_channel(conn, table, (channel_id,), ch.range_lo, mid, now)
    b = _new_channel(conn, table, (channel_id,), mid, ch.range_hi, now)
    return a, b


def merge_channels(conn: sqlite3.Connection, table: str, a: str, b: str, now: float) -> str:
    """Close two adjacent open channels and open one child on the union of their ranges, its
    parents the lower range first; returns the child."""
    if a == b:
        raise InvalidChannelOperationError(
            table=table, reason=f"cannot merge channel {a!r} with itself"
        )
    ca, cb = _open_channel(conn, table, a), _open_channel(conn, table, b)
    lo_ch, hi_ch = (ca, cb) if ca.range_lo < cb.range_lo else (cb, ca)
    if lo_ch.range_hi != hi_ch.range_lo:
        raise InvalidChannelOperationError(
            table=table,
            reason=f"channels {a!r} and {b!r} are not adjacent "
            f"([{ca.range_lo}, {ca.range_hi}) and [{cb.range_lo}, {cb.range_hi}))",
        )
    _close(conn, table, a, now)
    _close(conn, table, b, now)
    return _new_channel(
        conn,
        table,
        (lo_ch.channel_id, hi_ch.channel_id),
        lo_ch.range_lo,
        hi_ch.range_hi,
        now,
    )


def trim_history(
    conn: sqlite3.Connection, table: str, keep_last: int | None, cutoff_us: int | None
) -> int:
    """Delete a prefix of every channel's records: all but the newest ``keep_last`` (if given)
    and only those committed before ``cutoff_us`` (if given); returns how many. The sealed
    segments inside the prefix go with them, and each channel records its trim point
    (``trimmed_upto``), so a reader asking for trimmed records is told instead of skipping."""
    deleted = 0
    for ch in channel_rows(conn, table):
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


def _new_channel(
    conn: sqlite3.Connection,
    table: str,
    parents: tuple[str, ...],
    lo: int,
    hi: int,
    now: float,
    no: int | None = None,
) -> str:
    """Insert a channel numbered ``no`` (None: the table's next number) and return its id."""
    if no is None:
        (no,) = conn.execute(
            "UPDATE cdc_tables SET next_channel_no = next_channel_no + 1 WHERE name = ? "
            "RETURNING next_channel_no - 1",
            (table,),
        ).fetchone()
    channel_id = f"ch-{no:04d}"
    conn.execute(
        "INSERT INTO cdc_channels (table_name, channel_id, channel_no, parent_ids, range_lo, "
        "range_hi, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (table, channel_id, no, json.dumps(list(parents)), lo, hi, now),
    )
    return channel_id


def _open_channel(conn: sqlite3.Connection, table: str, channel_id: str) -> ChannelRow:
    ch = channel_row(conn, table, channel_id)
    if ch is None:
        raise InvalidChannelOperationError(
            table=table, reason=f"there is no channel {channel_id!r}"
        )
    if ch.closed:
        raise InvalidChannelOperationError(
            table=table, reason=f"channel {channel_id!r} is closed (split or merged before)"
        )
    return ch


def _close(conn: sqlite3.Connection, table: str, channel_id: str, now: float) -> None:
    conn.execute(
        "UPDATE cdc_channels SET closed = 1, closed_at = ? WHERE table_name = ? "
        "AND channel_id = ?",
        (now, table, channel_id),
    )


__all__ = [
    "KEY_SPACE",
    "ChannelRow",
    "channel_row",
    "channel_rows",
    "cut_key_space",
    "merge_channels",
    "split_channel",
    "trim_history",
]
