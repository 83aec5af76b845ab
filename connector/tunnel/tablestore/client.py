"""``TablestoreTunnelService``: the tunnel backend for ``http://`` and ``https://`` endpoints.

Speaks the Tablestore Tunnel service's wire protocol (``/tunnel/*`` protobuf RPCs, v2 signing,
PlainBuffer records) to a real instance or to the project's emulator
(``tablestore-cdc emulator``). Opened from the typed endpoint of the source's options
(``from_endpoint``: ``endpoint.TablestoreEndpoint``, its credentials ``SecretStr``), or from a
URI (``from_uri``)::

    https://INSTANCE.REGION.ots.aliyuncs.com?instance=INSTANCE
        &access_key_id=...&access_key_secret=...&security_token=...

(``endpoint.parse_endpoint_uri``: the instance defaults to the host's first label; credentials
missing from the URI come from ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``_SECRET`` /
``ALIBABA_CLOUD_SECURITY_TOKEN``; ``ca_bundle`` is the CA bundle that verifies an https
endpoint, else ``REQUESTS_CA_BUNDLE`` / ``SSL_CERT_FILE``, else the system's). The endpoint with
secrets removed (``cdc_common.uris.redact_uri``, the source's ``safe_endpoint``) is this client's
``uri``: the only form that reaches logs, errors and anything stored.

The client is the three roles of ``connector.tunnel.base``, each in its own module over one
transport (``transport``, ``http``) and one error mapping (``calls``):

- ``admin``: tunnels and the table's schema; "not there" confirmed before it is believed;
- ``positions``: checkpoints (the SDKs' sequence numbers) and where channels stand
  (``channel_probes``);
- ``reading``: ReadRecords into columnar pages, the next page read ahead (``prefetch``).

Who calls what: the driver calls tunnel, checkpoint and schema methods; executors call
``read_page`` on a client opened in their own process (``connector.clients``). One client per
process and endpoint; safe to call from several threads (the driver's concurrent pushes and
probes). Errors: the service's refusals become the product's types as ``refusals`` says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

from cdc_common.uris import tablestore_instance
from connector.tunnel.base import TunnelService
from connector.tunnel.tablestore.calls import CLIENT_ID
from connector.tunnel.tablestore.channel_probes import ChannelProbes
from connector.tunnel.tablestore.endpoint import (
    EndpointQuery,
    TablestoreEndpoint,
    parse_endpoint_uri,
    shown_uri,
)
from connector.tunnel.tablestore.positions import DRIVER_CONCURRENCY, TablestorePositions
from connector.tunnel.tablestore.prefetch import PREFETCH_HELD, PrefetchedReads
from connector.tunnel.tablestore.reading import TablestoreReading
from connector.tunnel.tablestore.tokens import split_token, token_content
from connector.tunnel.tablestore.transport import RETRY_DEADLINE_S, Credentials, Transport


class TablestoreTunnelService(TablestorePositions, TablestoreReading, TunnelService):
    """A Tunnel client for one endpoint and instance (module docstring)."""

    def __init__(self, endpoint: str, instance: str, credentials: Credentials, *,
                 uri: str | None = None, retry_deadline_s: float = RETRY_DEADLINE_S,
                 send_max_records: bool = True, ca_bundle: str | None = None,
                 prefetch: bool = True, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``clock`` and ``sleep`` time the transport's retries (tests pass a fake clock)."""
        self.endpoint = endpoint.rstrip("/")
        self.instance = instance
        self.uri = shown_uri(uri) if uri else f"{self.endpoint}?instance={instance}"
        self._transport = Transport(self.endpoint, instance, credentials, retry_deadline_s,
                                    ca_bundle=ca_bundle, clock=clock, sleep=sleep,
                                    pool_size=max(PREFETCH_HELD, DRIVER_CONCURRENCY) + 1)
        self._tunnels = {}
        self._stored = {}
        self.send_max_records = send_max_records
        self.prefetch = prefetch
        self._prefetches = PrefetchedReads()
        self._probes = ChannelProbes(self, self.concurrent_calls)

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def service_of(cls, uri: str) -> str:
        """The instance: its public, VPC and any other endpoint (``localhost`` or
        ``127.0.0.1`` for the emulator) reach the same instance, its tables and tunnels. From
        ``?instance=`` (the source's endpoint carries ``instance.name`` there), else the host's
        first label (``INSTANCE.REGION.ots.aliyuncs.com``)."""
        return tablestore_instance(uri) or str(urlsplit(uri).hostname)

    @classmethod
    def from_uri(cls, uri: str) -> TablestoreTunnelService:
        """Open ``http(s)://HOST[:PORT]?instance=...&access_key_id=...`` (driver or executor).
        Errors name the URI without its secrets."""
        return cls.from_endpoint(parse_endpoint_uri(uri), uri=uri)

    @classmethod
    def from_endpoint(cls, endpoint: TablestoreEndpoint,  # type: ignore[override]
                      uri: str | None = None) -> TablestoreTunnelService:
        """Open the typed endpoint of the source's options (driver or executor)."""
        token = endpoint.security_token
        return cls(endpoint.origin, endpoint.instance,
                   Credentials(endpoint.access_key_id.get_secret_value(),
                               endpoint.access_key_secret.get_secret_value(),
                               token.get_secret_value() if token is not None else None),
                   uri=uri or endpoint.uri,
                   retry_deadline_s=(RETRY_DEADLINE_S if endpoint.retry_deadline_s is None
                                     else endpoint.retry_deadline_s),
                   ca_bundle=endpoint.ca_bundle, prefetch=endpoint.prefetch)

    def close(self) -> None:
        self._probes.close()
        self._prefetches.close()
        self._transport.close()

    def __repr__(self) -> str:
        return f"<TablestoreTunnelService {self.uri}>"


__all__ = ["CLIENT_ID", "DRIVER_CONCURRENCY", "EndpointQuery", "TablestoreTunnelService",
           "split_token", "token_content"]
