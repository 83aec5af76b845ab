"""The tunnel-service interface in three roles: what the Spark source needs from a CDC service.

Shaped after the real Tablestore Tunnel service (see docs/protocol.md): tunnels on a table,
channels with a status, opaque string tokens, per-(tunnel, channel) checkpoints with a sequence
number, ``"finished"`` at a channel's end. Connect/heartbeat/client ids of the real wire protocol
are a backend's private business and do not appear here.

Each role is its own small interface, so a caller holds only what it needs (as Spark's Kafka
source keeps ``KafkaOffsetReader`` on the driver apart from the executors' consumer, and a
Flink FLIP-27 reader gets a two-method stream proxy):

- ``TunnelAdministration`` (driver, range-read planning, inspection CLI): create, describe,
  list and delete tunnels, ``ensure_tunnel``, ``table_schema``;
- ``ChannelPositions`` (driver): checkpoints (``get_checkpoint``, ``checkpoint``,
  ``checkpoint_many``) and where channels stand (``has_new_data``, ``head_sequences``,
  ``lag``: the backlog behind the read caps, the progress report's figures, ``meta lag``);
- ``ChannelReader`` (executors): ``read_page`` (columnar pages, ``connector.tunnel.page``;
  its default is built on ``read_records``). The executor's read path
  (``connector.reader``) receives only this role, on a client opened by the seam
  (``connector.clients``).

``TunnelService`` is a backend class: all three roles over one endpoint, chosen by URI scheme
in ``connector.tunnel.open_tunnel_service``. The plain data these methods take and return
(``Record``, ``Checkpoint``, ``TableSchema``, the enums, ``FINISHED``) lives in
``connector.tunnel.types`` and is re-exported here. Every backend passes every role's contract
suite (``tests/contract/tunnel_admin_contract.py``, ``channel_positions_contract.py``,
``channel_reader_contract.py``; ``tunnel_contract.py`` runs the three).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Self

from connector.errors import OptionError, TunnelExistsError, UnknownTunnelError
from connector.tunnel.endpoint import TunnelEndpoint
from connector.tunnel.page import Page, PageLayout, records_to_page
from connector.tunnel.types import (
    FINISHED,
    ChannelInfo,
    ChannelLag,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    ColumnSpec,
    Op,
    ReadResult,
    Record,
    StartPosition,
    TableSchema,
    TunnelDescription,
    TunnelInfo,
    TunnelType,
)

__all__ = [
    "FINISHED",
    "ChannelInfo",
    "ChannelLag",
    "ChannelPositions",
    "ChannelReader",
    "ChannelStatus",
    "ChannelType",
    "Checkpoint",
    "ColumnSpec",
    "Op",
    "ReadResult",
    "Record",
    "StartPosition",
    "TableSchema",
    "TunnelAdministration",
    "TunnelClient",
    "TunnelDescription",
    "TunnelInfo",
    "TunnelService",
    "TunnelType",
]


class TunnelClient(ABC):  # noqa: B024 - the roles below declare the abstract methods
    """What a client of every role has: the URI it was opened with and ``close``. Not shared
    across processes; cheap to open. Every call is synchronous and may raise
    ``TransientTunnelError`` (retryable) or another ``TunnelError`` subclass (not
    retryable)."""

    #: The URI this client was opened with, secrets removed (safe to log and to store).
    uri: str

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TunnelAdministration(TunnelClient):
    """Tunnels on a table and the table's schema (driver: binding, range-read planning;
    the inspection CLI and the feed)."""

    def create_tunnel(
        self,
        table: str,
        tunnel_name: str,
        tunnel_type: TunnelType = TunnelType.STREAM,
        start_position: StartPosition = StartPosition.EARLIEST,
        start_at_us: int | None = None,
    ) -> TunnelInfo:
        """Create a tunnel; ``TunnelExistsError`` if the name is taken on that table. The
        enums may come as their values; the backend's ``_create_tunnel`` gets them typed.

        ``start_at_us`` (a Stream tunnel; microseconds since the epoch, instead of
        ``start_position``): every channel starts at its first change committed at or after
        that instant, where the backend can start a tunnel there (Tablestore's
        ``StreamTunnelConfig.startOffset``, the embedded store); a backend that cannot
        (DynamoDB Streams) starts EARLIEST and the reader passes over the older records
        (``connector.planning.starting``). Where changes at or after the instant may already be
        trimmed, the channel starts before the trimmed records, so the first read reports the
        loss (``TrimmedDataError``)."""
        return self._create_tunnel(table, tunnel_name, TunnelType(tunnel_type),
                                   StartPosition(start_position), start_at_us)

    @abstractmethod
    def _create_tunnel(self, table: str, tunnel_name: str, tunnel_type: TunnelType,
                       start_position: StartPosition, start_at_us: int | None) -> TunnelInfo:
        """The backend's create, called by ``create_tunnel`` (driver or CLI)."""

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
        start_at_us: int | None = None,
    ) -> TunnelInfo:
        """Return the named tunnel, creating it first if it does not exist (driver)."""
        try:
            return self.describe_tunnel(table, tunnel_name).tunnel
        except UnknownTunnelError:
            pass
        try:
            return self.create_tunnel(table, tunnel_name, tunnel_type, start_position, start_at_us)
        except TunnelExistsError:  # created concurrently by another driver
            return self.describe_tunnel(table, tunnel_name).tunnel

    @abstractmethod
    def table_schema(self, table: str) -> TableSchema:
        """The table's declared schema, so the source can derive Spark types."""

    def list_tables(self) -> list[str]:
        """The names of the service's tables, sorted (driver: a multi-table query's selection,
        ``connector.multiplex``). A backend that cannot list them raises ``OptionError`` naming
        the ``tables`` option."""
        raise OptionError(option="tables", value=None,
                          problem=f"the {type(self).__name__} backend cannot list its tables",
                          allowed="a local:// or http(s):// endpoint, or table.name")


