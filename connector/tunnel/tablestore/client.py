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
- ``read_records(limit)``: ReadRecords has no limit. The request carries the emulator-only
  ``max_records``; a service that ignores it may return a longer page, and then the client
  returns the first ``limit`` records with the token ``"<page token>~<k>"`` ("k records after
  that token"). Reading from such a token re-reads the page and skips k records (order within a
  channel is deterministic; page boundaries need not repeat, so a skip past a page continues
  from its ``next_token``). Pushing such a token checkpoints the page token itself (the service
  only knows its own tokens): the tunnel's stored position may then be up to one page behind
  the source's own, which only matters to a new query without a Spark checkpoint.
- ``read_page`` prefetches (executors): when a page says more records follow, the request for
  the next page (its ``next_token``, the same limit) is sent before the page is decoded
  (``Transport.send``: on a connection of its own, no thread), so the service prepares it while
  this process decodes and hands the page on. The next ``read_page`` of that channel takes the
  answer when it asks for the same request -- or for a lower limit the answer does not exceed,
  since a page shorter than asked is an answer the service may always give -- and sends its own
  request otherwise (another token, a page longer than the new limit, a request sent more than
  ``PREFETCH_MAX_AGE_S`` ago; a prefetch that failed is done again as a plain call, so its
  error is the caller's own). So a caller gets exactly the answers it asked for, whatever was
  prefetched: a page requested past a batch's end is held unread (at most ``PREFETCH_HELD`` per
  client, the oldest dropped, each one kept-alive connection) and never handed out unless a
  later read asks for it. ``prefetch=false`` in the endpoint's query (the source option
  ``read.prefetch``) switches it off. Requests share one urllib3 connection pool per client
  (keep-alive; the reader keeps one client per process).
- ``table_schema``: the table API's DescribeTable (key columns, and defined columns where the
  table declares them).
- ``has_new_data``: DescribeTunnel plus a one-record ReadRecords per OPEN channel from its
  position (the service has no cheaper way to tell): the first channel alone, then the others
  ``concurrent_calls`` (``DRIVER_CONCURRENCY``) at a time, until one says yes.
