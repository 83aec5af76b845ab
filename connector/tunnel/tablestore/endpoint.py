"""A Tablestore endpoint (``http://``, ``https://``): its options, what it carries, its meta table.

Three things only the Tablestore backend knows, looked up through the backend registry
(``connector.tunnel.TUNNEL_BACKENDS.rules``) on the driver:

- **the endpoint's options** (``TablestoreEndpointRules.configure``): the instance (the option
  ``instance.name``, else ``?instance=``, else the service host's first label), the AccessKey
  pair and STS token (the options, else the driver's ``ALIBABA_CLOUD_*``), the CA bundle that
  verifies an https endpoint (``ssl.ca.bundle``, else ``REQUESTS_CA_BUNDLE`` / ``SSL_CERT_FILE``)
  and ``read.prefetch``, checked and folded into one ``TablestoreEndpoint``. Its secrets are
  ``SecretStr`` fields: never in a URI, a ``repr``, a log line or an error. No request is made;
- **the default meta table** (``tablestore_meta_store``): ``tablestore://INSTANCE/TABLE?
  endpoint=...`` in the same instance, ``checkpoint.table`` or ``tablestore_cdc_meta``, which
  the query creates when missing; ``tablestore-cdc meta uri`` prints the same;
- **``tunnel.id``** (``resolve_tunnel_name``): the tunnel it names, looked up with one
  ListTunnel when the query binds (``connector.planning.binding``), never during validation.

``parse_endpoint_uri`` reads the URI form a client may also be opened with
(``http(s)://HOST?instance=...&access_key_id=...``: tools, tests; ``EndpointQuery`` validates its
query). The client (``client.py``) opens from a ``TablestoreEndpoint`` either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from pydantic import Field, SecretStr

from cdc_common.credentials import (
    ALIBABA_ACCESS_KEY_ID,
    ALIBABA_ACCESS_KEY_SECRET,
    ALIBABA_SECURITY_TOKEN,
    alibaba_credentials,
)
from cdc_common.tls import ca_bundle, ca_bundle_origin, ca_bundle_problem
from cdc_common.uris import UriQuery, parse_query, redact_uri, tablestore_instance
from connector.errors import OptionError
from connector.tunnel.endpoint import EndpointRules, TunnelEndpoint

#: the meta table of a Tablestore endpoint when neither meta.store nor checkpoint.table is given
#: (not the vendor's ``__spark_meta_checkpoint__``: its rows have another layout)
DEFAULT_CHECKPOINT_TABLE = "tablestore_cdc_meta"
#: the URI form, for errors about a URI
URI_FORM = "https://INSTANCE.REGION.ots.aliyuncs.com (or http://127.0.0.1:PORT?instance=NAME)"
#: the source options of each credential field
_CREDENTIAL_OPTIONS = {"access_key_id": ("access.key.id", ALIBABA_ACCESS_KEY_ID),
                       "access_key_secret": ("access.key.secret", ALIBABA_ACCESS_KEY_SECRET)}


class TablestoreEndpoint(TunnelEndpoint):
    """One Tablestore instance at one endpoint, with the credentials to call it. Built on the
    driver from the options; pickled into partitions; opened by ``TablestoreTunnelService
    .from_endpoint`` on the driver and on executors."""

    #: ``http(s)://HOST[:PORT]``
    origin: str
    instance: str
    access_key_id: SecretStr
    access_key_secret: SecretStr
    security_token: SecretStr | None = None
    #: the CA bundle verifying an https endpoint (a path, no secret); None: the system's
    ca_bundle: str | None = None
    #: executors send a channel's next ReadRecords request ahead (``prefetch.py``)
    prefetch: bool = True
    #: the transport's retry deadline (seconds; None: its default)
    retry_deadline_s: float | None = None

    @property
    def uri(self) -> str:
        """``http(s)://HOST[:PORT]?instance=NAME`` with ``ca_bundle`` and ``prefetch=false``
        when set: never a credential (``redact_uri`` of it is the source's ``safe_endpoint``)."""
        params = {"instance": self.instance}
        if self.ca_bundle:
            params["ca_bundle"] = self.ca_bundle
        if not self.prefetch:
            params["prefetch"] = "false"
        return f"{self.origin}?{urlencode(params)}"

    def secret_values(self) -> tuple[str, ...]:
        token = self.security_token.get_secret_value() if self.security_token else ""
        return (self.access_key_id.get_secret_value(),
                self.access_key_secret.get_secret_value(), token)

    def credentials(self) -> dict[str, str]:
        """The credentials as ``open_meta_store`` takes them (a ``tablestore://`` meta store in
        the same account)."""
        creds = {"access_key_id": self.access_key_id.get_secret_value(),
                 "access_key_secret": self.access_key_secret.get_secret_value()}
        if self.security_token is not None:
            creds["security_token"] = self.security_token.get_secret_value()
        return creds


# --- the URI form ------------------------------------------------------------------------------


class EndpointQuery(UriQuery):
    """The query of an ``http(s)://`` endpoint URI (``parse_endpoint_uri``)."""

    credentials_hint: ClassVar[str] = (
        f"use the access.key.id / access.key.secret / security.token options or "
        f"{ALIBABA_ACCESS_KEY_ID} / {ALIBABA_ACCESS_KEY_SECRET} / {ALIBABA_SECURITY_TOKEN}")

    instance: str | None = Field(None, description="the instance name")
    access_key_id: str | None = Field(None, repr=False)
    access_key_secret: str | None = Field(None, repr=False)
    security_token: str | None = Field(None, repr=False)
    retry_deadline_s: float | None = Field(None, description="a number of seconds")
    ca_bundle: str | None = Field(None, description="the path of a PEM file of CA certificates")
    prefetch: bool = Field(True, description="true or false: read the next page ahead")


def shown_uri(uri: str) -> str:
    """``uri`` as a client of it reports it (``redact_uri`` knowing this backend's keys)."""
    return redact_uri(uri, EndpointQuery.model_fields)


def parse_endpoint_uri(uri: str) -> TablestoreEndpoint:
    """``http(s)://HOST[:PORT]?instance=...&access_key_id=...`` as an endpoint (driver or
    executor; credentials missing from the URI come from this process's ``ALIBABA_CLOUD_*``).
    ``OptionError`` naming ``endpoint`` (the URI without its secrets) or ``ssl.ca.bundle``."""
    parts = urlsplit(uri)

    def bad(problem: str) -> OptionError:
        return OptionError(option="endpoint", value=shown_uri(uri), problem=problem,
                           allowed=URI_FORM)

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
    return TablestoreEndpoint(
        origin=f"{parts.scheme}://{parts.netloc}", instance=instance,
        access_key_id=SecretStr(creds.access_key_id),
        access_key_secret=SecretStr(creds.access_key_secret),
        security_token=SecretStr(creds.security_token) if creds.security_token else None,
        ca_bundle=bundle, prefetch=query.prefetch, retry_deadline_s=query.retry_deadline_s)


# --- the source's options ---------------------------------------------------------------------


class TablestoreEndpointRules(EndpointRules):
    """The options of a Tablestore endpoint (module docstring)."""

    option_fields = frozenset({"instance_name", "tunnel_id", "access_key_id",
                               "access_key_secret", "security_token", "checkpoint_table",
                               "ssl_ca_bundle", "read_prefetch"})

    def configure(self, values: Mapping[str, Any],
                  allowed: Callable[[str], str] = lambda option: "") -> dict[str, Any]:
        """Fold the instance, credentials, CA bundle and ``read.prefetch`` into a
        ``TablestoreEndpoint``; default ``meta.store`` to the instance's meta table (and give
        a ``tablestore://`` meta store over https the same CA bundle). ``allowed(option)``:
        the option table's text for an error."""
        values = dict(values)
        endpoint = str(values["endpoint"])
        parts = urlsplit(endpoint)
        try:
            parts.port  # noqa: B018 - ValueError for a port that is not 0..65535
        except ValueError as exc:
            raise OptionError(option="endpoint", value=redact_uri(endpoint), problem=str(exc),
                              allowed=allowed("endpoint")) from None
        if not parts.hostname:
            raise OptionError(option="endpoint", value=redact_uri(endpoint),
                              problem="names no host (expected http(s)://HOST[:PORT])",
                              allowed=allowed("endpoint"))
        if parts.username or parts.password:
            raise OptionError(option="endpoint", value=redact_uri(endpoint),
                              problem="credentials do not belong in the endpoint",
                              allowed="access.key.id / access.key.secret options or "
                              f"{ALIBABA_ACCESS_KEY_ID} / {ALIBABA_ACCESS_KEY_SECRET}")
        if parts.path not in ("", "/"):
            raise OptionError(option="endpoint", value=redact_uri(endpoint),
                              problem="a Tablestore endpoint has no path",
                              allowed="https://INSTANCE.REGION.ots.aliyuncs.com")
        query = dict(parse_qsl(parts.query))
        instance = tablestore_instance(endpoint, values.get("instance_name"))
        if not instance:
            raise OptionError(option="instance.name", value=None,
                              problem="is required for this endpoint (its host does not name "
                              "the instance)", allowed=allowed("instance.name"))
        creds = alibaba_credentials(*(values.get(field) or query.get(field) for field in
                                      ("access_key_id", "access_key_secret", "security_token")))
        for field, (option, env) in _CREDENTIAL_OPTIONS.items():
            if not getattr(creds, field):
                raise OptionError(option=option, value=None,
                                  problem=f"is required for a Tablestore endpoint (or set {env})",
                                  allowed=allowed(option))
        assert creds.access_key_id and creds.access_key_secret
        bundle = _ca_bundle(parts.scheme, values.get("ssl_ca_bundle") or query.get("ca_bundle"),
                            allowed)
        prefetch = values.get("read_prefetch", query.get("prefetch"))
        values["endpoint"] = TablestoreEndpoint(
            origin=f"{parts.scheme}://{parts.netloc}", instance=instance,
            access_key_id=SecretStr(creds.access_key_id),
            access_key_secret=SecretStr(creds.access_key_secret),
            security_token=SecretStr(creds.security_token) if creds.security_token else None,
            ca_bundle=bundle, prefetch=_prefetch(prefetch, allowed))
        values["instance_name"] = instance
        values["ssl_ca_bundle"] = bundle
        with_ca = f"&ca_bundle={quote(bundle, safe='')}" if bundle else ""
        if "meta_store" not in values:
            values["meta_store"] = tablestore_meta_store(
                f"{parts.scheme}://{parts.netloc}", instance, values.get("checkpoint_table"),
                create_table=True) + with_ca
        else:
            meta = urlsplit(str(values["meta_store"]))
            meta_query = dict(parse_qsl(meta.query))
            if (meta.scheme == "tablestore" and bundle and "ca_bundle" not in meta_query
                    and meta_query.get("endpoint", "").startswith("https://")):
                values["meta_store"] = f"{values['meta_store']}{'&' if meta.query else '?'}" + \
                    with_ca.lstrip("&")  # the same CA verifies a meta table over https
        return values

    def resolve_tunnel_name(self, tunnel: Any, table: str, tunnel_id: str,
                            name: str | None) -> str:
        """The name of the tunnel ``tunnel_id`` on ``table`` (one ListTunnel through
        ``tunnel``, a ``TunnelAdministration``): ``OptionError`` if the table has no such
        tunnel, or if ``name`` (``tunnel.name``) is given and differs."""
        tunnels = tunnel.list_tunnels(table)
        for t in tunnels:
            if t.tunnel_id == tunnel_id:
                if name is not None and t.tunnel_name != name:
                    raise OptionError(option="tunnel.id", value=tunnel_id,
                                      problem=f"names tunnel {t.tunnel_name!r}, not tunnel.name "
                                      f"{name!r}", allowed="matching names")
                return str(t.tunnel_name)
        raise OptionError(option="tunnel.id", value=tunnel_id,
                          problem=f"no tunnel with this id on table {table!r}",
                          allowed=", ".join(f"{t.tunnel_id} ({t.tunnel_name})" for t in tunnels)
                          or "create the tunnel first, or use tunnel.name")


def _prefetch(given: Any, allowed: Callable[[str], str]) -> bool:
    if given is None or isinstance(given, bool):
        return given is not False
    from connector.option_values import parse_bool

    try:
        return parse_bool(given)
    except ValueError:
        raise OptionError(option="read.prefetch", value=given, problem="is not a boolean",
                          allowed=allowed("read.prefetch")) from None


def _ca_bundle(scheme: str, given: str | None, allowed: Callable[[str], str]) -> str | None:
    """The CA bundle of an https endpoint: ``given``, else this process's REQUESTS_CA_BUNDLE /
    SSL_CERT_FILE, checked here so a bad one fails before the query starts (``OptionError``
    naming ``ssl.ca.bundle``); ``None`` for the system's trust store."""
    if scheme != "https":
        if given:
            raise OptionError(option="ssl.ca.bundle", value=given,
                              problem="applies to an https endpoint only",
                              allowed="leave it out for http://, or use the https endpoint")
        return None
    bundle, origin = ca_bundle_origin(given)
    problem = ca_bundle_problem(bundle) if bundle else None
    if problem:
        source = "" if origin == "given" else f" (from {origin})"
        raise OptionError(option="ssl.ca.bundle", value=bundle, problem=problem + source,
                          allowed=allowed("ssl.ca.bundle"))
    return bundle


def tablestore_meta_store(endpoint: str, instance: str, checkpoint_table: str | None = None,
                          *, create_table: bool = False) -> str:
    """The meta table a query on the Tablestore ``endpoint`` (``http(s)://HOST[:PORT]``) uses
    when ``meta.store`` is not given: ``tablestore://INSTANCE/TABLE?endpoint=...`` in the same
    instance, ``checkpoint.table`` or ``tablestore_cdc_meta``; the query creates it when
    missing (``create_table``). Also what ``tablestore-cdc meta uri`` prints for the CLI and
    the dashboard (without ``create_table``: inspection never creates)."""
    table = checkpoint_table or DEFAULT_CHECKPOINT_TABLE
    uri = f"tablestore://{instance}/{table}?endpoint={quote(endpoint.rstrip('/'), safe='')}"
    return uri + ("&create_table=true" if create_table else "")


RULES = TablestoreEndpointRules()

__all__ = ["DEFAULT_CHECKPOINT_TABLE", "EndpointQuery", "RULES", "TablestoreEndpoint",
           "TablestoreEndpointRules", "parse_endpoint_uri", "shown_uri", "tablestore_meta_store"]
