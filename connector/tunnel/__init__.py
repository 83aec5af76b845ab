"""Tunnel-service backends, chosen by URI scheme.

``open_tunnel_service("local:///abs/path/store.db")`` (or a ``TunnelEndpoint`` from the source's
options) returns a ``TunnelService``. Backends are imported lazily (``cdc_common.registry``), so
an SDK a backend needs is only required when that scheme is used; a missing one is refused with
the ``pip install`` line that brings it. ``endpoint_rules(uri)``: what an endpoint of that
scheme takes as options (``connector.tunnel.endpoint``), from the backend's own package. The
source opens its clients through ``connector.clients`` (retries, the executors' pool).
"""

from __future__ import annotations

from cdc_common.registry import Backend, BackendRegistry
from connector.errors import OptionError
from connector.tunnel import base
from connector.tunnel.base import *  # noqa: F403 - the interface and its plain data, re-exported
from connector.tunnel.base import TunnelService
from connector.tunnel.endpoint import PLAIN_RULES, EndpointRules, TunnelEndpoint

_TABLESTORE_TARGET = "connector.tunnel.tablestore.client:TablestoreTunnelService"
_TABLESTORE_RULES = "connector.tunnel.tablestore.endpoint:RULES"
#: the Tunnel wire client needs protobuf and httptools (the extra brings both)
_TABLESTORE_INSTALL = "pip install 'tablestore-cdc[tablestore]'"
#: scheme -> the tunnel backend class and how to install what it needs (the order of the
#: schemes is the order an endpoint error lists them in)
TUNNEL_BACKENDS = BackendRegistry(
    {
        "local": Backend("connector.tunnel.local:LocalTunnelService",
                         form="local:///abs/path/store.db",
                         rules="connector.tunnel.endpoint:LOCAL_RULES"),
        "http": Backend(_TABLESTORE_TARGET, _TABLESTORE_INSTALL,
                        form="http://HOST:PORT (a Tablestore emulator)", rules=_TABLESTORE_RULES),
        "https": Backend(_TABLESTORE_TARGET, _TABLESTORE_INSTALL,
                         form="https://INSTANCE.REGION.ots.aliyuncs.com (Tablestore)",
                         rules=_TABLESTORE_RULES),
        "dynamodb-streams": Backend(
            "connector.tunnel.dynamodb_streams.service:DynamoDbStreamsTunnelService",
            "pip install 'tablestore-cdc[dynamodb]'",
            form="dynamodb-streams://[TABLE]?checkpoint_table=NAME&region=..."),
    },
    refuse=lambda uri, problem, allowed: OptionError(option="endpoint", value=uri,
                                                     problem=problem, allowed=allowed),
)


def open_tunnel_service(endpoint: str | TunnelEndpoint) -> TunnelService:
    """Open a client for the tunnel service at ``endpoint`` (a URI, or the typed endpoint of the
    source's options; driver or executor). An unknown scheme or a backend whose SDK is missing
    raises ``OptionError`` naming ``endpoint``."""
    if isinstance(endpoint, TunnelEndpoint):
        return TUNNEL_BACKENDS.load(endpoint.uri).from_endpoint(endpoint)
    return TUNNEL_BACKENDS.load(endpoint).from_uri(endpoint)


def endpoint_rules(uri: str) -> EndpointRules:
    """What an endpoint of ``uri``'s scheme takes as options (driver, option validation and
    binding): its backend's rules, imported now; ``OptionError`` as ``open_tunnel_service``."""
    rules: EndpointRules | None = TUNNEL_BACKENDS.rules(uri)
    return rules if rules is not None else PLAIN_RULES


__all__ = [*base.__all__, "TUNNEL_BACKENDS", "TunnelEndpoint", "endpoint_rules",
           "open_tunnel_service"]
