"""The plain data of the tunnel interface: enums and frozen dataclasses, no I/O.

What ``TunnelService`` methods take and return (``connector.tunnel.base``) and what pages are
built from (``connector.tunnel.page``). The page module imports only this, so the interface can
import the page module without a cycle. Every name here is re-exported by
``connector.tunnel.base`` and ``connector.tunnel``, where callers import them from.
``FINISHED`` (a channel read to its end) comes from ``cdc_common.tokens``, shared with the meta
store.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc_common.tokens import FINISHED


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
    #: the service expired the tunnel (Tablestore's ``TunnelInfo.expired``: its change log
    #: passed the stream's retention); its data calls answer ``TunnelExpiredError``
    expired: bool = False


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

    @property
    def sequence_is_valid(self) -> bool:
        """A non-negative integer (not a bool): what every backend's ``checkpoint`` checks
        first (``InvalidCheckpointError`` otherwise)."""
        seqno = self.sequence_number
        return isinstance(seqno, int) and not isinstance(seqno, bool) and seqno >= 0


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
    """How far a position is behind a channel's head: always numbers, exact where the backend
    can count and otherwise lower bounds (``exact`` false) -- what one bounded read showed of
    a channel with more beyond it, or nothing (0) of a channel the service will not serve yet
    (a Tablestore child waiting for its parents) or whose records at the position were trimmed.
    """

    channel_id: str
    records_behind: int
    seconds_behind: float  # age of the oldest unread change; 0.0 when caught up
    #: False: both figures are lower bounds (the channel holds at least this much)
    exact: bool = True

    @classmethod
    def nothing_readable(cls, channel_id: str) -> ChannelLag:
        """A channel nothing can be read of now (waiting, trimmed): 0 and 0 s, lower bounds."""
        return cls(channel_id, 0, 0.0, exact=False)


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
