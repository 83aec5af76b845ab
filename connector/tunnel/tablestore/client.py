"""``TablestoreTunnelService``: the tunnel backend for ``http://`` and ``https://`` endpoints.

Speaks the Tablestore Tunnel service's wire protocol (``/tunnel/*`` protobuf RPCs, v2 signing,
PlainBuffer records) to a real instance or to the project's emulator
(``tablestore-cdc emulator``). Opened with a URI (the source builds it from its options,
connector/options.py)::

    https://INSTANCE.REGION.ots.aliyuncs.com?instance=INSTANCE
        &access_key_id=...&access_key_secret=...&security_token=...

``instance`` defaults to the host's first label; credentials missing from the URI come from
``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``_SECRET`` / ``ALIBABA_CLOUD_SECURITY_TOKEN``
(``cdc_common.credentials``). ``ca_bundle`` (a file path; the source option ``ssl.ca.bundle``)
is the CA bundle that verifies an https endpoint, else ``REQUESTS_CA_BUNDLE`` /
``SSL_CERT_FILE``, else the system's (``cdc_common.tls``). The query is validated by
``EndpointQuery`` (``cdc_common.uris.parse_query``: unknown, repeated or empty keys are
refused). The URI with secrets removed (``cdc_common.uris.redact_uri``, the source's
``safe_endpoint``) is this client's ``uri``: the only form that reaches logs, errors and
anything stored.

Who calls what (connector/tunnel/base.py): the driver calls tunnel, checkpoint and schema
methods; executors call ``read_page`` on a client opened in their own process, which decodes
PlainBuffer straight into the page's Arrow columns (``records.decode_columns``);
``read_records`` (``Record`` objects) serves the contract suite, ``has_new_data`` and tools.

How the interface maps onto the wire:

- ``describe_tunnel`` / ``create_tunnel`` / ``list_tunnels`` / ``delete_tunnel``: the RPCs of
  those names. Lineage (``ChannelInfo.parent_ids``) comes from the emulator's extension field
  and is empty on the real service, which holds children in WAIT instead.
- ``get_checkpoint`` / ``checkpoint`` / ``read_records``: GetCheckpoint, Checkpoint and
  ReadRecords with a fixed client id (``CLIENT_ID``) and no Connect/Heartbeat -- what the
  vendor's Spark connector does.
- ``checkpoint``: pushes carry the sequence number the official SDKs push, the stored one + 1
  (Go ``checkpointer.go``, Java ``TunnelStateMachine``: GetCheckpoint's number + 1, then one
  more per successful push); the consumer's own number is not sent. The client remembers the
  stored number per channel (from its last GetCheckpoint or successful push), so a push costs
  one call; it reads the number (GetCheckpoint) only for a channel it has not seen in this
  process, and when the service answers ``OTSSequenceNumberNotMatch`` (another writer pushed
  in between), then pushes once more at the re-read number + 1. A position the tunnel already
  holds is not pushed again. A push still refused after the re-read raises
  ``StaleCheckpointError``; the protocol never lets that pass silently for ``"finished"``.
- ``read_records(limit)``: ReadRecords has no limit; the request carries the emulator-only
  ``max_records``, and a longer page from a service that ignores it is cut with a token inside
  the page (``tokens``). Pushing such a token checkpoints the page token itself (the service
  only knows its own tokens): the tunnel's stored position may then be up to one page behind
  the source's own, which only matters to a new query without a Spark checkpoint.
- ``read_page`` prefetches (executors): the next page's request is sent before this page is
  decoded, and used only by the read that asks for exactly it (``prefetch``). Requests share
  one pool of kept-alive connections per client (``http``; the reader keeps one client per
  process).
- ``table_schema``: the table API's DescribeTable (key columns, and defined columns where the
  table declares them).
- ``has_new_data``, ``lag``: reads at each channel's position, and DescribeTunnel for the
  channel list (``progress``: the service has no cheaper way to tell; ``has_new_data`` asks
  the first channel before the list); the probes ``concurrent_calls`` (``DRIVER_CONCURRENCY``)
  at a time.
- The driver's checkpoint pushes run ``concurrent_calls`` at a time
  (``connector.planning.pushes``): ``checkpoint_many`` keeps that many requests in flight from
  the calling thread, and what it returns is pushed by ``checkpoint`` from that many threads;
  the client is safe to call from them (its per-channel state is keyed by channel, its
  transport's pool hands each call a connection).
- ``head_sequences``: ``None`` (the service reports no channel head): Trigger.AvailableNow
  bounds the run by commit time instead (``connector.planning.tracker.AvailableNowBound``).

Errors: the service's refusals become the product's types as ``refusals`` says; "not there"
is confirmed by ListTable / ListTunnel / DescribeTunnel here before it is believed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pydantic import Field

from cdc_common.credentials import (
    ALIBABA_ACCESS_KEY_ID,
    ALIBABA_ACCESS_KEY_SECRET,
    ALIBABA_SECURITY_TOKEN,
    alibaba_credentials,
)
from cdc_common.tls import ca_bundle, ca_bundle_problem
from cdc_common.uris import UriQuery, parse_query, redact_uri, tablestore_instance
from connector.errors import (
    EndpointTlsError,
    EndpointUnreachableError,
    InvalidCheckpointError,
    MalformedTokenError,
    OptionError,
    StaleCheckpointError,
    TransientTunnelError,
    TunnelAuthError,
    TunnelError,
    TunnelExistsError,
    TunnelExpiredError,
    TunnelParameterError,
    TunnelServiceError,
    UnknownTableError,
    UnknownTunnelError,
)
from connector.tunnel.base import (
    FINISHED,
    ChannelInfo,
    ChannelLag,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    ColumnSpec,
    ReadResult,
    StartPosition,
    TableSchema,
    TunnelDescription,
    TunnelInfo,
    TunnelService,
    TunnelType,
)
from connector.tunnel.page import Page, PageLayout, empty_page_batch
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.prefetch import PREFETCH_HELD, PrefetchedReads
from connector.tunnel.tablestore.progress import ChannelProbes
from connector.tunnel.tablestore.read_answer import ReadAnswer, read_answer
from connector.tunnel.tablestore.records import decode_columns, decode_page
from connector.tunnel.tablestore.refusals import (
    auth_hint,
    channel_refusal,
    is_not_there,
    trimmed_data_error,
)
from connector.tunnel.tablestore.tokens import SKIP_MARK, base_offset, split_token, token_content
from connector.tunnel.tablestore.transport import (
    RETRY_DEADLINE_S,
    Credentials,
    PendingCall,
    ResponseValidationError,
    ServiceError,
    TlsError,
    Transport,
    Unavailable,
    Unreachable,
)

#: the client id sent with reads and checkpoints (the service accepts ids it never issued)
CLIENT_ID = "tablestore-cdc"
_URI_FORM = "https://INSTANCE.REGION.ots.aliyuncs.com (or http://127.0.0.1:PORT?instance=NAME)"

#: the driver's per-channel calls at once: checkpoint pushes (``concurrent_calls``) and the
#: probes of ``has_new_data``; each waits a round trip, so 16 hide 16 of them per round
DRIVER_CONCURRENCY = 16
_READ_PATH = "/tunnel/readrecords"
_CHECKPOINT_PATH = "/tunnel/checkpoint"

_CHANNEL_STATUSES = {s.value: s for s in ChannelStatus}
_CHANNEL_TYPES = {t.value: t for t in ChannelType}
_KEY_TYPES = {1: "INTEGER", 2: "STRING", 3: "BINARY"}
_COLUMN_TYPES = {1: "INTEGER", 2: "DOUBLE", 3: "BOOLEAN", 4: "STRING", 7: "BINARY"}


class EndpointQuery(UriQuery):
    """The query of an ``http(s)://`` endpoint: the source's options fold the instance and the
    credentials into it (connector/options.py), so executors can open their own client."""

    credentials_hint: ClassVar[str] = (
        f"use the access.key.id / access.key.secret / security.token options or "
        f"{ALIBABA_ACCESS_KEY_ID} / {ALIBABA_ACCESS_KEY_SECRET} / {ALIBABA_SECURITY_TOKEN}")

    instance: str | None = Field(None, description="the instance name")
    access_key_id: str | None = Field(None, repr=False)
    access_key_secret: str | None = Field(None, repr=False)
    security_token: str | None = Field(None, repr=False)
    retry_deadline_s: float = Field(RETRY_DEADLINE_S, description="a number of seconds")
    ca_bundle: str | None = Field(None, description="the path of a PEM file of CA certificates")
    prefetch: bool = Field(True, description="true or false: read the next page ahead")


class _SequenceNotMatch(Exception):
    """Internal: the service refused a push's sequence number (``checkpoint`` re-reads)."""


