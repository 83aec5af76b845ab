"""The typed endpoint a query's options carry, and each backend's rules for its options.

``SourceOptions`` (``connector.options``) validates the ``endpoint`` option into a
``TunnelEndpoint``: frozen, picklable (it travels inside input partitions to executors, which
open their own clients from it), with every secret in a pydantic ``SecretStr`` field that no
``repr``, ``str``, log line or error shows. ``uri`` is the endpoint without secrets: what the
source identity, the namespace and every shown form are built from. A backend with options of
its own subclasses it (``connector.tunnel.tablestore.endpoint.TablestoreEndpoint``); a URI that
says everything and holds no secret is a ``UriEndpoint``.

What an endpoint of each scheme takes is its backend's knowledge: ``EndpointRules`` are looked
up by scheme through the backend registry (``connector.tunnel.TUNNEL_BACKENDS.rules``), imported
lazily like the backend class, so ``connector.options`` holds only the rules every endpoint
shares. Called on the driver (option validation, binding); makes no request.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from cdc_common.uris import redact_uri
from connector.errors import OptionError


class TunnelEndpoint(BaseModel):
    """A validated endpoint (driver: options; executors: what partitions carry)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @property
    def uri(self) -> str:
        """The endpoint as a URI without secrets (what clients report as their ``uri`` once
        redacted, what the identity is built from)."""
        raise NotImplementedError

    @property
    def scheme(self) -> str:
        return urlsplit(self.uri).scheme

    def secret_values(self) -> tuple[str, ...]:
        """The secrets this endpoint opens clients with (none here). The executors' client pool
        keys clients by a per-process keyed digest of them (``connector.clients``), never by
        the values."""
        return ()

    def credentials(self) -> dict[str, str] | None:
        """The credentials a ``tablestore://`` meta store opens with when the query's meta
        table is in the endpoint's own account (``SourceOptions.meta_store_credentials``);
        ``None`` here."""
        return None

    def __str__(self) -> str:
        return self.uri


class UriEndpoint(TunnelEndpoint):
    """An endpoint whose URI says everything and holds no secret (``local://``,
    ``dynamodb-streams://``: their credentials come from the environment)."""

    address: str

    @property
    def uri(self) -> str:
        return self.address


class EndpointRules:
    """What an endpoint of one backend takes, at option validation (driver). This base is the
    rule of a backend with no options of its own: the URI as given."""

    #: the ``SourceOptions`` fields only this backend's endpoints take (``connector.options``
    #: refuses them for an endpoint of another backend)
    option_fields: frozenset[str] = frozenset()

    def configure(self, values: Mapping[str, Any],
                  allowed: Callable[[str], str] = lambda option: "") -> dict[str, Any]:
        """``values`` (``SourceOptions`` fields from Spark's options, ``endpoint`` a string)
        with ``endpoint`` made a ``TunnelEndpoint`` and what this backend derives from it
        (a default ``meta_store``). Raises ``OptionError`` (``allowed(option)``: the option
        table's text for it); makes no request."""
        return {**values, "endpoint": UriEndpoint(address=str(values["endpoint"]))}

    def resolve_tunnel_name(self, tunnel: Any, table: str, tunnel_id: str,
                            name: str | None) -> str:
        """The name of the tunnel ``tunnel_id`` names (driver, when the query binds): only a
        backend whose ``option_fields`` hold ``tunnel_id`` is asked."""
        raise OptionError(option="tunnel.id", value=tunnel_id, problem="is not taken by this "
                          "endpoint", allowed="tunnel.name")


class LocalEndpointRules(EndpointRules):
    """``local:///abs/path/store.db``: an absolute path, and a SQLite meta store beside the store
    file when ``meta.store`` is not given."""

    def configure(self, values: Mapping[str, Any],
                  allowed: Callable[[str], str] = lambda option: "") -> dict[str, Any]:
        endpoint = str(values["endpoint"])
        parts = urlsplit(endpoint)
        if parts.netloc or not parts.path.startswith("/"):
            raise OptionError(option="endpoint", value=redact_uri(endpoint),
                              problem="a local endpoint needs an absolute path: "
                              "local:///abs/path/store.db", allowed=allowed("endpoint"))
        configured = super().configure(values, allowed)
        if "meta_store" not in configured:
            configured["meta_store"] = default_local_meta_store(endpoint)
        return configured


def default_local_meta_store(endpoint: str) -> str | None:
    """For a local endpoint, the SQLite meta store beside the store file; else none (the
    source's default, and ``tablestore-cdc meta uri``'s)."""
    parts = urlsplit(endpoint)
    if parts.scheme == "local" and not parts.netloc and parts.path.startswith("/"):
        base, _ = os.path.splitext(parts.path)
        return f"sqlite://{base}.meta.db"
    return None


#: the rules of a backend that names none in the registry
PLAIN_RULES = EndpointRules()
LOCAL_RULES = LocalEndpointRules()

__all__ = ["EndpointRules", "LOCAL_RULES", "PLAIN_RULES", "TunnelEndpoint", "UriEndpoint",
           "default_local_meta_store"]
