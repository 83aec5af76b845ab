"""The tunnel service of the embedded local store: ``local:///abs/path/store.db``.

The reference implementation of ``TunnelService``: the contract suite
(``tests/contract/tunnel_contract.py``) is written against it first. Tunnel state (tunnels,
per-tunnel checkpoints, base-data snapshots) lives in the same SQLite file as the tables
(``connector.local.store``), so a writer process, the Spark driver and executors all see one
consistent state.

Who calls what, and where:
- the Spark driver: ``from_uri``, ``create_tunnel``/``ensure_tunnel``, ``describe_tunnel``,
  ``get_checkpoint``, ``checkpoint`` (push), ``has_new_data``, ``table_schema``;
- executors: ``read_page`` (columnar; ``read_records`` for other callers) on a service opened
  inside ``read()`` (one per process);
- the inspection CLI / dashboard: ``list_tunnels``, ``describe_tunnel``, ``lag``.

Semantics, per tunnel (several tunnels on a table are fully independent):
- A channel is TERMINATED once its FINISHED checkpoint was pushed for the tunnel; WAIT while
  any parent is not TERMINATED; OPEN otherwise. A closed channel whose end has not been
  reached is OPEN: it is read to its end, then finished.
- Start position of a channel with no pushed checkpoint: the beginning of the channel (before
  sequence 1) for channels created after the tunnel and for EARLIEST tunnels (the first record
  still held if the channel was trimmed before the tunnel existed). LATEST: channels open at
  creation start at their head then; channels already closed are TERMINATED from the start.
- BaseAndStream: creating the tunnel snapshots the table in the same write transaction: for each
  open channel a BaseData channel ``base-<channel id>`` holds one PUT per row in its key range,
  and the stream channel starts at its head of that instant, in WAIT until the base channel is
  TERMINATED (the base channel is an extra parent for that tunnel only). No change is missed or
  doubled across the boundary, since no write can interleave with the snapshot. The
  ``start_position`` of a BaseAndStream tunnel is recorded but has no effect.
- FINISHED may be pushed only for a closed channel whose end this tunnel has reached: a
  ``read_records`` call of this tunnel returned FINISHED for it, or its stored checkpoint token
  is at the channel's head. (Reads record "end reached" once per channel and tunnel: the only
  write a read ever does.)

Tokens are standard base64 of a small JSON ``{"t": table, "c": channel, "s": sequence}``:
"after sequence s of channel c". They do not depend on the tunnel, so a position can be
compared across tunnels of a table. ``FINISHED`` is the literal ``"finished"``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from cdc_common.uris import redact_uri
from connector.errors import (
    ChannelNotReadableError,
    InvalidCheckpointError,
    MalformedTokenError,
    OptionError,
    StaleCheckpointError,
    TrimmedDataError,
    TunnelExistsError,
    UnknownChannelError,
    UnknownTunnelError,
)
from connector.local.store import LocalTablestore, sequence_str
from connector.tunnel.base import (
    FINISHED,
    ChannelInfo,
    ChannelLag,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    Op,
    ReadResult,
    Record,
    StartPosition,
    TableSchema,
    TunnelDescription,
    TunnelInfo,
    TunnelService,
    TunnelType,
)
from connector.tunnel.page import (
    EncodedBatch,
    Page,
    PageLayout,
    empty_page_batch,
    records_to_page,
)

_URI_FORM = "local:///absolute/path/to/store.db"
BASE_PREFIX = "base-"


@dataclass(frozen=True)
class _Tunnel:
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
class _Channel:
    """A channel as one tunnel sees it (stream or this tunnel's base-data channel)."""

    channel_id: str
    channel_type: ChannelType
    parent_ids: tuple[str, ...]  # includes the base-data channel for BaseAndStream tunnels
    closed: bool
    head_seq: int
    trimmed_upto: int


def encode_token(table: str, channel_id: str, seq: int) -> str:
    """The token "after sequence ``seq`` of ``channel_id``" (0 = the channel's beginning)."""
    raw = json.dumps({"t": table, "c": channel_id, "s": seq}, separators=(",", ":"))
    return base64.b64encode(raw.encode("utf-8")).decode("ascii")


def _decode_token(token: Any, table: str, channel: _Channel) -> int:
    """The sequence a (non-FINISHED) token stands for; ``MalformedTokenError`` if it is not a
    token this store issued for ``channel``."""
    cid = channel.channel_id

    def bad(reason: str) -> MalformedTokenError:
        return MalformedTokenError(channel_id=cid, token=token, reason=reason)

    if not isinstance(token, str) or not token:
        raise bad("a token is a non-empty string")
    try:
        body = json.loads(base64.b64decode(token.encode("ascii"), validate=True))
    except (ValueError, UnicodeError, binascii.Error):
        raise bad("not base64 of a local-store token") from None
    if not isinstance(body, dict) or set(body) != {"t", "c", "s"}:
        raise bad("not a local-store token")
    seq = body["s"]
    if body["t"] != table or body["c"] != cid:
        raise bad(f"it belongs to channel {body['c']!r} of table {body['t']!r}")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise bad(f"bad sequence {seq!r}")
    if seq > channel.head_seq:
        raise bad(f"sequence {seq} is past the channel's head {channel.head_seq}")
    return seq


class LocalTunnelService(TunnelService):
    """``TunnelService`` over a ``LocalTablestore`` file. One instance per process."""

    def __init__(self, store: LocalTablestore | str | os.PathLike[str]) -> None:
        self.store = store if isinstance(store, LocalTablestore) else LocalTablestore(store)
        self.uri = f"local://{self.store.path}"

    @classmethod
    def from_uri(cls, uri: str) -> LocalTunnelService:
        """Open ``local:///abs/path/store.db`` (driver or executor); the file must exist."""
        parts = urlsplit(uri)
        path = unquote(parts.path)
        problem = None
        if parts.scheme != "local":
            problem = "not a local:// URI"
        elif parts.netloc:
            problem = (
                # (the host without its user info: that may hold a password)
                f"the store path must be absolute: '{parts.netloc.rpartition('@')[2]}' was read "
                "as a host; "
                "use three slashes"
            )
        elif not path.startswith("/"):
            problem = "the store path must be absolute"
        elif parts.query or parts.fragment:
            problem = "a local:// URI takes no query or fragment"
        elif path.endswith("/"):
            problem = "the path names a directory, not a store file"
        if problem:
            raise OptionError(option="endpoint", value=redact_uri(uri), problem=problem,
                              allowed=_URI_FORM)
        if not Path(path).is_file():
            raise OptionError(
                option="endpoint",
                value=redact_uri(uri),
                problem=f"no local store file at {path}; create it with "
                f"`tablestore-cdc local create-table {path} TABLE --pk id:INTEGER`",
                allowed="an existing local store file",
            )
        return cls(LocalTablestore(path, create=False))

    def close(self) -> None:
        self.store.close()

    # --- lookups (inside a transaction) -----------------------------------------------------

    def _tunnel_by_id(self, conn: Any, tunnel_id: str) -> _Tunnel:
        row = conn.execute(
            "SELECT tunnel_id, table_name, tunnel_name, tunnel_type, start_position, created_at "
            "FROM cdc_tunnels WHERE tunnel_id = ?",
            (tunnel_id,),
        ).fetchone()
        if row is None:
            raise UnknownTunnelError(tunnel=tunnel_id, table="(any table)")
        return _Tunnel(row[0], row[1], row[2], TunnelType(row[3]), StartPosition(row[4]), row[5])

    def _tunnel_by_name(self, conn: Any, table: str, name: str) -> _Tunnel:
        self.store.require_table(conn, table)
        row = conn.execute(
            "SELECT tunnel_id FROM cdc_tunnels WHERE table_name = ? AND tunnel_name = ?",
            (table, name),
        ).fetchone()
        if row is None:
            raise UnknownTunnelError(tunnel=name, table=table)
        return self._tunnel_by_id(conn, row[0])

    def _channels(self, conn: Any, tunnel: _Tunnel) -> dict[str, _Channel]:
        """Every channel the tunnel knows: its base-data channels first, then stream channels."""
        bases = conn.execute(
            "SELECT channel_id, stream_channel_id, head_seq FROM cdc_base_channels "
            "WHERE tunnel_id = ? ORDER BY channel_id",
            (tunnel.tunnel_id,),
        ).fetchall()
        out: dict[str, _Channel] = {
            b[0]: _Channel(b[0], ChannelType.BASE_DATA, (), True, b[2], 0) for b in bases
        }
        base_of = {b[1]: b[0] for b in bases}
        for ch in self.store.channel_rows(conn, tunnel.table):
            extra = (base_of[ch.channel_id],) if ch.channel_id in base_of else ()
            out[ch.channel_id] = _Channel(
                ch.channel_id,
                ChannelType.STREAM,
                ch.parent_ids + extra,
                ch.closed,
                ch.head_seq,
                ch.trimmed_upto,
            )
        return out

    def _channel(self, conn: Any, tunnel: _Tunnel, channel_id: str) -> _Channel:
        """One channel of the tunnel (cheaper than ``_channels``), or ``UnknownChannelError``."""
        if isinstance(channel_id, str) and channel_id.startswith(BASE_PREFIX):
            row = conn.execute(
                "SELECT head_seq FROM cdc_base_channels WHERE tunnel_id = ? AND channel_id = ?",
                (tunnel.tunnel_id, channel_id),
            ).fetchone()
            if row is not None:
                return _Channel(channel_id, ChannelType.BASE_DATA, (), True, row[0], 0)
        else:
            ch = self.store.channel_row(conn, tunnel.table, channel_id)
            if ch is not None:
                base = conn.execute(
                    "SELECT channel_id FROM cdc_base_channels WHERE tunnel_id = ? "
                    "AND stream_channel_id = ?",
                    (tunnel.tunnel_id, channel_id),
                ).fetchone()
                return _Channel(
                    channel_id,
                    ChannelType.STREAM,
                    ch.parent_ids + ((base[0],) if base else ()),
                    ch.closed,
                    ch.head_seq,
                    ch.trimmed_upto,
                )
        raise UnknownChannelError(channel_id=channel_id, tunnel_id=tunnel.tunnel_id)

    def _stored(
        self, conn: Any, tunnel_id: str, ids: list[str] | None = None
    ) -> dict[str, Checkpoint]:
        if ids is None:
            rows = conn.execute(
                "SELECT channel_id, token, sequence_number FROM cdc_checkpoints "
                "WHERE tunnel_id = ?",
                (tunnel_id,),
            ).fetchall()
        else:
            marks = ",".join("?" * len(ids))
            rows = conn.execute(
                "SELECT channel_id, token, sequence_number FROM cdc_checkpoints "
                f"WHERE tunnel_id = ? AND channel_id IN ({marks})",
                (tunnel_id, *ids),
            ).fetchall()
        return {r[0]: Checkpoint(r[1], r[2]) for r in rows}

    @staticmethod
    def _status(ch: _Channel, stored: Mapping[str, Checkpoint]) -> ChannelStatus:
        own = stored.get(ch.channel_id)
        if own is not None and own.finished:
            return ChannelStatus.TERMINATED
        for parent in ch.parent_ids:
            cp = stored.get(parent)
            if cp is None or not cp.finished:
                return ChannelStatus.WAIT
        return ChannelStatus.OPEN

    def _status_of(
        self, conn: Any, tunnel: _Tunnel, ch: _Channel
    ) -> tuple[ChannelStatus, Checkpoint]:
        stored = self._stored(conn, tunnel.tunnel_id, [ch.channel_id, *ch.parent_ids])
        return self._status(ch, stored), self._position(tunnel, ch, stored)

    def _position(
        self, tunnel: _Tunnel, ch: _Channel, stored: Mapping[str, Checkpoint]
    ) -> Checkpoint:
        """The stored checkpoint, else the start position (beginning of the channel); the
        LATEST / BaseAndStream / trimmed-EARLIEST starts are stored at tunnel creation."""
        return stored.get(ch.channel_id) or Checkpoint(
            encode_token(tunnel.table, ch.channel_id, 0), 0
        )

    # --- tunnels (driver) ---------------------------------------------------------------------

    def create_tunnel(
        self,
        table: str,
        tunnel_name: str,
        tunnel_type: TunnelType = TunnelType.STREAM,
        start_position: StartPosition = StartPosition.EARLIEST,
    ) -> TunnelInfo:
        """Create a tunnel (driver or CLI). For BaseAndStream, snapshot the table in the same
        write transaction. ``TunnelExistsError`` if the name is taken on ``table``."""
        tunnel_type, start_position = TunnelType(tunnel_type), StartPosition(start_position)
        if not isinstance(tunnel_name, str) or not tunnel_name:
            raise ValueError(f"a tunnel name must be a non-empty string, got {tunnel_name!r}")
        tunnel = _Tunnel(
            str(uuid.uuid4()), table, tunnel_name, tunnel_type, start_position, time.time()
        )
        with self.store.transaction(write=True) as conn:
            self.store.require_table(conn, table)
            if conn.execute(
                "SELECT 1 FROM cdc_tunnels WHERE table_name = ? AND tunnel_name = ?",
                (table, tunnel_name),
            ).fetchone():
                raise TunnelExistsError(tunnel=tunnel_name, table=table)
            conn.execute(
                "INSERT INTO cdc_tunnels (tunnel_id, table_name, tunnel_name, tunnel_type, "
                "start_position, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    tunnel.tunnel_id,
                    table,
                    tunnel_name,
                    tunnel_type.value,
                    start_position.value,
                    tunnel.created_at,
                ),
            )
            starts: dict[str, str] = {}
            ts_us = int(tunnel.created_at * 1e6)
            from_head = (
                tunnel_type is TunnelType.BASE_AND_STREAM or start_position is StartPosition.LATEST
            )
            for ch in self.store.channel_rows(conn, table):
                if from_head:
                    starts[ch.channel_id] = (
                        FINISHED if ch.closed else encode_token(table, ch.channel_id, ch.head_seq)
                    )
                elif ch.trimmed_upto > 0:  # EARLIEST: the earliest record still held
                    starts[ch.channel_id] = encode_token(table, ch.channel_id, ch.trimmed_upto)
                if tunnel_type is TunnelType.BASE_AND_STREAM and not ch.closed:
                    base_id = BASE_PREFIX + ch.channel_id
                    rows = self.store.snapshot_rows(conn, table, ch.range_lo, ch.range_hi)
                    conn.execute(
                        "INSERT INTO cdc_base_channels (tunnel_id, channel_id, stream_channel_id,"
                        " head_seq, created_at) VALUES (?, ?, ?, ?, ?)",
                        (tunnel.tunnel_id, base_id, ch.channel_id, len(rows), tunnel.created_at),
                    )
                    conn.executemany(
                        "INSERT INTO cdc_base_records (tunnel_id, channel_id, seq, pk, columns, "
                        "commit_ts_us) VALUES (?, ?, ?, ?, ?, ?)",
                        [
                            (tunnel.tunnel_id, base_id, i, pk, attrs, ts_us)
                            for i, (pk, attrs) in enumerate(rows, start=1)
                        ],
                    )
            conn.executemany(
                "INSERT INTO cdc_checkpoints (tunnel_id, channel_id, token, sequence_number, "
                "updated_at) VALUES (?, ?, ?, 0, ?)",
                [(tunnel.tunnel_id, c, tok, tunnel.created_at) for c, tok in starts.items()],
            )
        return tunnel.info()

    def describe_tunnel(self, table: str, tunnel_name: str) -> TunnelDescription:
        """The tunnel and every channel (closed ones too) with its status for this tunnel."""
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_name(conn, table, tunnel_name)
            channels = self._channels(conn, tunnel)
            stored = self._stored(conn, tunnel.tunnel_id)
        return TunnelDescription(
            tunnel.info(),
            tuple(
                ChannelInfo(c.channel_id, self._status(c, stored), c.channel_type, c.parent_ids)
                for c in channels.values()
            ),
        )

    def list_tunnels(self, table: str | None = None) -> list[TunnelInfo]:
        with self.store.transaction() as conn:
            if table is None:
                ids = conn.execute(
                    "SELECT tunnel_id FROM cdc_tunnels ORDER BY table_name, tunnel_name"
                ).fetchall()
            else:
                self.store.require_table(conn, table)
                ids = conn.execute(
                    "SELECT tunnel_id FROM cdc_tunnels WHERE table_name = ? ORDER BY tunnel_name",
                    (table,),
                ).fetchall()
            return [self._tunnel_by_id(conn, r[0]).info() for r in ids]

    def delete_tunnel(self, table: str, tunnel_name: str) -> None:
        """Delete the tunnel, its checkpoints and its base-data snapshot."""
        with self.store.transaction(write=True) as conn:
            tid = self._tunnel_by_name(conn, table, tunnel_name).tunnel_id
            for t in (
                "cdc_tunnels",
                "cdc_checkpoints",
                "cdc_reached_end",
                "cdc_base_channels",
                "cdc_base_records",
            ):
                conn.execute(f"DELETE FROM {t} WHERE tunnel_id = ?", (tid,))

    def table_schema(self, table: str) -> TableSchema:
        return self.store.table_schema(table)

    # --- checkpoints (driver) -----------------------------------------------------------------

    def get_checkpoint(self, tunnel_id: str, channel_id: str) -> Checkpoint:
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            ch = self._channel(conn, tunnel, channel_id)
            return self._position(tunnel, ch, self._stored(conn, tunnel_id, [channel_id]))

    def checkpoint(self, tunnel_id: str, channel_id: str, checkpoint: Checkpoint) -> None:
        """Push a checkpoint (driver, from the source's commit).

        Checks, in order: the token is this channel's (``MalformedTokenError``); the sequence
        number is not lower than the stored one (``StaleCheckpointError``; equal is accepted);
        FINISHED only for a closed, readable channel whose end this tunnel reached, and nothing
        but FINISHED once terminated (``InvalidCheckpointError``).
        """
        seqno = checkpoint.sequence_number
        with self.store.transaction(write=True) as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            ch = self._channel(conn, tunnel, channel_id)

            def invalid(reason: str) -> InvalidCheckpointError:
                return InvalidCheckpointError(
                    channel_id=channel_id, tunnel_id=tunnel_id, reason=reason
                )

            if isinstance(seqno, bool) or not isinstance(seqno, int) or seqno < 0:
                raise invalid(f"sequence number must be a non-negative integer, got {seqno!r}")
            if not checkpoint.finished:
                _decode_token(checkpoint.token, tunnel.table, ch)
            status, current = self._status_of(conn, tunnel, ch)
            stored = self._stored(conn, tunnel_id, [channel_id]).get(channel_id)
            if stored is not None and seqno < stored.sequence_number:
                raise StaleCheckpointError(
                    channel_id=channel_id,
                    tunnel_id=tunnel_id,
                    pushed=seqno,
                    stored=stored.sequence_number,
                )
            if status is ChannelStatus.TERMINATED:
                if not checkpoint.finished:
                    raise invalid(
                        "the channel is already terminated for this tunnel; only "
                        "FINISHED may be pushed again"
                    )
            elif checkpoint.finished:
                if not ch.closed:
                    raise invalid(
                        "FINISHED pushed for a channel that is still open (only a "
                        "split or merged channel ends)"
                    )
                if status is ChannelStatus.WAIT:
                    raise invalid(
                        "FINISHED pushed for a channel in WAIT (its parents are not "
                        "finished for this tunnel)"
                    )
                at_head = _decode_token(current.token, tunnel.table, ch) == ch.head_seq
                reached = conn.execute(
                    "SELECT 1 FROM cdc_reached_end WHERE tunnel_id = ? AND channel_id = ?",
                    (tunnel_id, channel_id),
                ).fetchone()
                if not (at_head or reached):
                    raise invalid(
                        f"FINISHED pushed but the channel's end (sequence "
                        f"{ch.head_seq}) was never reached by this tunnel: no read "
                        "returned FINISHED and the stored position is before it"
                    )
            conn.execute(
                "INSERT INTO cdc_checkpoints (tunnel_id, channel_id, token, sequence_number, "
                "updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (tunnel_id, channel_id) DO "
                "UPDATE SET token = excluded.token, sequence_number = excluded.sequence_number, "
                "updated_at = excluded.updated_at",
                (tunnel_id, channel_id, checkpoint.token, seqno, time.time()),
            )

    # --- data (executors) -------------------------------------------------------------------

    def read_records(self, tunnel_id: str, channel_id: str, token: str, limit: int) -> ReadResult:
        """Read up to ``limit`` records after ``token`` (executor). Never blocks.

        ``next_token`` is the token after the last record returned, or FINISHED when the
        channel is closed and the records returned reach its end. TERMINATED channels can
        still be read (a replay may need to); WAIT channels raise ``ChannelNotReadableError``.
        ``TrimmedDataError`` carries ``resume_token``: the position after the lost records,
        to continue from when the user accepts the loss.
        """

        def fetch(conn: Any, tunnel: _Tunnel, ch: _Channel, after: int) -> tuple[Any, int]:
            if ch.channel_type is ChannelType.BASE_DATA:
                records = self._read_base(conn, tunnel, channel_id, after, limit)
            else:
                records = self.store.read_changes(conn, tunnel.table, channel_id, after, limit)
            return records, len(records)

        records, next_token, may_more = self._read(tunnel_id, channel_id, token, limit, fetch)
        return ReadResult(records if records is not None else [], next_token, may_more)

    def read_page(
        self, tunnel_id: str, channel_id: str, token: str, limit: int, layout: PageLayout
    ) -> Page:
        """``read_records`` as one columnar page (executor): a slice of one of the store's
        sealed Arrow segments, or the unsealed tail converted
        (``LocalTablestore.read_change_page``); no ``Record`` per sealed change. A page ends
        with its segment, so it may be shorter than ``limit``. Base-data channels go through
        records."""

        def fetch(conn: Any, tunnel: _Tunnel, ch: _Channel, after: int) -> tuple[Any, int]:
            if ch.channel_type is ChannelType.BASE_DATA:
                batch = records_to_page(
                    self._read_base(conn, tunnel, channel_id, after, limit), layout)
            else:
                batch = self.store.read_change_page(
                    conn, tunnel.table, channel_id, after, limit, layout)
            if isinstance(batch, EncodedBatch):
                return batch, batch.count
            return batch, batch.num_rows

        batch, next_token, may_more = self._read(tunnel_id, channel_id, token, limit, fetch)
        if isinstance(batch, EncodedBatch):
            return Page(None, next_token, may_more, encoded=batch)
        return Page(batch if batch is not None else empty_page_batch(layout), next_token,
                    may_more)

    def _read(
        self,
        tunnel_id: str,
        channel_id: str,
        token: str,
        limit: int,
        fetch: Callable[[Any, _Tunnel, _Channel, int], tuple[Any, int]],
    ) -> tuple[Any, str, bool]:
        """The checks and token arithmetic of a read; ``fetch(conn, tunnel, channel, after)``
        returns (payload, count) of the records after ``after`` (at most ``limit``)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            ch = self._channel(conn, tunnel, channel_id)
            status, _ = self._status_of(conn, tunnel, ch)
            if status is ChannelStatus.WAIT:
                raise ChannelNotReadableError(
                    channel_id=channel_id, tunnel_id=tunnel_id, status=status.value
                )
            if token == FINISHED:
                if not ch.closed:
                    raise MalformedTokenError(
                        channel_id=channel_id,
                        token=token,
                        reason="FINISHED given for a channel still open",
                    )
                return None, FINISHED, False
            after = _decode_token(token, tunnel.table, ch)
            if ch.trimmed_upto > after:
                raise TrimmedDataError(
                    channel_id=channel_id,
                    tunnel_id=tunnel_id,
                    requested=after + 1,
                    earliest=ch.trimmed_upto + 1,
                    lost=ch.trimmed_upto - after,
                    resume_token=encode_token(tunnel.table, channel_id, ch.trimmed_upto),
                )
            payload, count = fetch(conn, tunnel, ch, after)
            last = after + count  # sequences are gapless after the trim point
            finished = ch.closed and last == ch.head_seq
            mark = (
                finished
                and not conn.execute(
                    "SELECT 1 FROM cdc_reached_end WHERE tunnel_id = ? AND channel_id = ?",
                    (tunnel_id, channel_id),
                ).fetchone()
            )
        if mark:
            with self.store.transaction(write=True) as conn:
                conn.execute(
                    "INSERT OR IGNORE INTO cdc_reached_end (tunnel_id, channel_id) VALUES (?, ?)",
                    (tunnel_id, channel_id),
                )
        return (
            payload,
            FINISHED if finished else encode_token(tunnel.table, channel_id, last),
            last < ch.head_seq,
        )

    def _read_base(
        self, conn: Any, tunnel: _Tunnel, channel_id: str, after: int, limit: int
    ) -> list[Record]:
        schema = self.store.require_table(conn, tunnel.table)
        rows = conn.execute(
            "SELECT seq, pk, columns, commit_ts_us FROM cdc_base_records WHERE tunnel_id = ? "
            "AND channel_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (tunnel.tunnel_id, channel_id, after, limit),
        ).fetchall()
        return self.store.records_from_rows(
            schema, channel_id, [(r[0], Op.PUT.value, r[1], r[2], None, r[3]) for r in rows]
        )

    # --- progress (driver, CLI) ---------------------------------------------------------------

    def has_new_data(self, tunnel_id: str, positions: Mapping[str, str]) -> bool:
        """True if reading would return something (driver, ``latestOffset``): a readable
        channel has records past its position, a readable channel is missing from
        ``positions``, or a closed readable channel is not yet at FINISHED. A few indexed
        queries; never scans records."""
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            channels = self._channels(conn, tunnel)
            stored = self._stored(conn, tunnel_id)
        for ch in channels.values():
            if self._status(ch, stored) is not ChannelStatus.OPEN:
                continue
            token = positions.get(ch.channel_id)
            if token is None:
                return True
            if token == FINISHED:
                continue
            if _decode_token(token, tunnel.table, ch) < ch.head_seq or ch.closed:
                return True
        return False

    def head_sequences(self, tunnel_id: str) -> dict[str, str]:
        """Per channel of the tunnel (any status), the sequence of its newest record now
        ("" when empty). Driver, ``prepareForTriggerAvailableNow``."""
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            channels = self._channels(conn, tunnel)
        return {ch.channel_id: sequence_str(ch.head_seq) if ch.head_seq else ""
                for ch in channels.values()}

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag]:
        """Per channel not TERMINATED: records behind the head and the age of the oldest
        unread change (0.0 when caught up). Position = ``positions`` or the stored one."""
        now_us = time.time_ns() // 1000
        out: dict[str, ChannelLag] = {}
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            stored = self._stored(conn, tunnel_id)
            for ch in self._channels(conn, tunnel).values():
                if self._status(ch, stored) is ChannelStatus.TERMINATED:
                    continue
                token = positions.get(ch.channel_id) or self._position(tunnel, ch, stored).token
                if token == FINISHED:
                    out[ch.channel_id] = ChannelLag(ch.channel_id, 0, 0.0)
                    continue
                seq = _decode_token(token, tunnel.table, ch)
                behind = max(0, ch.head_seq - seq)
                age = 0.0
                if behind:
                    if ch.channel_type is ChannelType.BASE_DATA:
                        sql = (
                            "SELECT commit_ts_us FROM cdc_base_records WHERE tunnel_id = ? "
                            "AND channel_id = ? AND seq > ? ORDER BY seq LIMIT 1"
                        )
                        key = tunnel_id
                    else:
                        sql = (
                            "SELECT commit_ts_us FROM cdc_changes WHERE table_name = ? "
                            "AND channel_id = ? AND seq > ? ORDER BY seq LIMIT 1"
                        )
                        key = tunnel.table
                    row = conn.execute(sql, (key, ch.channel_id, seq)).fetchone()
                    if row is not None:
                        age = max(0.0, (now_us - row[0]) / 1e6)
                out[ch.channel_id] = ChannelLag(ch.channel_id, behind, age)
        return out


__all__ = ["BASE_PREFIX", "LocalTunnelService", "encode_token"]
