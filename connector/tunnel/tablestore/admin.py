"""The Tablestore client's administration role: tunnels, the table's schema, "not there".

``TablestoreAdministration`` (``connector.tunnel.base.TunnelAdministration``) maps the interface
onto the RPCs of the same names -- CreateTunnel, DescribeTunnel, ListTunnel, DeleteTunnel -- and
the table API's DescribeTable for ``table_schema`` (the ``tablestore`` SDK's protobuf messages,
imported there only). Lineage (``ChannelInfo.parent_ids``) comes from the emulator's extension
field and is empty on the real service, which holds children in WAIT instead.

"Not there" is confirmed before it is believed: a refusal in one of the service's "not there"
shapes is checked with ListTable / ListTunnel / DescribeTunnel (``_not_there``,
``_channel_error``, which the other roles use for their channel calls too). Driver, the
inspection CLI and the feed; executors only to confirm a refusal.
"""

from __future__ import annotations

from typing import Any

from connector.errors import (
    TunnelError,
    TunnelExistsError,
    TunnelServiceError,
    UnknownTableError,
    UnknownTunnelError,
)
from connector.tunnel.base import (
    ChannelInfo,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    ColumnSpec,
    StartPosition,
    TableSchema,
    TunnelAdministration,
    TunnelDescription,
    TunnelInfo,
    TunnelType,
)
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.calls import TablestoreCalls
from connector.tunnel.tablestore.refusals import channel_refusal, is_not_there, trimmed_data_error
from connector.tunnel.tablestore.transport import ServiceError

_CHANNEL_STATUSES = {s.value: s for s in ChannelStatus}
_CHANNEL_TYPES = {t.value: t for t in ChannelType}
_KEY_TYPES = {1: "INTEGER", 2: "STRING", 3: "BINARY"}
_COLUMN_TYPES = {1: "INTEGER", 2: "DOUBLE", 3: "BOOLEAN", 4: "STRING", 7: "BINARY"}


