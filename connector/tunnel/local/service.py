"""The tunnel service of the embedded local store: ``local:///abs/path/store.db``.

The reference implementation of ``TunnelService``: the contract suite
(``tests/contract/tunnel_contract.py``) is written against it first. Tunnel state (tunnels,
per-tunnel checkpoints, base-data snapshots) lives in the same SQLite file as the tables
(``schema``), so a writer process, the Spark driver and executors all see one consistent state.
This class holds the contract's rules; the SQL on the tunnel's tables and the token format are
in ``tunnels``, the reads of the change log in ``changelog`` and ``segments``.

Who calls what, and where:
- the Spark driver: ``from_uri``, ``create_tunnel``/``ensure_tunnel``, ``describe_tunnel``,
  ``get_checkpoint``, ``checkpoint`` (push), ``has_new_data``, ``table_schema``;
- executors: ``read_page`` (columnar; ``read_records`` for other callers) on a service opened
  inside ``read()`` (one per process);
- the inspection CLI / dashboard: ``list_tunnels``, ``describe_tunnel``, ``lag``;
- the emulator's tunnel routes (``tablestore_emulator.tunnel_api``): the same methods, and
  ``_tunnel_by_id`` / ``_channel`` inside ``store.transaction()``.

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

Tokens ("after sequence s of channel c", independent of the tunnel) are described in
``tunnels``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping
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
    UnknownTunnelError,
)
from connector.tunnel.base import (
    FINISHED,
    ChannelInfo,
    ChannelLag,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    ReadResult,
    StartPosition,
    TableSchema,
    TunnelDescription,
    TunnelInfo,
    TunnelService,
    TunnelType,
)
from connector.tunnel.local import tunnels
from connector.tunnel.local.changelog import commit_times, read_changes
from connector.tunnel.local.channels import channel_rows
from connector.tunnel.local.names import check_new_tunnel_name, check_tunnel
from connector.tunnel.local.segments import read_page
from connector.tunnel.local.store import LocalTablestore
from connector.tunnel.local.tunnels import TunnelChannel, TunnelRow
from connector.tunnel.local.values import sequence_str
from connector.tunnel.page import (
    EncodedBatch,
    Page,
    PageLayout,
    empty_page_batch,
    records_to_page,
)

_URI_FORM = "local:///absolute/path/to/store.db"


class LocalTunnelService(TunnelService):
    """``TunnelService`` over a ``LocalTablestore`` file. One instance per process."""

    def __init__(self, store: LocalTablestore | str | os.PathLike[str]) -> None:
        self.store = store if isinstance(store, LocalTablestore) else LocalTablestore(store)
        self.uri = f"local://{self.store.path}"

    @classmethod
    def service_of(cls, uri: str) -> str:
        """The store file's absolute path, normalised (``/data/./x/../store.db`` is
        ``/data/store.db``); a query (refused when opened) does not name another store."""
        return os.path.normpath(unquote(urlsplit(uri).path))

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

    def _tunnel_by_id(self, conn: Any, tunnel_id: str) -> TunnelRow:
        """The tunnel, or ``UnknownTunnelError`` (also called by the emulator's routes)."""
        return tunnels.tunnel_by_id(conn, tunnel_id)

    def _tunnel_by_name(self, conn: Any, table: str, name: str) -> TunnelRow:
        self.store.require_table(conn, table)
        check_tunnel(name, table)
        tunnel_id = tunnels.tunnel_id_by_name(conn, table, name)
        if tunnel_id is None:
            raise UnknownTunnelError(tunnel=name, table=table)
        return tunnels.tunnel_by_id(conn, tunnel_id)

    def _channel(self, conn: Any, tunnel: TunnelRow, channel_id: str) -> TunnelChannel:
        """One channel of the tunnel, or ``UnknownChannelError`` (also called by the
        emulator's routes)."""
        return tunnels.tunnel_channel(conn, tunnel, channel_id)

    def _status_of(
        self, conn: Any, tunnel: TunnelRow, ch: TunnelChannel
    ) -> tuple[ChannelStatus, Checkpoint, Checkpoint | None]:
        """The channel's status for the tunnel, its position (stored or start) and its stored
        checkpoint (``None`` if none): one query with its parents'."""
        stored = tunnels.stored_checkpoints(
            conn, tunnel.tunnel_id, [ch.channel_id, *ch.parent_ids])
        return (tunnels.channel_status(ch, stored), tunnels.position(tunnel, ch, stored),
                stored.get(ch.channel_id))

    # --- tunnels (driver) ---------------------------------------------------------------------

    def _create_tunnel(self, table: str, tunnel_name: str, tunnel_type: TunnelType,
                       start_position: StartPosition, start_at_us: int | None) -> TunnelInfo:
        """Create a tunnel (driver or CLI). For BaseAndStream, snapshot the table in the same
        write transaction. ``TunnelExistsError`` if the name is taken on ``table``.
        ``start_at_us``: each channel starts before its first change committed at or after
        that instant (``tunnels.start_at``)."""
        check_new_tunnel_name(tunnel_name, table)
        if start_at_us is not None and tunnel_type is not TunnelType.STREAM:
            raise ValueError("a start instant applies to a Stream tunnel")
        tunnel = TunnelRow(
            str(uuid.uuid4()), table, tunnel_name, tunnel_type, start_position, time.time()
        )
        with self.store.transaction(write=True) as conn:
            self.store.require_table(conn, table)
            if tunnels.tunnel_id_by_name(conn, table, tunnel_name) is not None:
                raise TunnelExistsError(tunnel=tunnel_name, table=table)
            tunnels.insert_tunnel(conn, tunnel)
            starts: dict[str, str] = {}
            from_head = (
                tunnel_type is TunnelType.BASE_AND_STREAM or start_position is StartPosition.LATEST
            )
            for ch in channel_rows(conn, table):
                if start_at_us is not None:
                    starts[ch.channel_id] = tunnels.start_at(conn, table, ch, start_at_us)
                elif from_head:
                    starts[ch.channel_id] = FINISHED if ch.closed else tunnels.encode_token(
                        table, ch.channel_id, ch.head_seq)
                elif ch.trimmed_upto > 0:  # EARLIEST: the earliest record still held
                    starts[ch.channel_id] = tunnels.encode_token(
                        table, ch.channel_id, ch.trimmed_upto)
                if tunnel_type is TunnelType.BASE_AND_STREAM and not ch.closed:
                    tunnels.snapshot_base_data(conn, tunnel, ch)
            tunnels.store_start_positions(conn, tunnel, starts)
        return tunnel.info()

    def describe_tunnel(self, table: str, tunnel_name: str) -> TunnelDescription:
        """The tunnel and every channel (closed ones too) with its status for this tunnel."""
        with self.store.transaction() as conn:
            return self._described(conn, table, tunnel_name)[0]

    def _described(self, conn: Any, table: str, tunnel_name: str) -> tuple[
            TunnelDescription, TunnelRow, dict[str, TunnelChannel], dict[str, Checkpoint]]:
        """The description, with the tunnel, its channels and stored checkpoints it is from."""
        tunnel = self._tunnel_by_name(conn, table, tunnel_name)
        channels = tunnels.tunnel_channels(conn, tunnel)
        stored = tunnels.stored_checkpoints(conn, tunnel.tunnel_id)
        return TunnelDescription(tunnel.info(), tuple(
            ChannelInfo(c.channel_id, tunnels.channel_status(c, stored), c.channel_type,
                        c.parent_ids)
            for c in channels.values())), tunnel, channels, stored

    def list_tunnels(self, table: str | None = None) -> list[TunnelInfo]:
        with self.store.transaction() as conn:
            if table is not None:
                self.store.require_table(conn, table)
            return [tunnels.tunnel_by_id(conn, tid).info()
                    for tid in tunnels.tunnel_ids(conn, table)]

    def delete_tunnel(self, table: str, tunnel_name: str) -> None:
        """Delete the tunnel, its checkpoints and its base-data snapshot."""
        with self.store.transaction(write=True) as conn:
            tunnels.delete_tunnel(conn, self._tunnel_by_name(conn, table, tunnel_name).tunnel_id)

    def table_schema(self, table: str) -> TableSchema:
        return self.store.table_schema(table)

    def list_tables(self) -> list[str]:
        return self.store.list_tables()

    # --- checkpoints (driver) -----------------------------------------------------------------

    def get_checkpoint(self, tunnel_id: str, channel_id: str) -> Checkpoint:
        with self.store.transaction() as conn:
            tunnel, ch = tunnels.tunnel_and_channel(conn, tunnel_id, channel_id)
            stored = tunnels.stored_checkpoints(conn, tunnel_id, [channel_id])
            return tunnels.position(tunnel, ch, stored)

    def checkpoint(self, tunnel_id: str, channel_id: str, checkpoint: Checkpoint, *,
                   next_of_stored: bool = False) -> None:
        """Push a checkpoint (driver, from the source's commit).

        Checks, in order: the token is this channel's (``MalformedTokenError``); the sequence
        number is not lower than the stored one (``StaleCheckpointError``; equal is accepted);
        FINISHED only for a closed, readable channel whose end this tunnel reached, and nothing
        but FINISHED once terminated (``InvalidCheckpointError``).

        ``next_of_stored``: the Tablestore service's rule instead, as the emulator's
        ``/tunnel/checkpoint`` serves it: the sequence number must be the stored one + 1 (the
        start position's is 0), checked first, in the same transaction as the write
        (``StaleCheckpointError`` otherwise, naming both numbers).
        """
        seqno = checkpoint.sequence_number
        with self.store.transaction(write=True) as conn:
            tunnel, ch = tunnels.tunnel_and_channel(conn, tunnel_id, channel_id)

            def invalid(reason: str) -> InvalidCheckpointError:
                return InvalidCheckpointError(
                    channel_id=channel_id, tunnel_id=tunnel_id, reason=reason
                )

            status, current, stored = self._status_of(conn, tunnel, ch)
            if next_of_stored and seqno != current.sequence_number + 1:
                raise StaleCheckpointError(channel_id=channel_id, tunnel_id=tunnel_id,
                                           pushed=seqno, stored=current.sequence_number)
            if not checkpoint.sequence_is_valid:
                raise invalid(f"sequence number must be a non-negative integer, got {seqno!r}")
            if not checkpoint.finished:
                tunnels.decode_token(checkpoint.token, tunnel.table, ch)
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
                at_head = tunnels.decode_token(current.token, tunnel.table, ch) == ch.head_seq
                if not (at_head or tunnels.end_reached(conn, tunnel_id, channel_id)):
                    raise invalid(
                        f"FINISHED pushed but the channel's end (sequence "
                        f"{ch.head_seq}) was never reached by this tunnel: no read "
                        "returned FINISHED and the stored position is before it"
                    )
            tunnels.put_checkpoint(conn, tunnel_id, channel_id, checkpoint, time.time())

    # --- data (executors) -------------------------------------------------------------------

    def read_records(self, tunnel_id: str, channel_id: str, token: str, limit: int) -> ReadResult:
        """Read up to ``limit`` records after ``token`` (executor). Never blocks.

        ``next_token`` is the token after the last record returned, or FINISHED when the
        channel is closed and the records returned reach its end. TERMINATED channels can
        still be read (a replay may need to); WAIT channels raise ``ChannelNotReadableError``.
        ``TrimmedDataError`` carries ``resume_token``: the position after the lost records,
        to continue from when the user accepts the loss.
        """

        def fetch(conn: Any, tunnel: TunnelRow, ch: TunnelChannel, after: int) -> tuple[Any, int]:
            schema = self.store.require_table(conn, tunnel.table)
            if ch.channel_type is ChannelType.BASE_DATA:
                records = tunnels.read_base(conn, schema, tunnel_id, channel_id, after, limit)
            else:
                records = read_changes(conn, schema, channel_id, after, limit)
            return records, len(records)

        records, next_token, may_more, _ = self._read(tunnel_id, channel_id, token, limit, fetch)
        return ReadResult(records if records is not None else [], next_token, may_more)

    def read_page(
        self, tunnel_id: str, channel_id: str, token: str, limit: int, layout: PageLayout
    ) -> Page:
        """``read_records`` as one columnar page (executor): a slice of one of the store's
        sealed Arrow segments, or the unsealed tail converted
        (``segments.read_page``); no ``Record`` per sealed change. A page ends
        with its segment, so it may be shorter than ``limit``. Base-data channels go through
        records."""

        def fetch(conn: Any, tunnel: TunnelRow, ch: TunnelChannel, after: int) -> tuple[Any, int]:
            schema = self.store.require_table(conn, tunnel.table)
            if ch.channel_type is ChannelType.BASE_DATA:
                batch = records_to_page(
                    tunnels.read_base(conn, schema, tunnel_id, channel_id, after, limit), layout)
            else:
                batch = read_page(conn, schema, channel_id, after, limit, layout)
            return batch, batch.count if isinstance(batch, EncodedBatch) else batch.num_rows

        batch, next_token, may_more, tokens = self._read(tunnel_id, channel_id, token, limit, fetch)
        if isinstance(batch, EncodedBatch):
            return Page(None, next_token, may_more, encoded=batch, tokens=tokens)
        return Page(batch if batch is not None else empty_page_batch(layout), next_token,
                    may_more, tokens=tokens)

    def snapshot_rows(self, channel_id: str, sequences: Any) -> Any:
        """Every row of a base-data channel (``base-<stream channel>``), none of a stream's."""
        return channel_id.startswith(tunnels.BASE_PREFIX)

    def _read(
        self,
        tunnel_id: str,
        channel_id: str,
        token: str,
        limit: int,
        fetch: Callable[[Any, TunnelRow, TunnelChannel, int], tuple[Any, int]],
    ) -> tuple[Any, str, bool, Callable[[int], str]]:
        """The checks and token arithmetic of a read; ``fetch(conn, tunnel, channel, after)``
        returns (payload, count) of the records after ``after`` (at most ``limit``). Returns the
        payload, the next token, ``may_more`` and the token after the payload's first ``n``
        records (``Page.token_after``: sequences are gapless past the trim point)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        with self.store.transaction() as conn:
            tunnel, ch = tunnels.tunnel_and_channel(conn, tunnel_id, channel_id)
            status, _, _ = self._status_of(conn, tunnel, ch)
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
                return None, FINISHED, False, lambda n: FINISHED
            after = tunnels.decode_token(token, tunnel.table, ch)
            if ch.trimmed_upto > after:
                raise TrimmedDataError(
                    channel_id=channel_id,
                    tunnel_id=tunnel_id,
                    requested=after + 1,
                    earliest=ch.trimmed_upto + 1,
                    lost=ch.trimmed_upto - after,
                    resume_token=tunnels.encode_token(tunnel.table, channel_id, ch.trimmed_upto),
                )
            payload, count = fetch(conn, tunnel, ch, after)
            last = after + count  # sequences are gapless after the trim point
            finished = ch.closed and last == ch.head_seq
            mark = finished and not tunnels.end_reached(conn, tunnel_id, channel_id)
        if mark:
            with self.store.transaction(write=True) as conn:
                tunnels.mark_end_reached(conn, tunnel_id, channel_id)
        return (
            payload,
            FINISHED if finished else tunnels.encode_token(tunnel.table, channel_id, last),
            last < ch.head_seq,
            lambda n: tunnels.encode_token(tunnel.table, channel_id, after + n),
        )

    # --- progress (driver, CLI) ---------------------------------------------------------------

    def has_new_data(self, tunnel_id: str, positions: Mapping[str, str]) -> bool:
        """True if reading would return something (driver, ``latestOffset``): a readable
        channel has records past its position, a readable channel is missing from
        ``positions``, or a closed readable channel is not yet at FINISHED. A few indexed
        queries; never scans records."""
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            channels = tunnels.tunnel_channels(conn, tunnel)
            stored = tunnels.stored_checkpoints(conn, tunnel_id)
        for ch in channels.values():
            if tunnels.channel_status(ch, stored) is not ChannelStatus.OPEN:
                continue
            token = positions.get(ch.channel_id)
            if token is None:
                return True
            if token == FINISHED:
                continue
            if tunnels.decode_token(token, tunnel.table, ch) < ch.head_seq or ch.closed:
                return True
        return False

    def head_sequences(self, tunnel_id: str) -> dict[str, str]:
        """Per channel of the tunnel (any status), the sequence of its newest record now
        ("" when empty). Driver, ``prepareForTriggerAvailableNow``."""
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            channels = tunnels.tunnel_channels(conn, tunnel)
        return {ch.channel_id: sequence_str(ch.head_seq) if ch.head_seq else ""
                for ch in channels.values()}

    def describe_with_progress(
        self, table: str, tunnel_name: str
    ) -> tuple[TunnelDescription, dict[str, tuple[int, int | None]]]:
        """``describe_tunnel`` and, per channel of the tunnel (any status), what it consumed:
        (records before its stored checkpoint, commit time in microseconds of the last of them,
        ``None`` for base-data channels and before the first record); one transaction. The
        emulator's DescribeTunnel answer (its progress fields) comes from it."""
        counts: dict[str, int] = {}
        with self.store.transaction() as conn:
            description, tunnel, channels, stored = self._described(conn, table, tunnel_name)
            for ch in channels.values():
                cp = stored.get(ch.channel_id)  # none stored: at the channel's start
                counts[ch.channel_id] = (0 if cp is None else ch.head_seq if cp.finished
                                         else tunnels.decode_token(cp.token, tunnel.table, ch))
            last_us = commit_times(conn, tunnel.table, {
                ch.channel_id: counts[ch.channel_id] for ch in channels.values()
                if ch.channel_type is ChannelType.STREAM and counts[ch.channel_id] > 0})
        return description, {c: (count, last_us.get(c)) for c, count in counts.items()}

    def change_mark(self) -> tuple[float, ...]:
        """One question for every table of the store, asked by the multi-table source's idle
        rounds (``connector.multiplex``, planning process): a value that changes whenever any
        table's channel gets a record, splits, closes or is trimmed."""
        with self.store.transaction() as conn:
            row = conn.execute("SELECT count(*), total(head_seq), total(closed), "
                               "total(trimmed_upto) FROM cdc_channels").fetchone()
        return tuple(row)

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag]:
        """Per channel not TERMINATED: records behind the head and the age of the oldest
        unread change (0.0 when caught up). Position = ``positions`` or the stored one."""
        now_us = time.time_ns() // 1000
        out: dict[str, ChannelLag] = {}
        with self.store.transaction() as conn:
            tunnel = self._tunnel_by_id(conn, tunnel_id)
            stored = tunnels.stored_checkpoints(conn, tunnel_id)
            for ch in tunnels.tunnel_channels(conn, tunnel).values():
                if tunnels.channel_status(ch, stored) is ChannelStatus.TERMINATED:
                    continue
                token = positions.get(ch.channel_id) or tunnels.position(tunnel, ch, stored).token
                if token == FINISHED:
                    out[ch.channel_id] = ChannelLag(ch.channel_id, 0, 0.0)
                    continue
                seq = tunnels.decode_token(token, tunnel.table, ch)
                behind = max(0, ch.head_seq - seq)
                age = 0.0
                if behind:
                    oldest_us = tunnels.first_unread_commit_ts(conn, tunnel, ch, seq)
                    if oldest_us is not None:
                        age = max(0.0, (now_us - oldest_us) / 1e6)
                out[ch.channel_id] = ChannelLag(ch.channel_id, behind, age)
        return out


__all__ = ["LocalTunnelService"]