class ChannelPositions(TunnelClient):
    """Where each channel of a tunnel stands: its pushed checkpoint, and what waits beyond a
    position (driver: the protocol's pushes, ``latestOffset``, the read caps, the progress
    report; the inspection CLI and the feed)."""

    #: How many per-channel calls of the driver (checkpoint pushes, ``connector.planning.
    #: pushes``) are worth running at once: a backend whose calls are network round trips says
    #: more than 1 and must then be safe to call from that many threads; 1 (the default) runs
    #: them one after another.
    concurrent_calls: int = 1

    @abstractmethod
    def get_checkpoint(self, tunnel_id: str, channel_id: str) -> Checkpoint:
        """The channel's stored checkpoint for this tunnel (its start position if none pushed)."""

    @abstractmethod
    def checkpoint(self, tunnel_id: str, channel_id: str, checkpoint: Checkpoint) -> None:
        """Push a checkpoint. Equal sequence again is accepted (idempotent); a lower one raises
        ``StaleCheckpointError`` (a backend whose service numbers pushes raises it when the
        service refuses the push after a re-read). Pushing ``FINISHED`` terminates the channel
        for this tunnel and releases children whose parents are all terminated."""

    def checkpoint_many(self, tunnel_id: str,
                        pushes: Sequence[tuple[str, Checkpoint]]) -> list[str]:
        """Push several channels' checkpoints at once where the backend can (driver, from the
        protocol's pushes); returns the channel ids, in the given order, it did not push: the
        caller pushes those with ``checkpoint``, one by one, which applies every rule and
        raises every error. This default pushes none (every push goes through
        ``checkpoint``); a backend whose pushes are round trips overrides it."""
        return [channel_id for channel_id, _ in pushes]

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
        driver by ``prepareForTriggerAvailableNow``: with heads an AvailableNow run stops after
        each channel's head, without them by the records' commit times
        (``connector.planning.tracker.AvailableNowBound``)."""
        return None

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag] | None:
        """Per channel, how far ``positions`` (channel id -> token) are behind the head;
        ``None`` when the backend cannot tell. ``seconds_behind`` is the age of the oldest
        unread change, 0.0 for a caught-up channel (never a clock growing while a channel is
        idle). Called on the driver by the protocol's read caps (a channel's backlog shapes its
        share of ``maxOffsetsPerTrigger`` and ``maxBytesPerTrigger``), by
        ``minOffsetsPerTrigger`` (``connector.planning.backlog``) and by the latest-offset
        report (``connector.latest_offset_report``), and by the inspection CLI (``meta lag``)
        and the feed behind the dashboard."""
        return None


class ChannelReader(TunnelClient):
    """Reading a channel from a token (executors: ``connector.reader``, the range read's
    tasks; the driver reads too where a backend answers ``lag`` with reads)."""

    #: How precise ``Record.commit_ts_us`` is, in microseconds: a backend whose service rounds
    #: commit times down (DynamoDB Streams: to the second) says so, and a read that starts at
    #: an instant (``startingTimestamp``) passes over only records older than the instant
    #: rounded down the same way -- it never drops a change made after it.
    commit_time_granularity_us: int = 1

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
        as an Arrow batch shaped by ``layout`` (``connector.tunnel.page``), and the page can
        tell the token after any of its records (``Page.token_after``) so a read can stop
        inside it without asking again. This default converts ``read_records`` and cannot
        tell those tokens; every backend overrides it.
        """
        result = self.read_records(tunnel_id, channel_id, token, limit)
        return Page(records_to_page(result.records, layout, token=token), result.next_token,
                    result.may_more)

    def snapshot_rows(self, channel_id: str, sequences: Any) -> Any:
        """Which rows of a page of ``channel_id`` are base data, the table's snapshot that a
        BaseAndStream tunnel reads before its stream (executor, ``snapshot.op=READ``:
        ``connector.schema.mark_snapshot_reads``): True or False for the whole page, or a
        boolean Arrow array per row, from the page's ``_sequence`` Arrow array ``sequences``.
        Decided from the channel and the rows alone, so a replayed read marks the same rows.
        This default is for a backend without base data (DynamoDB Streams): none."""
        return False


class TunnelService(TunnelAdministration, ChannelPositions, ChannelReader):
    """A backend: every role over one endpoint, opened by ``connector.tunnel.open_tunnel_service``
    (the seam ``connector.clients`` opens it for the source, with retries)."""

    @classmethod
    @abstractmethod
    def service_of(cls, uri: str) -> str:
        """What names the service behind ``uri``: the same for every spelling that reaches it
        (another host name, a parameter that only says how to reach it), different for
        another service. Part of the source identity (``connector.identity``); parses only,
        makes no request."""

    @classmethod
    def from_uri(cls, uri: str) -> Self:
        """Open a client for ``uri`` (driver or executor)."""
        raise NotImplementedError(f"{cls.__name__} opens no URI")

    @classmethod
    def from_endpoint(cls, endpoint: TunnelEndpoint) -> Self:
        """Open a client from the typed endpoint the source's options carry
        (``connector.tunnel.endpoint``); this default opens its URI."""
        return cls.from_uri(endpoint.uri)
