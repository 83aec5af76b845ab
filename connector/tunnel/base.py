"""The tunnel-service interface: what the Spark source needs from a change-data-capture service.

Shaped after the real Tablestore Tunnel service (see docs/protocol.md): tunnels on a table,
channels with a status, opaque string tokens, per-(tunnel, channel) checkpoints with a sequence
number, ``"finished"`` at a channel's end. Connect/heartbeat/client ids of the real wire protocol
are a backend's private business and do not appear here.

Who calls what:
- the driver (the Spark source's planning process) calls ``ensure_tunnel``, ``table_schema``,
  ``describe_tunnel``, ``get_checkpoint``, ``checkpoint`` (push), ``has_new_data`` and
  ``head_sequences``; the inspection CLI and dashboard call ``lag``;
- executors call ``read_page`` only (columnar pages, ``connector.tunnel.page``; its default
  is built on ``read_records``), each on a client opened inside ``read()``.

Backends are chosen by URI scheme in ``connector.tunnel.open_tunnel_service``. Every backend
passes the same contract suite (``tests/contract/tunnel_contract.py``).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from connector.tunnel.page import Page, PageLayout

#: Token of a channel read to its end (the real service's ``next_token == "finished"``).
FINISHED = "finished"


class TunnelType(enum.StrEnum):
    STREAM = "Stream"
    BASE_AND_STREAM = "BaseAndStream"


class StartPosition(enum.StrEnum):
    """Where a new tunnel starts reading the stream (the real service's StartOffsetFlag)."""

    EARLIEST = "EARLIEST"
    LATEST = "LATEST"


class ChannelType(enum.StrEnum):
    BASE_DATA = "BaseData"
    STREAM = "Stream"


class ChannelStatus(enum.StrEnum):
    """A channel's status *for one tunnel*; the real service's ``ChannelInfo.channel_status``."""

    WAIT = "WAIT"  # not readable yet: a parent (or the base data) is not finished for this tunnel
    OPEN = "OPEN"  # readable
    CLOSING = "CLOSING"  # the service is rebalancing it away (real service only)
    CLOSE = "CLOSE"  # may be assigned again (real service only)
    TERMINATED = "TERMINATED"  # its FINISHED checkpoint has been pushed for this tunnel


class Op(enum.StrEnum):
    PUT = "PUT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


@dataclass(frozen=True)
class TunnelInfo:
    tunnel_id: str
    tunnel_name: str
    table_name: str
    tunnel_type: TunnelType
    start_position: StartPosition
    created_at: float  # seconds since the epoch


@dataclass(frozen=True)
class ChannelInfo:
    """One channel as seen by one tunnel.

    ``parent_ids`` is the lineage where the backend knows it (the local store does; the real
    Tablestore service does not expose it and holds children in WAIT instead).
    """

    channel_id: str
    status: ChannelStatus
    channel_type: ChannelType = ChannelType.STREAM
    parent_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class TunnelDescription:
    tunnel: TunnelInfo
    channels: tuple[ChannelInfo, ...]


@dataclass(frozen=True)
class Checkpoint:
    """A resume position: ``token`` to read from, ``sequence_number`` for stale-push detection.

    The consumer chooses ``sequence_number``; it must never decrease for a channel. The
    Spark source uses the number of records consumed from the channel so far, plus one for
    the FINISHED checkpoint. A backend whose service numbers pushes itself (Tablestore: each
    push carries the stored number + 1, as the official SDKs push) checks the consumer's
    number but does not send it, and ``get_checkpoint`` returns the service's number.
    """

    token: str
    sequence_number: int

    @property
    def finished(self) -> bool:
        return self.token == FINISHED


@dataclass(frozen=True)
class Record:
    """One change. Values are plain Python (int, float, bool, str, bytes, None).

    - ``primary_key``: the row's key columns.
    - ``columns``: for PUT the whole new row's attribute columns; for UPDATE only the changed
      ones (``None`` = column deleted); empty for DELETE.
    - ``before``: the attribute columns before the change, ``None`` when the backend does not
      know them (or the row did not exist).
    - ``sequence``: sortable string, unique and increasing within the channel.
    - ``commit_ts_us``: commit time, microseconds since the epoch.
    """

    op: Op
    primary_key: Mapping[str, Any]
    columns: Mapping[str, Any]
    before: Mapping[str, Any] | None
    sequence: str
    commit_ts_us: int
    channel_id: str = ""

    def after_image(self) -> dict[str, Any] | None:
        """Attribute columns after the change (``None`` for a DELETE)."""
        if self.op is Op.DELETE:
            return None
        if self.op is Op.UPDATE and self.before is not None:
            merged = dict(self.before)
            merged.update(self.columns)
            return {k: v for k, v in merged.items() if v is not None}
        return dict(self.columns)


@dataclass(frozen=True)
class ReadResult:
    """What ``read_records`` returns.

    ``next_token`` is the token to continue from (``FINISHED`` once the channel is drained and
    closed); ``may_more`` says whether more records may be available *right now*.
    """

    records: Sequence[Record]
    next_token: str
    may_more: bool


@dataclass(frozen=True)
class ChannelLag:
    """How far a position is behind a channel's head, where the backend can tell."""

    channel_id: str
    records_behind: int | None
    seconds_behind: float | None  # age of the oldest unread change; 0.0 when caught up


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: str  # INTEGER, DOUBLE, BOOLEAN, STRING, BINARY


@dataclass(frozen=True)
class TableSchema:
    """A table's declared schema: key columns first, then declared attribute columns."""

    table_name: str
    primary_key: tuple[ColumnSpec, ...]
    columns: tuple[ColumnSpec, ...] = field(default_factory=tuple)


class TunnelService(ABC):
    """A client of one tunnel service endpoint. Not shared across processes; cheap to open.

    All methods are synchronous and may raise ``TransientTunnelError`` (retryable) or another
    ``TunnelError`` subclass (not retryable).
    """

    #: The URI this client was opened with, secrets removed (safe to log and to store).
    uri: str

    # --- tunnels (driver) ---------------------------------------------------------------

    @abstractmethod
    def create_tunnel(
        self,
        table: str,
        tunnel_name: str,
        tunnel_type: TunnelType = TunnelType.STREAM,
        start_position: StartPosition = StartPosition.EARLIEST,
    ) -> TunnelInfo:
        """Create a tunnel; ``TunnelExistsError`` if the name is taken on that table."""

    @abstractmethod
    def describe_tunnel(self, table: str, tunnel_name: str) -> TunnelDescription:
        """The tunnel and every channel it knows, with their status *for this tunnel*."""

    @abstractmethod
    def list_tunnels(self, table: str | None = None) -> list[TunnelInfo]:
        """Tunnels on ``table`` (all tables when ``None``)."""

    @abstractmethod
    def delete_tunnel(self, table: str, tunnel_name: str) -> None:
        """Delete a tunnel and its checkpoints."""

    def ensure_tunnel(
        self,
        table: str,
        tunnel_name: str,
        tunnel_type: TunnelType = TunnelType.STREAM,
        start_position: StartPosition = StartPosition.EARLIEST,
    ) -> TunnelInfo:
        """Return the named tunnel, creating it first if it does not exist (driver)."""
        from connector.errors import TunnelExistsError, UnknownTunnelError

        try:
            return self.describe_tunnel(table, tunnel_name).tunnel
        except UnknownTunnelError:
            pass
        try:
            return self.create_tunnel(table, tunnel_name, tunnel_type, start_position)
        except TunnelExistsError:  # created concurrently by another driver
            return self.describe_tunnel(table, tunnel_name).tunnel

    @abstractmethod
    def table_schema(self, table: str) -> TableSchema:
        """The table's declared schema, so the source can derive Spark types."""

    # --- checkpoints (driver) -------------------------------------------------------------

    @abstractmethod
    def get_checkpoint(self, tunnel_id: str, channel_id: str) -> Checkpoint:
        """The channel's stored checkpoint for this tunnel (its start position if none pushed)."""

    @abstractmethod
    def checkpoint(self, tunnel_id: str, channel_id: str, checkpoint: Checkpoint) -> None:
        """Push a checkpoint. Equal sequence again is accepted (idempotent); a lower one raises
        ``StaleCheckpointError`` (a backend whose service numbers pushes raises it when the
        service refuses the push after a re-read). Pushing ``FINISHED`` terminates the channel
        for this tunnel and releases children whose parents are all terminated."""

    # --- data (executors) -------------------------------------------------------------------

    @abstractmethod
    def read_records(
        self, tunnel_id: str, channel_id: str, token: str, limit: int
    ) -> ReadResult:
        """Read at most ``limit`` records after ``token``. Never blocks waiting for new data.

        Raises ``TrimmedDataError`` when records after ``token`` were trimmed away,
        ``MalformedTokenError`` for a token this backend never issued, and
        ``ChannelNotReadableError`` for a channel in WAIT.
        """

    def read_page(
        self, tunnel_id: str, channel_id: str, token: str, limit: int, layout: PageLayout
    ) -> Page:
        """Read at most ``limit`` records after ``token`` as one columnar page (executor).

        The executor's read path (``connector.reader``) calls this, never ``read_records``.
        Same positions, tokens, ``may_more`` and errors as ``read_records``; the records come
        as an Arrow batch shaped by ``layout`` (``connector.tunnel.page``). This default
        converts ``read_records``; a backend that can produce columns without a Python object
        per record overrides it.
        """
        from connector.tunnel.page import Page, records_to_page

        result = self.read_records(tunnel_id, channel_id, token, limit)
        return Page(records_to_page(result.records, layout), result.next_token, result.may_more)

    def has_new_data(self, tunnel_id: str, positions: Mapping[str, str]) -> bool | None:
        """Is anything readable beyond ``positions`` (channel id -> token)? ``None`` = can't tell.

        "New" includes a channel missing from ``positions`` that is readable, and a closed
        channel not yet at ``FINISHED`` (reading it would finish it). Called on the driver by
        ``latestOffset`` to skip empty batches.
        """
        return None

    def head_sequences(self, tunnel_id: str) -> dict[str, str] | None:
        """Per channel the tunnel knows (any status), the ``Record.sequence`` of its newest
        record now, ``""`` when it has none; ``None`` when the backend cannot tell. Called on the
        driver by ``prepareForTriggerAvailableNow`` to fix where an AvailableNow run stops."""
        return None

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag] | None:
        """Per channel, how far ``positions`` (channel id -> token) are behind the head;
        ``None`` when the backend cannot tell. Used by the inspection CLI and dashboard."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call twice."""

    def __enter__(self) -> TunnelService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