class TablestoreAdministration(TablestoreCalls, TunnelAdministration):
    """Tunnels and the schema over the wire (module docstring)."""

    #: tunnel id -> (table, tunnel name), learned from describe/list
    _tunnels: dict[str, tuple[str, str]]

    # --- "not there", confirmed ---------------------------------------------------------------

    def _table_exists(self, table: str) -> bool | None:
        """Does ListTable list ``table``? ``None`` when it cannot be told."""
        try:
            return table in self.list_tables()
        except TunnelError:
            return None

    def list_tables(self) -> list[str]:
        """ListTable's names, sorted (a multi-table query's selection)."""
        from tablestore.protobuf import table_store_pb2 as pb

        answer = self._call("/ListTable", pb.ListTableRequest(), pb.ListTableResponse)
        return sorted(answer.table_names)

    def _tunnel_exists(self, table: str, tunnel_name: str) -> bool | None:
        """Does ListTunnel of ``table`` list ``tunnel_name``? ``None`` when it cannot be told."""
        try:
            return any(t.tunnel_name == tunnel_name for t in self.list_tunnels(table))
        except UnknownTableError:
            return False
        except TunnelError:
            return None

    def _find_tunnel(self, tunnel_id: str) -> tuple[str, str] | None:
        """(table, name) of the tunnel with this id, confirmed by ListTunnel (of its table
        when known, else of every table); ``None`` when there is none. Errors propagate."""
        table = self._tunnels.get(tunnel_id, (None, ""))[0]
        try:
            tunnels = self.list_tunnels(table)
        except UnknownTableError:
            return None
        found = [t for t in tunnels if t.tunnel_id == tunnel_id]
        return (found[0].table_name, found[0].tunnel_name) if found else None

    def _not_there(self, exc: ServiceError, table: str,
                   tunnel_name: str | None = None) -> Exception | None:
        """A table or tunnel call refused in one of the "not there" shapes: which one is
        missing, as ListTable / ListTunnel confirm; ``None`` (the generic error) when
        neither is, or when it cannot be told."""
        if not is_not_there(exc):
            return None
        exists = self._table_exists(table)
        if exists is False:
            return UnknownTableError(table=table, endpoint=self.uri)
        if exists and tunnel_name is not None and self._tunnel_exists(table, tunnel_name) is False:
            return UnknownTunnelError(tunnel=tunnel_name, table=table)
        return None

    def _channel_error(self, exc: ServiceError, tunnel_id: str, channel_id: str, token: str,
                       push: Checkpoint | None = None) -> Exception | None:
        """A channel call (read, get or push a checkpoint) refused: trimmed data by its code
        and message prefix (the service's documented shape); "not there" confirmed by
        ListTunnel and DescribeTunnel, which also tell a WAIT or terminated channel."""
        trimmed = trimmed_data_error(exc, tunnel_id, channel_id)
        if trimmed is not None or not is_not_there(exc):
            return trimmed
        try:
            tunnel = self._find_tunnel(tunnel_id)
            if tunnel is None:
                return UnknownTunnelError(tunnel=tunnel_id, table="(any table)")
            channels = {c.channel_id: c for c in self.describe_tunnel(*tunnel).channels}
        except TunnelError:
            return None  # cannot be told: the service's own error stands
        return channel_refusal(exc, tunnel_id, channel_id, channels.get(channel_id), token, push)

    # --- tunnels (driver) ---------------------------------------------------------------------

    def _info(self, t: Any) -> TunnelInfo:
        try:
            tunnel_type = TunnelType(t.tunnel_type)
        except ValueError:
            raise TunnelServiceError(
                endpoint=self.uri, operation="/tunnel/describe", code="UnsupportedTunnelType",
                http_status=200, message=f"tunnel {t.tunnel_name!r} is of type "
                f"{t.tunnel_type!r}; only Stream and BaseAndStream are supported") from None
        start = StartPosition.EARLIEST
        if t.HasField("stream_tunnel_config") and t.stream_tunnel_config.HasField("flag"):
            if t.stream_tunnel_config.flag == m.FLAG_LATEST:
                start = StartPosition.LATEST
        self._tunnels[t.tunnel_id] = (t.table_name, t.tunnel_name)
        return TunnelInfo(t.tunnel_id, t.tunnel_name, t.table_name, tunnel_type, start,
                          t.create_time / 1e9 if t.HasField("create_time") else 0.0,
                          expired=t.HasField("expired") and t.expired)

    def _create_tunnel(self, table: str, tunnel_name: str, tunnel_type: TunnelType,
                       start_position: StartPosition, start_at_us: int | None) -> TunnelInfo:
        """CreateTunnel. ``start_at_us`` becomes ``StreamTunnelConfig.startOffset``
        (nanoseconds, sent instead of the flag, as both SDKs do)."""
        request = m.CreateTunnelRequest()
        t = request.tunnel
        t.table_name, t.tunnel_name = table, tunnel_name
        t.tunnel_type = m.TUNNEL_TYPE[tunnel_type.value]
        if start_at_us is not None:
            t.stream_tunnel_config.startOffset = start_at_us * 1000
        else:
            t.stream_tunnel_config.flag = (
                m.FLAG_LATEST if start_position is StartPosition.LATEST else m.FLAG_EARLIEST)

        def on_error(exc: ServiceError) -> Exception | None:
            if exc.code == "OTSTunnelExist":
                return TunnelExistsError(tunnel=tunnel_name, table=table)
            return self._not_there(exc, table)

        self._call("/tunnel/create", request, m.CreateTunnelResponse, on_error)
        return self.describe_tunnel(table, tunnel_name).tunnel

    def describe_tunnel(self, table: str, tunnel_name: str) -> TunnelDescription:
        response = self._call(
            "/tunnel/describe", m.DescribeTunnelRequest(table_name=table, tunnel_name=tunnel_name),
            m.DescribeTunnelResponse, lambda e: self._not_there(e, table, tunnel_name))
        channels = []
        for c in response.channels:  # dict lookups: a table may have hundreds of channels
            status = _CHANNEL_STATUSES.get(c.channel_status)
            ctype = _CHANNEL_TYPES.get(c.channel_type or ChannelType.STREAM.value)
            if status is None or ctype is None:
                unknown = (f"{c.channel_status!r} is not a valid ChannelStatus" if status is None
                           else f"{c.channel_type!r} is not a valid ChannelType")
                raise TunnelServiceError(
                    endpoint=self.uri, operation="/tunnel/describe", code="UnknownValue",
                    http_status=200, message=f"channel {c.channel_id!r}: {unknown}")
            channels.append(ChannelInfo(c.channel_id, status, ctype, tuple(c.parent_ids)))
        return TunnelDescription(self._info(response.tunnel), tuple(channels))

    def list_tunnels(self, table: str | None = None) -> list[TunnelInfo]:
        request = m.ListTunnelRequest()
        if table is not None:
            request.table_name = table
        response = self._call("/tunnel/list", request, m.ListTunnelResponse,
                              (lambda e: self._not_there(e, table)) if table else None)
        return [self._info(t) for t in response.tunnels]

    def delete_tunnel(self, table: str, tunnel_name: str) -> None:
        self._call("/tunnel/delete",
                   m.DeleteTunnelRequest(table_name=table, tunnel_name=tunnel_name),
                   m.DeleteTunnelResponse, lambda e: self._not_there(e, table, tunnel_name))

    def table_schema(self, table: str) -> TableSchema:
        """DescribeTable through the table API (the SDK's protobuf messages, imported here)."""
        from tablestore.protobuf import table_store_pb2 as pb

        response = self._call("/DescribeTable", pb.DescribeTableRequest(table_name=table),
                              pb.DescribeTableResponse,
                              lambda e: self._not_there(e, table))
        meta = response.table_meta
        return TableSchema(
            meta.table_name or table,
            tuple(ColumnSpec(k.name, _KEY_TYPES.get(k.type, "STRING")) for k in meta.primary_key),
            tuple(ColumnSpec(c.name, _COLUMN_TYPES.get(c.type, "STRING"))
                  for c in meta.defined_column),
        )

    def names_of(self, tunnel_id: str) -> tuple[str, str]:
        """(table, tunnel name) of a tunnel id (one ListTunnel of every table when unknown)."""
        if tunnel_id not in self._tunnels:
            self.list_tunnels()  # learns every tunnel's table and name
        if tunnel_id not in self._tunnels:
            raise UnknownTunnelError(tunnel=tunnel_id, table="(any table)")
        return self._tunnels[tunnel_id]


__all__ = ["TablestoreAdministration"]