def _checkpoint_request(tunnel_id: str, channel_id: str, page: str, sequence: int) -> Any:
    """The Checkpoint request pushing ``page`` at ``sequence`` (the stored number + 1)."""
    return m.CheckpointRequest(tunnel_id=tunnel_id, client_id=CLIENT_ID, channel_id=channel_id,
                               checkpoint=page, sequence_number=sequence)


class TablestoreTunnelService(TunnelService):
    """A Tunnel client for one endpoint and instance. One per process; cheap to open. Safe to
    call from several threads (the driver's concurrent pushes and probes)."""

    concurrent_calls = DRIVER_CONCURRENCY

    def __init__(self, endpoint: str, instance: str, credentials: Credentials, *,
                 uri: str | None = None, retry_deadline_s: float = RETRY_DEADLINE_S,
                 send_max_records: bool = True, ca_bundle: str | None = None,
                 prefetch: bool = True, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``clock`` and ``sleep`` time the transport's retries (tests pass a fake clock)."""
        self.endpoint = endpoint.rstrip("/")
        self.instance = instance
        self.uri = (redact_uri(uri, EndpointQuery.model_fields) if uri
                    else f"{self.endpoint}?instance={instance}")
        self._transport = Transport(self.endpoint, instance, credentials, retry_deadline_s,
                                    ca_bundle=ca_bundle, clock=clock, sleep=sleep,
                                    pool_size=max(PREFETCH_HELD, DRIVER_CONCURRENCY) + 1)
        #: tunnel id -> (table, tunnel name), learned from describe/list
        self._tunnels: dict[str, tuple[str, str]] = {}
        #: (tunnel id, channel id) -> (sequence number, checkpoint) the service holds, as last
        #: seen by this client (GetCheckpoint, or a push it accepted): the next push is + 1
        self._stored: dict[tuple[str, str], tuple[int, str]] = {}
        #: False makes reads behave as against a service without the emulator's page limit
        self.send_max_records = send_max_records
        self.prefetch = prefetch
        #: the next page's request per channel, sent ahead by ``read_page`` (executors)
        self._prefetches = PrefetchedReads()
        #: ``has_new_data`` and ``lag`` (driver)
        self._probes = ChannelProbes(self, self.concurrent_calls)

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def service_of(cls, uri: str) -> str:
        """The instance: its public, VPC and any other endpoint (``localhost`` or
        ``127.0.0.1`` for the emulator) reach the same instance, its tables and tunnels. From
        ``?instance=`` (the source folds ``instance.name`` into it), else the host's first label
        (``INSTANCE.REGION.ots.aliyuncs.com``)."""
        return tablestore_instance(uri) or str(urlsplit(uri).hostname)

    @classmethod
    def from_uri(cls, uri: str) -> TablestoreTunnelService:
        """Open ``http(s)://HOST[:PORT]?instance=...&access_key_id=...`` (driver or executor).
        Errors name the URI without its secrets."""
        parts = urlsplit(uri)

        def bad(problem: str) -> OptionError:
            return OptionError(option="endpoint", value=redact_uri(uri, EndpointQuery.model_fields),
                               problem=problem, allowed=_URI_FORM)

        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise bad("not an http(s)://HOST endpoint")
        if parts.username or parts.password:
            raise bad("credentials do not belong in the endpoint's user info; use the "
                      "access.key.id / access.key.secret options or the environment")
        if parts.path not in ("", "/"):
            raise bad("a Tablestore endpoint has no path")
        query = parse_query(parts.query, EndpointQuery, bad)
        instance = tablestore_instance(uri, query.instance)
        if not instance:
            raise bad("no instance name: set the instance.name option (or ?instance=)")
        creds = alibaba_credentials(query.access_key_id, query.access_key_secret,
                                    query.security_token)
        if not creds.access_key_id or not creds.access_key_secret:
            raise bad(f"no credentials: set access.key.id and access.key.secret, or "
                      f"{ALIBABA_ACCESS_KEY_ID} and {ALIBABA_ACCESS_KEY_SECRET}")
        bundle = None
        if parts.scheme == "https":
            bundle = ca_bundle(query.ca_bundle)
            problem = ca_bundle_problem(bundle) if bundle else None
            if problem:
                raise OptionError(option="ssl.ca.bundle", value=bundle, problem=problem,
                                  allowed="a PEM file of CA certificates (the option, else "
                                  "REQUESTS_CA_BUNDLE or SSL_CERT_FILE)")
        endpoint = f"{parts.scheme}://{parts.netloc}"
        return cls(endpoint, instance, Credentials(creds.access_key_id, creds.access_key_secret,
                                                   creds.security_token),
                   uri=uri, retry_deadline_s=query.retry_deadline_s, ca_bundle=bundle,
                   prefetch=query.prefetch)

    @property
    def prefetch_stats(self) -> dict[str, int]:
        """Prefetched answers used / sent and not used (tests and benchmarks read them)."""
        return self._prefetches.stats

    def close(self) -> None:
        self._probes.close()
        self._prefetches.close()
        self._transport.close()

    def __repr__(self) -> str:
        return f"<TablestoreTunnelService {self.uri}>"

    # --- calls and errors ---------------------------------------------------------------------

    def _call(self, path: str, request: Any, response_type: Any,
              on_error: Callable[[ServiceError], Exception | None] | None = None) -> Any:
        return self._send(path, request.SerializeToString(), response_type, on_error)

    def _send(self, path: str, body: bytes, response_type: Any,
              on_error: Callable[[ServiceError], Exception | None] | None = None,
              answer: PendingCall | None = None,
              parse: Callable[[bytes], Any] | None = None) -> Any:
        """``_call`` with the request already serialized; with ``answer`` (a request sent
        ahead), its answer instead of sending ``body``; ``parse`` instead of
        ``messages.parse(response_type, ...)`` when given."""
        try:
            data = answer.result() if answer is not None else self._transport.call(path, body)
        except Unavailable as exc:
            raise TransientTunnelError(detail=f"{self.uri} {path}: {exc}") from None
        except ResponseValidationError as exc:
            raise TunnelAuthError(endpoint=self.uri, operation=path, code="ResponseInvalid",
                                  http_status=200, message=str(exc),
                                  hint=auth_hint("ResponseInvalid")) from None
        except TlsError as exc:
            raise EndpointTlsError(problem=str(exc)) from None
        except Unreachable as exc:
            raise EndpointUnreachableError(problem=str(exc)) from None
        except ServiceError as exc:
            mapped = on_error(exc) if on_error is not None else None
            raise (mapped or self._generic(path, exc)) from None
        try:
            return parse(data) if parse is not None else m.parse(response_type, data)
        except m.MessageError as exc:
            raise TunnelServiceError(endpoint=self.uri, operation=path, code="BadResponse",
                                     http_status=200, message=str(exc)) from None

    def _generic(self, path: str, exc: ServiceError) -> Exception:
        fields = {"endpoint": self.uri, "operation": path, "code": exc.code,
                  "http_status": exc.http_status, "message": exc.message}
        if exc.code == "OTSTunnelServerUnavailable":
            return TransientTunnelError(detail=f"{self.uri} {path}: {exc.message}")
        if exc.code in ("OTSAuthFailed", "OTSPermissionDenied"):
            return TunnelAuthError(**fields, hint=auth_hint(exc.code))
        if exc.code == "OTSTunnelExpired":
            return TunnelExpiredError(**fields)
        if exc.code == "OTSParameterInvalid":
            return TunnelParameterError(**fields)
        return TunnelServiceError(**fields)

    # --- "not there", confirmed ---------------------------------------------------------------

    def _table_exists(self, table: str) -> bool | None:
        """Does ListTable list ``table``? ``None`` when it cannot be told."""
        from tablestore.protobuf import table_store_pb2 as pb

        try:
            names = self._call("/ListTable", pb.ListTableRequest(), pb.ListTableResponse)
        except TunnelError:
            return None
        return table in names.table_names

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
                          t.create_time / 1e9 if t.HasField("create_time") else 0.0)

    def create_tunnel(
        self,
        table: str,
        tunnel_name: str,
        tunnel_type: TunnelType = TunnelType.STREAM,
        start_position: StartPosition = StartPosition.EARLIEST,
        start_at_us: int | None = None,
    ) -> TunnelInfo:
        """CreateTunnel. ``start_at_us`` becomes ``StreamTunnelConfig.startOffset``
        (nanoseconds, sent instead of the flag, as both SDKs do)."""
        tunnel_type, start_position = TunnelType(tunnel_type), StartPosition(start_position)
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

    # --- checkpoints (driver) -------------------------------------------------------------------

    def _check_token(self, channel_id: str, token: Any) -> tuple[str, int]:
        """``(page token, skip)`` of a token this backend could have issued, else
        ``MalformedTokenError`` (no request sent)."""
        if not isinstance(token, str) or not token:
            raise MalformedTokenError(channel_id=channel_id, token=token,
                                      reason="a token is a non-empty string")
        if token == FINISHED:
            return token, 0
        try:
            page, skip = split_token(token)
            token_content(page)
        except ValueError as exc:
            raise MalformedTokenError(channel_id=channel_id, token=token,
                                      reason=str(exc)) from None
        return page, skip

    def get_checkpoint(self, tunnel_id: str, channel_id: str) -> Checkpoint:
        """The stored checkpoint and the service's sequence number for it (the number of
        pushes the service counted, not a record count)."""
        request = m.GetCheckpointRequest(tunnel_id=tunnel_id, client_id=CLIENT_ID,
                                         channel_id=channel_id)
        response = self._call("/tunnel/getcheckpoint", request, m.GetCheckpointResponse,
                              lambda e: self._channel_error(e, tunnel_id, channel_id, ""))
        stored = Checkpoint(response.checkpoint, int(response.sequence_number))
        self._stored[(tunnel_id, channel_id)] = (stored.sequence_number, stored.token)
        return stored

    def checkpoint(self, tunnel_id: str, channel_id: str, checkpoint: Checkpoint) -> None:
        """Push ``checkpoint.token`` (a mid-page token pushes its page token) at the stored
        sequence number + 1, the SDKs' rule; ``checkpoint.sequence_number`` is checked but not
        sent (module docstring). A position the tunnel already holds is not pushed again."""
        page, _ = self._check_token(channel_id, checkpoint.token)
        seqno = checkpoint.sequence_number
        if not checkpoint.sequence_is_valid:
            raise InvalidCheckpointError(
                channel_id=channel_id, tunnel_id=tunnel_id,
                reason=f"sequence number must be a non-negative integer, got {seqno!r}")
        key = (tunnel_id, channel_id)
        stored = self._stored.get(key)
        if stored is None:  # a channel this process has not seen: read what the tunnel holds
            got = self.get_checkpoint(tunnel_id, channel_id)
            stored = (got.sequence_number, got.token)

        def on_error(exc: ServiceError) -> Exception | None:
            if exc.code == "OTSSequenceNumberNotMatch":
                return _SequenceNotMatch(exc.message)
            return self._channel_error(exc, tunnel_id, channel_id, checkpoint.token,
                                       push=checkpoint)

        for attempt in (1, 2):
            if stored[1] == page:
                return  # held already (pushed before a crash, or by this process)
            request = _checkpoint_request(tunnel_id, channel_id, page, stored[0] + 1)
            try:
                self._call(_CHECKPOINT_PATH, request, m.CheckpointResponse, on_error)
            except _SequenceNotMatch as refused:
                # another writer pushed in between (or an earlier attempt of ours landed
                # unseen): the SDKs re-read the stored number and go on from it + 1
                pushed = stored[0] + 1
                got = self.get_checkpoint(tunnel_id, channel_id)
                stored = (got.sequence_number, got.token)
                if attempt == 2 and stored[1] != page:
                    raise StaleCheckpointError(
                        channel_id=channel_id, tunnel_id=tunnel_id, pushed=pushed,
                        stored=f"{stored[0]} (refused twice: {refused})") from None
                continue
            self._stored[key] = (stored[0] + 1, page)
            return

    def checkpoint_many(self, tunnel_id: str,
                        pushes: Sequence[tuple[str, Checkpoint]]) -> list[str]:
        """Push several channels' checkpoints from this one thread (driver): up to
        ``concurrent_calls`` requests in flight, each on a connection of its own, their
        answers read in the order sent -- the service works on them at once while this thread
        signs the next, with no thread pool's hand-offs and futures per call. Only the plain
        case is done here: a channel whose stored number this client knows, pushed at it + 1
        and accepted. Any other -- a channel not seen yet, a position not valid, a refusal, a
        network error -- is returned (in order) for ``checkpoint``, which re-reads, retries
        and raises as it always does. A position the tunnel holds already is not pushed."""
        left: list[str] = []
        in_flight: deque[tuple[str, tuple[int, str], str, PendingCall]] = deque()

        def settle(channel_id: str, stored: tuple[int, str], page: str,
                   answer: PendingCall) -> None:
            try:
                m.parse(m.CheckpointResponse, answer.result(again=False))
            except Exception:  # noqa: BLE001 - checkpoint() pushes it again, and meets it
                left.append(channel_id)
                return
            self._stored[(tunnel_id, channel_id)] = (stored[0] + 1, page)

        for channel_id, checkpoint in pushes:
            stored = self._stored.get((tunnel_id, channel_id))
            try:
                page, _ = self._check_token(channel_id, checkpoint.token)
            except Exception:  # noqa: BLE001 - checkpoint() raises it
                page = None
            if stored is None or page is None or not checkpoint.sequence_is_valid:
                left.append(channel_id)
                continue
            if stored[1] == page:
                continue  # held already
            request = _checkpoint_request(tunnel_id, channel_id, page, stored[0] + 1)
            in_flight.append((channel_id, stored, page, self._transport.send(
                _CHECKPOINT_PATH, request.SerializeToString())))
            if len(in_flight) >= self.concurrent_calls:
                settle(*in_flight.popleft())
        while in_flight:
            settle(*in_flight.popleft())
        order = {channel_id: i for i, (channel_id, _) in enumerate(pushes)}
        return sorted(left, key=order.__getitem__)

    # --- data (executors) -------------------------------------------------------------------

    def _read_request(self, tunnel_id: str, channel_id: str, page_token: str,
                      want: int) -> tuple[int | None, bytes]:
        """(max_records sent or ``None``, the serialized ReadRecords request)."""
        request = m.ReadRecordsRequest(tunnel_id=tunnel_id, client_id=CLIENT_ID,
                                       channel_id=channel_id, token=page_token)
        max_records = None
        if self.send_max_records:
            max_records = request.max_records = max(1, min(want, 2**31 - 1))
        return max_records, request.SerializeToString()

    def _read_page(self, tunnel_id: str, channel_id: str, page_token: str, want: int,
                   token: str, ahead: bool = False, scan: bool = False) -> ReadAnswer:
        """One ReadRecords answer (``read_answer``; ``scan``: its records left as bytes for
        the compiled decoder); ``ahead``: the prefetched one when it answers this request
        (module docstring)."""
        max_records, body = self._read_request(tunnel_id, channel_id, page_token, want)
        prefetched = (self._prefetches.take((tunnel_id, channel_id), page_token) if ahead
                      else None)
        on_error = lambda e: self._channel_error(e, tunnel_id, channel_id, token)  # noqa: E731
        parse = lambda data: read_answer(data, scan)  # noqa: E731
        if prefetched is not None:
            response = self._send(_READ_PATH, body, m.ReadRecordsResponse, on_error,
                                  prefetched.answer, parse)
            # asked with a higher limit: a page no longer than this one's limit answers it too
            if prefetched.answer.body == body or len(response.records) <= (max_records or 0):
                self.prefetch_stats["used"] += 1
                return response
            self.prefetch_stats["unused"] += 1
        return self._send(_READ_PATH, body, m.ReadRecordsResponse, on_error, parse=parse)

    def _send_ahead(self, tunnel_id: str, channel_id: str, page_token: str, want: int) -> None:
        """Send the request for the page after this one now; its answer is read by the read
        that asks for it (``prefetch``)."""
        _, body = self._read_request(tunnel_id, channel_id, page_token, want)
        self._prefetches.hold((tunnel_id, channel_id), page_token,
                              self._transport.send(_READ_PATH, body))

    # --- where the channels stand (driver; ``progress``) -------------------------------------

    def has_new_data(self, tunnel_id: str, positions: Mapping[str, str]) -> bool:
        """Driver, ``latestOffset``: a one-record read per OPEN channel from its position,
        stopping at the first that finds a record (``progress.ChannelProbes``)."""
        return self._probes.has_new_data(tunnel_id, positions)

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag]:
        """Per channel not TERMINATED, how far ``positions`` (else the pushed checkpoints) are
        behind, from one read at each position (``progress.ChannelProbes.lag``). Driver:
        progress report, read caps, ``minOffsetsPerTrigger``; ``tablestore-cdc meta lag``;
        the feed."""
        return self._probes.lag(tunnel_id, positions)

    def names_of(self, tunnel_id: str) -> tuple[str, str]:
        """(table, tunnel name) of a tunnel id (one ListTunnel of every table when unknown)."""
        if tunnel_id not in self._tunnels:
            self.list_tunnels()  # learns every tunnel's table and name
        if tunnel_id not in self._tunnels:
            raise UnknownTunnelError(tunnel=tunnel_id, table="(any table)")
        return self._tunnels[tunnel_id]

    def fetch(self, tunnel_id: str, channel_id: str, token: str, limit: int,
              ahead: bool = False, scan: bool = False
              ) -> tuple[Sequence[Any], int | None, str, bool] | None:
        """The wire records of up to ``limit`` records after ``token``, with the base offset
        of the first (``None`` if unknown), the token after them and ``may_more``; ``None``
        for ``limit == 0`` (nothing to ask the service). Shared by both read methods and
        ``lag`` (``progress``); ``ahead`` (``read_page``): with prefetch (``prefetch``);
        ``scan`` (``read_page``): the records as a ``columnar.RawRecords`` when the compiled
        scanner reads the answer (``read_answer``), else protobuf ``Record`` objects."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        page_token, skip = self._check_token(channel_id, token)
        if limit == 0 and token != FINISHED:
            return None
        response = self._read_page(tunnel_id, channel_id, page_token, skip + limit, token,
                                   ahead and not skip, scan)
        while skip and len(response.records) <= skip:
            # the service paged differently than when the token was made: skip whole pages
            if response.next_token == FINISHED or not response.records:
                raise MalformedTokenError(
                    channel_id=channel_id, token=token,
                    reason=f"it skips {skip} record(s) but only {len(response.records)} "
                    "follow its page token")
            skip -= len(response.records)
            page_token = response.next_token
            response = self._read_page(tunnel_id, channel_id, page_token, skip + limit, token,
                                       scan=scan)
        before = base_offset(page_token)
        wanted = response.records[skip:skip + limit]
        first = None if before is None else before + skip
        if skip + limit < len(response.records):
            return wanted, first, f"{page_token}{SKIP_MARK}{skip + limit}", True
        may_more = (response.may_more_record if response.may_more_record is not None
                    else len(response.records) >= 500)
        may_more = bool(may_more) and response.next_token != FINISHED
        if ahead and may_more:
            self._send_ahead(tunnel_id, channel_id, response.next_token, limit)
        return wanted, first, response.next_token, may_more

    def read_records(self, tunnel_id: str, channel_id: str, token: str, limit: int) -> ReadResult:
        """Up to ``limit`` records after ``token`` as ``Record`` objects (the contract suite,
        ``has_new_data``, tools); see the module docstring for tokens that point inside a
        service page."""
        fetched = self.fetch(tunnel_id, channel_id, token, limit)
        if fetched is None:
            return ReadResult([], token, True)
        wanted, first, next_token, may_more = fetched
        return ReadResult(decode_page(wanted, channel_id, token, first), next_token, may_more)

    def read_page(self, tunnel_id: str, channel_id: str, token: str, limit: int,
                  layout: PageLayout) -> Page:
        """Up to ``limit`` records after ``token`` as one columnar page (executor, the
        reader's path): PlainBuffer decoded straight into the page's columns
        (``records.decode_columns``), no ``Record`` per record; positions, tokens and errors
        as ``read_records``. The next page's request is sent ahead (module docstring)."""
        fetched = self.fetch(tunnel_id, channel_id, token, limit, ahead=self.prefetch,
                             scan=True)
        if fetched is None:
            return Page(empty_page_batch(layout), token, True)
        wanted, first, next_token, may_more = fetched
        return Page(decode_columns(wanted, channel_id, token, first, layout), next_token,
                    may_more)


__all__ = ["CLIENT_ID", "TablestoreTunnelService", "split_token", "token_content"]