- The driver's checkpoint pushes run ``concurrent_calls`` at a time
  (``connector.planning.pushes``); the client is safe to call from that many threads (its
  per-channel state is keyed by channel, its transport's pool hands each call a connection).
- ``lag``: DescribeTunnel, then one ReadRecords per readable channel at its position: caught up
  (``may_more`` false, or the token did not move) is 0 behind; otherwise the first unread
  change's commit time gives the seconds behind, and the page's count the records behind when
  it holds all there is now (see ``lag``).
- ``head_sequences``: ``None`` (the service reports no channel head): Trigger.AvailableNow
  bounds the run by commit time instead (``connector.planning.tracker.AvailableNowBound``).

Errors (service code -> the product's type): retryable ones (``transport``'s rules, the
SDKs') are retried inside the transport for a bounded time, then ``TransientTunnelError``; an
``OTSTunnelServerUnavailable`` whose message begins ``OTSTrimmedDataAccess`` is
``TrimmedDataError`` at once (never retried); ``OTSSequenceNumberNotMatch`` is handled by
``checkpoint``; ``OTSTunnelExist`` is ``TunnelExistsError``; ``OTSTunnelExpired``,
``OTSAuthFailed`` / ``OTSPermissionDenied`` are ``TunnelExpiredError`` and ``TunnelAuthError``.
The service says "not there" in two shapes -- 404 ``OTSObjectNotExist`` and 400
``OTSParameterInvalid`` ("parameter incorrect or the requested data table does not exist") --
and the second also means a bad request. So a refusal in either shape is *confirmed* before
it becomes ``UnknownTableError`` / ``UnknownTunnelError`` / ``UnknownChannelError`` (and before
``ensure_tunnel`` creates anything): ListTable for the table, ListTunnel for the tunnel,
DescribeTunnel for the channel and its status (a WAIT channel is
``ChannelNotReadableError``; a refused ``"finished"`` push or a push to a terminated channel
``InvalidCheckpointError``; any other refused read or push names the token,
``MalformedTokenError``). What cannot be confirmed stays ``TunnelParameterError`` /
``TunnelServiceError`` carrying the service's code and message; messages are never parsed for
meaning. An https endpoint whose certificate or host name does not verify is
``EndpointTlsError`` at once; at a query's start, an endpoint that gives no answer at all (no
such host, connection refused, no HTTP answer) is ``EndpointUnreachableError`` at once
(``cdc_common.first_contact``). Refused credentials (``TunnelAuthError``) name the options that
carry them (``auth_hint``).
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
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
    ChannelNotReadableError,
    EndpointTlsError,
    EndpointUnreachableError,
    InvalidCheckpointError,
    MalformedTokenError,
    OptionError,
    StaleCheckpointError,
    TransientTunnelError,
    TrimmedDataError,
    TunnelAuthError,
    TunnelError,
    TunnelExistsError,
    TunnelExpiredError,
    TunnelParameterError,
    TunnelServiceError,
    UnknownChannelError,
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
from connector.tunnel.tablestore.records import decode_columns, decode_page
from connector.tunnel.tablestore.transport import (
    RETRY_DEADLINE_S,
    TRIMMED_PREFIX,
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
#: records ``lag`` asks for per channel (the service's page: it sends up to about 500 anyway)
LAG_PEEK_RECORDS = 500
#: separates a page token from a record count in a client token (not a base64 character)
SKIP_MARK = "~"
_URI_FORM = "https://INSTANCE.REGION.ots.aliyuncs.com (or http://127.0.0.1:PORT?instance=NAME)"
#: the emulator's addition to a trimmed-data message (the first position still held)
_TRIM_DETAIL = re.compile(r"\[requested=(\S+) earliest=(\S+) lost=(\S+) resume=(\S*)\]")
#: the two shapes in which the service refuses a table, tunnel or channel that is not there
_NOT_THERE_CODES = ("OTSObjectNotExist", "OTSParameterInvalid")

#: the driver's per-channel calls at once: checkpoint pushes (``concurrent_calls``) and the
#: probes of ``has_new_data``; each waits a round trip, so 16 hide 16 of them per round
DRIVER_CONCURRENCY = 16
#: prefetched requests a client holds (one per channel, each on its own connection; the
#: oldest is dropped first)
PREFETCH_HELD = 8
#: a prefetched answer older than this is not used: a fresh read may hold more records
PREFETCH_MAX_AGE_S = 5.0
_READ_PATH = "/tunnel/readrecords"

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


@dataclass(frozen=True)
class _Prefetch:
    """A ReadRecords request sent ahead for one channel, its answer not read yet."""

    page_token: str
    started: float
    answer: PendingCall


def auth_hint(code: str) -> str:
    """What to fix when the service refuses the credentials (``TunnelAuthError``): the options
    that carry them, and the environment variables they default to."""
    keys = (f"access.key.id / access.key.secret (or {ALIBABA_ACCESS_KEY_ID} / "
            f"{ALIBABA_ACCESS_KEY_SECRET})")
    if code == "OTSPermissionDenied":
        return (f"the key lacks a permission on this instance: grant it (a RAM policy) or use "
                f"another key in {keys}")
    if code == "ResponseInvalid":
        return (f"check access.key.secret (or {ALIBABA_ACCESS_KEY_SECRET}), and that nothing "
                "between this machine and the endpoint alters responses")
    return (f"the service refused the credentials: check {keys}, security.token (or "
            f"{ALIBABA_SECURITY_TOKEN}) for an STS key, and instance.name")


class _SequenceNotMatch(Exception):
    """Internal: the service refused a push's sequence number (``checkpoint`` re-reads)."""


def split_token(token: str) -> tuple[str, int]:
    """``(page token, records to skip after it)`` of a client token."""
    page, mark, skip = token.partition(SKIP_MARK)
    if not mark:
        return token, 0
    if not skip.isdigit() or int(skip) <= 0:
        raise ValueError(f"bad record count {skip!r}")
    return page, int(skip)


def token_content(token: str) -> Any:
    """The ``TokenContent(V2)`` inside a service token; ``ValueError`` if it is not one."""
    try:
        raw = base64.b64decode(token.encode("ascii"), validate=True)
        envelope = m.parse(m.Token, raw)
        if envelope.version == 2:
            return m.parse(m.TokenContentV2, envelope.content)
        if envelope.version == 1:
            return m.parse(m.TokenContent, envelope.content)
    except (UnicodeError, binascii.Error, m.MessageError) as exc:
        raise ValueError(f"not a tunnel token ({exc})") from None
    raise ValueError(f"unknown token version {envelope.version}")


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
        #: (tunnel id, channel id) -> the next page's request sent ahead (``read_page``)
        self._prefetched: OrderedDict[tuple[str, str], _Prefetch] = OrderedDict()
        self._lock = threading.Lock()
        #: the driver's ``has_new_data`` probes, ``DRIVER_CONCURRENCY`` at a time
        self._probe_pool: ThreadPoolExecutor | None = None
        #: (tunnel id, channel id) -> a position a probe found records after: asked again at
        #: the same position, the answer is the same (records do not vanish; trimming is
        #: reported by the read), so the channel is not probed again
        self._has_data: dict[tuple[str, str], str] = {}
        #: prefetched answers used / sent and not used (tests and benchmarks read them)
        self.prefetch_stats = {"used": 0, "unused": 0}

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

    def close(self) -> None:
        with self._lock:
            pool, self._probe_pool = self._probe_pool, None
            held = list(self._prefetched.values())
            self._prefetched.clear()
        for prefetch in held:
            prefetch.answer.discard()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._transport.close()

    def __repr__(self) -> str:
        return f"<TablestoreTunnelService {self.uri}>"

    # --- calls and errors ---------------------------------------------------------------------

    def _call(self, path: str, request: Any, response_type: Any,
              on_error: Callable[[ServiceError], Exception | None] | None = None) -> Any:
        return self._send(path, request.SerializeToString(), response_type, on_error)

    def _send(self, path: str, body: bytes, response_type: Any,
              on_error: Callable[[ServiceError], Exception | None] | None = None,
              answer: PendingCall | None = None) -> Any:
        """``_call`` with the request already serialized; with ``answer`` (a request sent
        ahead), its answer instead of sending ``body``."""
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
            return m.parse(response_type, data)
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
        if exc.code not in _NOT_THERE_CODES:
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
        msg = exc.message
        if exc.code == "OTSTunnelServerUnavailable" and msg.startswith(TRIMMED_PREFIX):
            detail = _TRIM_DETAIL.search(msg)
            requested, earliest, lost, resume = (
                detail.groups() if detail else ("(unknown)", "(unknown)", "(unknown)", ""))
            return TrimmedDataError(channel_id=channel_id, tunnel_id=tunnel_id,
                                    requested=requested, earliest=earliest, lost=lost,
                                    resume_token=resume, service_message=msg)
        if exc.code not in _NOT_THERE_CODES:
            return None
        try:
            tunnel = self._find_tunnel(tunnel_id)
            if tunnel is None:
                return UnknownTunnelError(tunnel=tunnel_id, table="(any table)")
            channels = {c.channel_id: c for c in self.describe_tunnel(*tunnel).channels}
        except TunnelError:
            return None  # cannot be told: the service's own error stands
        channel = channels.get(channel_id)
        if channel is None:
            return UnknownChannelError(channel_id=channel_id, tunnel_id=tunnel_id)
        if push is not None:
            if push.finished or channel.status is ChannelStatus.TERMINATED:
                return InvalidCheckpointError(channel_id=channel_id, tunnel_id=tunnel_id,
                                              reason=f"refused by the service: {msg}")
            return MalformedTokenError(channel_id=channel_id, token=token, reason=msg)
        if channel.status is ChannelStatus.WAIT:
            return ChannelNotReadableError(channel_id=channel_id, tunnel_id=tunnel_id,
                                           status=channel.status.value)
        if token:  # a read: the channel is there and readable, so the token is refused
            return MalformedTokenError(channel_id=channel_id, token=token, reason=msg)
        return None

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
        for c in response.channels:
            try:
                status = ChannelStatus(c.channel_status)
                ctype = ChannelType(c.channel_type or ChannelType.STREAM.value)
            except ValueError as exc:
                raise TunnelServiceError(
                    endpoint=self.uri, operation="/tunnel/describe", code="UnknownValue",
                    http_status=200, message=f"channel {c.channel_id!r}: {exc}") from None
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
        if isinstance(seqno, bool) or not isinstance(seqno, int) or seqno < 0:
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
            request = m.CheckpointRequest(tunnel_id=tunnel_id, client_id=CLIENT_ID,
                                          channel_id=channel_id, checkpoint=page,
                                          sequence_number=stored[0] + 1)
            try:
                self._call("/tunnel/checkpoint", request, m.CheckpointResponse, on_error)
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
                   token: str, ahead: bool = False) -> Any:
        """One ReadRecords answer; ``ahead``: the prefetched one when it answers this request
        (module docstring)."""
        max_records, body = self._read_request(tunnel_id, channel_id, page_token, want)
        prefetched = self._take_prefetch(tunnel_id, channel_id, page_token) if ahead else None
        on_error = lambda e: self._channel_error(e, tunnel_id, channel_id, token)  # noqa: E731
        if prefetched is not None:
            response = self._send(_READ_PATH, body, m.ReadRecordsResponse, on_error,
                                  prefetched.answer)
            # asked with a higher limit: a page no longer than this one's limit answers it too
            if prefetched.answer.body == body or len(response.records) <= (max_records or 0):
                self.prefetch_stats["used"] += 1
                return response
            self.prefetch_stats["unused"] += 1
        return self._send(_READ_PATH, body, m.ReadRecordsResponse, on_error)

    def _take_prefetch(self, tunnel_id: str, channel_id: str, page_token: str
                       ) -> _Prefetch | None:
        """The channel's prefetched request when it reads from ``page_token`` and is fresh;
        any other prefetch of the channel is dropped."""
        with self._lock:
            held = self._prefetched.pop((tunnel_id, channel_id), None)
        if held is None:
            return None
        if held.page_token == page_token and \
                time.monotonic() - held.started <= PREFETCH_MAX_AGE_S:
            return held
        held.answer.discard()
        self.prefetch_stats["unused"] += 1
        return None

    def _send_ahead(self, tunnel_id: str, channel_id: str, page_token: str, want: int) -> None:
        """Send the request for the page after this one now; its answer is read by the read
        that asks for it (``_take_prefetch``)."""
        _, body = self._read_request(tunnel_id, channel_id, page_token, want)
        answer = self._transport.send(_READ_PATH, body)
        with self._lock:
            key = (tunnel_id, channel_id)
            old = self._prefetched.pop(key, None)
            self._prefetched[key] = _Prefetch(page_token, time.monotonic(), answer)
            dropped = [old] if old is not None else []
            while len(self._prefetched) > PREFETCH_HELD:
                dropped.append(self._prefetched.popitem(last=False)[1])
        for held in dropped:
            held.answer.discard()
            self.prefetch_stats["unused"] += 1

    @staticmethod
    def _base_offset(page_token: str) -> int | None:
        """Records before ``page_token`` in a base-data channel, when the token says so."""
        if page_token == FINISHED:
            return None
        content = token_content(page_token)
        if content.iterator or not content.DESCRIPTOR.fields_by_name.get("total_count"):
            return None
        return int(content.total_count) if content.HasField("total_count") else None

    def has_new_data(self, tunnel_id: str, positions: Mapping[str, str]) -> bool:
        """Driver, ``latestOffset``: one DescribeTunnel, then a one-record read per OPEN
        channel from its position (the service has no cheaper way to tell) -- so an idle
        query costs a few small reads per trigger instead of an empty Spark batch. True when a
        channel is missing from ``positions``, returns a record, or reads to ``"finished"``; a
        trimmed position also counts (the batch reports it).

        The first channel is read alone (on a busy tunnel it says yes: one call); the others
        ``concurrent_calls`` at a time, no more being sent after the first yes. A channel found
        to have records at the same position before is not read again. An error is raised
        only when no channel says yes (the first in channel order)."""
        table, name = self._names(tunnel_id)
        probes: list[tuple[str, str]] = []
        for channel in self.describe_tunnel(table, name).channels:
            if channel.status is not ChannelStatus.OPEN:
                continue
            token = positions.get(channel.channel_id)
            if token is None or self._has_data.get((tunnel_id, channel.channel_id)) == token:
                return True
            if token != FINISHED:
                probes.append((channel.channel_id, token))
        if len(probes) < 3 or self.concurrent_calls < 2:  # one after another
            return any(self._probe(tunnel_id, ch, token) for ch, token in probes)
        if self._probe(tunnel_id, *probes[0]):  # a busy tunnel: the first channel tells
            return True
        probes = probes[1:]
        with self._lock:
            if self._probe_pool is None:
                self._probe_pool = ThreadPoolExecutor(self.concurrent_calls,
                                                      thread_name_prefix="tablestore-probe")
            pool = self._probe_pool
        futures = {pool.submit(self._probe, tunnel_id, ch, token): ch for ch, token in probes}
        errors: dict[str, BaseException] = {}
        try:
            for future in as_completed(futures):
                error = future.exception()
                if error is not None:
                    errors[futures[future]] = error
                elif future.result():
                    return True
        finally:
            for future in futures:
                future.cancel()  # not sent yet: not needed any more
        if errors:
            raise errors[min(errors)]
        return False

    def _names(self, tunnel_id: str) -> tuple[str, str]:
        """(table, tunnel name) of a tunnel id (one ListTunnel of every table when unknown)."""
        if tunnel_id not in self._tunnels:
            self.list_tunnels()  # learns every tunnel's table and name
        if tunnel_id not in self._tunnels:
            raise UnknownTunnelError(tunnel=tunnel_id, table="(any table)")
        return self._tunnels[tunnel_id]

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag]:
        """How far ``positions`` (else the pushed checkpoints) are behind, per channel not
        TERMINATED, from what the service reports: one DescribeTunnel, then one ReadRecords
        per readable channel at its position (the page the service sends anyway; only its
        first record is decoded). Called on the driver (progress report, read caps,
        ``minOffsetsPerTrigger``), by ``tablestore-cdc meta lag`` and by the feed.

        - ``seconds_behind``: 0 when the read shows the channel caught up (``may_more`` false,
          or an empty page whose token did not move; ``"finished"``), else the age of the
          first unread change (now minus its commit time). A caught-up channel shows 0, not a
          clock growing since its last change. (The service's ``channel_rpo`` is the commit
          time of the last change before the *pushed* checkpoint: it trails the source's own
          position by up to ``commitInterval`` batches and grows while a channel is idle, so
          it is not used for this figure.)
        - ``records_behind``: exact when that page holds everything readable now
          (``may_more`` false), else ``None``: the service does not count what is ahead.
        - A WAIT channel cannot be read until its parents end: both figures ``None``; so is a
          position whose records were trimmed, or an empty page that still says more may
          follow."""
        now_us = time.time_ns() // 1000
        out: dict[str, ChannelLag] = {}
        for channel in self.describe_tunnel(*self._names(tunnel_id)).channels:
            ch = channel.channel_id
            if channel.status is ChannelStatus.TERMINATED:
                continue
            if channel.status is ChannelStatus.WAIT:
                out[ch] = ChannelLag(ch, None, None)
                continue
            token = positions.get(ch) or self.get_checkpoint(tunnel_id, ch).token
            if token == FINISHED:
                out[ch] = ChannelLag(ch, 0, 0.0)
                continue
            try:
                fetched = self._fetch(tunnel_id, ch, token, LAG_PEEK_RECORDS)
            except TrimmedDataError:
                out[ch] = ChannelLag(ch, None, None)
                continue
            assert fetched is not None
            wanted, first, next_token, may_more = fetched
            if not wanted:
                caught_up = next_token == token or not may_more
                out[ch] = ChannelLag(ch, 0, 0.0) if caught_up else ChannelLag(ch, None, None)
                continue
            oldest = decode_page(wanted[:1], ch, token, first)[0].commit_ts_us
            out[ch] = ChannelLag(ch, None if may_more else len(wanted),
                                 max(0.0, (now_us - oldest) / 1e6))
        return out

    def _probe(self, tunnel_id: str, channel_id: str, token: str) -> bool:
        """Does a one-record read from ``token`` find a record or ``"finished"``?"""
        try:
            result = self.read_records(tunnel_id, channel_id, token, 1)
        except TrimmedDataError:
            return True
        if result.records or result.next_token == FINISHED:
            self._has_data[(tunnel_id, channel_id)] = token
            return True
        return False

    def _fetch(self, tunnel_id: str, channel_id: str, token: str, limit: int,
               ahead: bool = False) -> tuple[Sequence[Any], int | None, str, bool] | None:
        """The wire records of up to ``limit`` records after ``token``, with the base offset
        of the first (``None`` if unknown), the token after them and ``may_more``; ``None``
        for ``limit == 0`` (nothing to ask the service). Shared by both read methods;
        ``ahead`` (``read_page``): with prefetch (module docstring)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        page_token, skip = self._check_token(channel_id, token)
        if limit == 0 and token != FINISHED:
            return None
        response = self._read_page(tunnel_id, channel_id, page_token, skip + limit, token,
                                   ahead and not skip)
        while skip and len(response.records) <= skip:
            # the service paged differently than when the token was made: skip whole pages
            if response.next_token == FINISHED or not response.records:
                raise MalformedTokenError(
                    channel_id=channel_id, token=token,
                    reason=f"it skips {skip} record(s) but only {len(response.records)} "
                    "follow its page token")
            skip -= len(response.records)
            page_token = response.next_token
            response = self._read_page(tunnel_id, channel_id, page_token, skip + limit, token)
        base_offset = self._base_offset(page_token)
        wanted = response.records[skip:skip + limit]
        first = None if base_offset is None else base_offset + skip
        if skip + limit < len(response.records):
            return wanted, first, f"{page_token}{SKIP_MARK}{skip + limit}", True
        may_more = (response.may_more_record if response.HasField("may_more_record")
                    else len(response.records) >= 500)
        may_more = bool(may_more) and response.next_token != FINISHED
        if ahead and may_more:
            self._send_ahead(tunnel_id, channel_id, response.next_token, limit)
        return wanted, first, response.next_token, may_more

    def read_records(self, tunnel_id: str, channel_id: str, token: str, limit: int) -> ReadResult:
        """Up to ``limit`` records after ``token`` as ``Record`` objects (the contract suite,
        ``has_new_data``, tools); see the module docstring for tokens that point inside a
        service page."""
        fetched = self._fetch(tunnel_id, channel_id, token, limit)
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
        fetched = self._fetch(tunnel_id, channel_id, token, limit, ahead=self.prefetch)
        if fetched is None:
            return Page(empty_page_batch(layout), token, True)
        wanted, first, next_token, may_more = fetched
        return Page(decode_columns(wanted, channel_id, token, first, layout), next_token,
                    may_more)


__all__ = ["CLIENT_ID", "TablestoreTunnelService", "split_token", "token_content"]
