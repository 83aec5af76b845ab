"""Reader options: validated once, on the driver, into one frozen object.

Spark hands a data source its options as strings with **lower-cased** keys (a case-insensitive
map). ``SourceOptions.from_spark(options)`` matches them case-insensitively against the
canonical names below (shared with the vendor's Spark connector where they overlap), converts the
values, and raises ``OptionError`` naming the option, the value and what is allowed. Unknown
options are rejected with a did-you-mean; nothing falls back silently to a default.

Called by ``TablestoreDataSource.__init__`` (driver processes); the resulting object is pickled
into the stream reader and input partitions.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cdc_common.credentials import (
    ALIBABA_ACCESS_KEY_ID,
    ALIBABA_ACCESS_KEY_SECRET,
    ALIBABA_SECURITY_TOKEN,
    alibaba_credentials,
)
from cdc_common.uris import TABLESTORE_INSTANCE, redact_uri, shown_value
from connector.errors import OptionError
from connector.tunnel.base import ColumnSpec, StartPosition, TableSchema, TunnelType

#: canonical option name -> (model field, what is allowed; shown in errors and docs)
OPTIONS: dict[str, tuple[str, str]] = {
    "endpoint": ("endpoint", "a tunnel-service URI, e.g. local:///abs/path/store.db"),
    "table.name": ("table_name", "the source table's name (no surrounding whitespace)"),
    "tunnel.name": ("tunnel_name", "a tunnel name, created if missing (no surrounding "
                    "whitespace)"),
    "tunnel.type": ("tunnel_type", "Stream or BaseAndStream"),
    "startingPosition": ("starting_position", "earliest or latest"),
    "meta.store": ("meta_store", "a meta-store URI: sqlite:///abs/path.db or dynamodb://TABLE?..."),
    "maxOffsetsPerChannel": ("max_offsets_per_channel", "an integer >= 1 and <= 2147483647"),
    "maxOffsetsPerTrigger": ("max_offsets_per_trigger",
                             "an integer >= 1 and <= 9223372036854775807 (a Java long)"),
    "commitInterval": ("commit_interval", "an integer >= 1 and <= 2147483647"),
    "channelRefreshIntervalMs": ("channel_refresh_interval_ms",
                                 "an integer >= 0 and <= 2147483647"),
    "metaRetentionBatches": ("meta_retention_batches", "an integer >= 1 and <= 2147483647"),
    "failOnDataLoss": ("fail_on_data_loss", "true or false"),
    "skipEmptyBatches": ("skip_empty_batches", "true or false"),
    # the vendor's connector's names for a Tablestore endpoint (docs/tablestore.md)
    "instance.name": ("instance_name", "the Tablestore instance (default: the endpoint host's "
                      "first label)"),
    "tunnel.id": ("tunnel_id", "the id of an existing tunnel on the table (instead of, or "
                  "checked against, tunnel.name)"),
    "access.key.id": ("access_key_id", f"an AccessKey id (else {ALIBABA_ACCESS_KEY_ID})"),
    "access.key.secret": ("access_key_secret",
                          f"an AccessKey secret (else {ALIBABA_ACCESS_KEY_SECRET})"),
    "security.token": ("security_token", f"an STS token (else {ALIBABA_SECURITY_TOKEN})"),
    "catalog": ("catalog", 'JSON {"columns": {"name": {"type": "string|long|double|boolean|'
                'binary"}, ...}}'),
    "checkpoint.table": ("checkpoint_table", "a table name in the same instance for the meta "
                         "store (default tablestore_cdc_meta)"),
    "ssl.ca.bundle": ("ssl_ca_bundle", "the path of a PEM file of CA certificates that verifies "
                      "an https endpoint, on the driver and every executor (else "
                      "REQUESTS_CA_BUNDLE, then SSL_CERT_FILE, then the system's)"),
    "read.prefetch": ("read_prefetch", "true or false (default true: executors request a "
                      "channel's next page while the current one is decoded)"),
}
#: the meta table of a Tablestore endpoint when neither meta.store nor checkpoint.table is given
#: (not the vendor's ``__spark_meta_checkpoint__``: its rows have another layout)
DEFAULT_CHECKPOINT_TABLE = "tablestore_cdc_meta"
#: options that only mean something for a Tablestore (http/https) endpoint
_TABLESTORE_ONLY = ("instance_name", "tunnel_id", "access_key_id", "access_key_secret",
                    "security_token", "checkpoint_table", "ssl_ca_bundle", "read_prefetch")
#: the vendor catalog's type names -> Tablestore's
CATALOG_TYPES = {
    "string": "STRING", "long": "INTEGER", "int": "INTEGER", "integer": "INTEGER",
    "bigint": "INTEGER", "double": "DOUBLE", "float": "DOUBLE", "boolean": "BOOLEAN",
    "bool": "BOOLEAN", "binary": "BINARY",
}
_BY_LOWER = {name.lower(): name for name in OPTIONS}
#: upper bounds: what Spark's JVM side can hold (ReadMaxRows is a Java long)
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1
_FIELD_TO_OPTION = {field: name for name, (field, _) in OPTIONS.items()}


def _parse_bool(value: Any) -> Any:
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ValueError("not a boolean")
    return value


class SourceOptions(BaseModel):
    """The validated options of one ``readStream.format("tablestore")`` query."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: for a Tablestore endpoint this carries the instance and the credentials (query
    #: parameters dropped by ``safe_endpoint``): never log or store it, use ``safe_endpoint``
    endpoint: str = Field(repr=False)
    table_name: str = Field(min_length=1)
    tunnel_name: str = Field(min_length=1)
    tunnel_type: TunnelType = TunnelType.STREAM
    starting_position: StartPosition = StartPosition.EARLIEST
    meta_store: str
    max_offsets_per_channel: int = Field(default=10_000, ge=1, le=_INT_MAX)
    max_offsets_per_trigger: int | None = Field(default=None, ge=1, le=_LONG_MAX)
    commit_interval: int = Field(default=1, ge=1, le=_INT_MAX)
    channel_refresh_interval_ms: int = Field(default=1_000, ge=0, le=_INT_MAX)
    meta_retention_batches: int = Field(default=100, ge=1, le=_INT_MAX)
    fail_on_data_loss: bool = True
    skip_empty_batches: bool = True
    instance_name: str | None = Field(default=None, min_length=1)
    tunnel_id: str | None = Field(default=None, min_length=1)
    access_key_id: str | None = Field(default=None, repr=False)
    access_key_secret: str | None = Field(default=None, repr=False)
    security_token: str | None = Field(default=None, repr=False)
    #: the vendor's catalog, parsed: attribute columns as (name, Tablestore type)
    catalog: tuple[tuple[str, str], ...] | None = None
    checkpoint_table: str | None = Field(default=None, min_length=1)
    #: the CA bundle verifying an https endpoint (the option, else the driver's environment);
    #: folded into the endpoint and the meta-store URI as ``ca_bundle=`` (a path, no secret)
    ssl_ca_bundle: str | None = Field(default=None, min_length=1)
    #: executors' Tablestore clients send a channel's next ReadRecords request ahead; folded
    #: into the endpoint as ``prefetch=false`` when off (connector/tunnel/tablestore/client.py)
    read_prefetch: bool = True

    @field_validator("table_name", "tunnel_name")
    @classmethod
    def _name(cls, value: str) -> str:
        # a blank or padded name would make a distinct source identity (and tunnel) silently
        if not value.strip():
            raise ValueError("is blank")
        if value != value.strip():
            raise ValueError("has leading or trailing whitespace")
        return value

    @field_validator("instance_name")
    @classmethod
    def _instance(cls, value: str | None) -> str | None:
        if value is not None and not TABLESTORE_INSTANCE.match(value):
            raise ValueError("is not a Tablestore instance name (a letter, then letters, digits "
                             "or -)")
        return value

    @field_validator("tunnel_type", mode="before")
    @classmethod
    def _tunnel_type(cls, value: Any) -> Any:
        if isinstance(value, str):
            for member in TunnelType:
                if member.value.lower() == value.strip().lower():
                    return member
        return value

    @field_validator("starting_position", mode="before")
    @classmethod
    def _starting_position(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("catalog", mode="before")
    @classmethod
    def _catalog(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        return parse_catalog(value)

    @field_validator("fail_on_data_loss", "skip_empty_batches", "read_prefetch", mode="before")
    @classmethod
    def _bools(cls, value: Any) -> Any:
        return _parse_bool(value)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        if not parts.scheme:
            raise ValueError("not a URI (expected scheme://...)")
        if parts.scheme == "local" and (parts.netloc or not parts.path.startswith("/")):
            raise ValueError("a local endpoint needs an absolute path: local:///abs/path/store.db")
        return value

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # ``endpoint`` stays out (repr=False); ``meta.store`` is shown redacted, as a URI with
        # a secret in it (refused when the store is opened) may be logged before that
        for name, value in super().__repr_args__():
            yield name, redact_uri(value) if name == "meta_store" else value

    # --- construction -------------------------------------------------------------------

    @classmethod
    def from_spark(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate Spark's option map (any key case). Raises ``OptionError``."""
        values: dict[str, Any] = {}
        for key, value in options.items():
            canonical = _BY_LOWER.get(key.lower())
            if canonical is None:
                if key.lower() == "path":
                    raise OptionError(option="path", value=value, problem="load(path) is not "
                                      "supported", allowed="use .option('endpoint', ...)")
                close = difflib.get_close_matches(key.lower(), _BY_LOWER, n=1, cutoff=0.6)
                hint = f"did you mean '{_BY_LOWER[close[0]]}'?" if close else "no similar option"
                # a misspelt secret option (acess.key.secret) must not show its value either
                raise OptionError(option=key, value=shown_value(key, value),
                                  problem=f"unknown option; {hint}",
                                  allowed=", ".join(OPTIONS))
            values[OPTIONS[canonical][0]] = value
        for required in ("endpoint", "table.name", "tunnel.name"):
            if required == "tunnel.name" and values.get("tunnel_id"):
                continue  # resolved from the tunnel id below
            if OPTIONS[required][0] not in values:
                raise OptionError(option=required, value=None, problem="is required",
                                  allowed=OPTIONS[required][1])
        tablestore = urlsplit(str(values["endpoint"])).scheme in ("http", "https")
        if tablestore:
            values = _tablestore_endpoint(values)
        else:
            for field in _TABLESTORE_ONLY:
                if values.get(field) is not None:
                    option = _FIELD_TO_OPTION[field]
                    raise OptionError(option=option, value=_shown(field, values[field]),
                                      problem="applies to a Tablestore (http/https) endpoint "
                                      "only", allowed="leave it out")
        if "meta_store" not in values and (default := default_meta_store(values["endpoint"])):
            values["meta_store"] = default
        if tablestore and values.get("tunnel_id") and values.get("table_name"):
            values["tunnel_name"] = resolve_tunnel_id(
                values["endpoint"], str(values["table_name"]), str(values["tunnel_id"]),
                values.get("tunnel_name"))
        try:
            built = cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else "?"
            option = _FIELD_TO_OPTION.get(field, field)
            raise OptionError(option=option, value=_shown(field, values.get(field)),
                              problem=_problem(error["msg"]),
                              allowed=OPTIONS.get(option, ("", "see docs/options.md"))[1]) from None
        return built

    def declared_schema(self, table: TableSchema) -> TableSchema:
        """``table`` with the ``catalog``'s attribute columns (driver, ``schema()``): Tablestore
        declares only the key, so without a catalog (or ``.schema(...)``) attributes land in
        ``_extra``. Key columns named in the catalog keep the service's types."""
        if not self.catalog:
            return table
        keys = {c.name for c in table.primary_key}
        declared = {c.name: c for c in table.columns}
        for name, typ in self.catalog:
            if name not in keys:
                declared[name] = ColumnSpec(name, typ)
        return TableSchema(table.table_name, table.primary_key, tuple(declared.values()))

    # --- derived facts ----------------------------------------------------------------------

    @property
    def meta_store_credentials(self) -> dict[str, str] | None:
        """Credentials for a ``tablestore://`` meta store: those of a Tablestore endpoint (the
        options or the driver's ``ALIBABA_CLOUD_*``, folded into the endpoint). They travel to
        executors inside partitions, like the endpoint, and are never stored or shown."""
        if urlsplit(self.meta_store).scheme != "tablestore":
            return None
        query = dict(parse_qsl(urlsplit(self.endpoint).query))
        creds = {k: query[k] for k in ("access_key_id", "access_key_secret", "security_token")
                 if query.get(k)}
        return creds or None

    @property
    def safe_endpoint(self) -> str:
        """The endpoint as it may be shown and stored (``cdc_common.uris.redact_uri``: no user
        info, no secret query pair). Part of ``source_identity``, and stored in the namespace
        description: its form for an endpoint in use never changes (tests/test_uri_pins.py)."""
        return redact_uri(self.endpoint)

    @property
    def source_identity(self) -> str:
        """What a Spark checkpoint directory is bound to: endpoint + table + tunnel.

        Also the meta-store namespace, so it never contains secrets (nor the CA bundle's path,
        which says how to reach the service, not which one it is), and an existing meta table
        is found again only while its bytes stay the same (``safe_endpoint``)."""
        return f"{self.safe_endpoint}#{self.table_name}#{self.tunnel_name}"

    @property
    def source_digest(self) -> str:
        """Short stable fingerprint of ``source_identity`` carried in every offset."""
        return hashlib.sha256(self.source_identity.encode()).hexdigest()[:16]


def _problem(message: str) -> str:
    message = message.removeprefix("Value error, ")
    if message == "Field required":
        return "is required for this endpoint"
    return message


def default_meta_store(endpoint: str) -> str | None:
    """For a local endpoint, a SQLite meta store beside the store file; else none. (A
    Tablestore endpoint's default, a table in the same instance, is set by
    ``_tablestore_endpoint``.)"""
    parts = urlsplit(endpoint)
    if parts.scheme == "local" and not parts.netloc and parts.path.startswith("/"):
        base, _ = os.path.splitext(parts.path)
        return f"sqlite://{base}.meta.db"
    return None


def _shown(field: str, value: Any) -> Any:
    """An option value as an error may show it: secrets masked, endpoints redacted."""
    if field in ("endpoint", "meta_store") and isinstance(value, str):
        return redact_uri(value)
    if isinstance(value, str) and value:
        return shown_value(field, value)
    return value


def parse_catalog(text: str) -> tuple[tuple[str, str], ...]:
    """The vendor's ``catalog`` JSON -> ((column, Tablestore type), ...). ``ValueError`` with
    what is wrong (it becomes an ``OptionError`` naming ``catalog``)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    columns = doc.get("columns") if isinstance(doc, dict) else None
    if not isinstance(columns, dict) or not columns:
        raise ValueError('expected {"columns": {"name": {"type": ...}, ...}} with columns')
    out = []
    for name, spec in columns.items():
        typ = spec.get("type") if isinstance(spec, dict) else None
        if not isinstance(typ, str) or typ.strip().lower() not in CATALOG_TYPES:
            raise ValueError(f"column {name!r}: type {typ!r} is not one of "
                             + ", ".join(sorted(CATALOG_TYPES)))
        if not name or name.startswith("_"):
            raise ValueError(f"column {name!r}: names starting with '_' are the source's own")
        out.append((name, CATALOG_TYPES[typ.strip().lower()]))
    return tuple(out)


def _tablestore_endpoint(values: dict[str, Any]) -> dict[str, Any]:
    """Fold the instance and credentials into a Tablestore endpoint's query (driver).

    The endpoint travels to executors inside partitions (they open their own clients); every
    copy that is logged or stored goes through ``redact_uri``, which drops the credential
    parameters. Credentials not given as options come from the environment of the driver."""
    values = dict(values)
    endpoint = str(values["endpoint"])
    parts = urlsplit(endpoint)
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
    instance = values.get("instance_name") or query.get("instance")
    host = parts.hostname or ""
    if not instance and host.endswith(".aliyuncs.com") and host.count(".") >= 3:
        instance = host.split(".", 1)[0]
    if not instance:
        raise OptionError(option="instance.name", value=None,
                          problem="is required for this endpoint (its host does not name the "
                          "instance)", allowed=OPTIONS["instance.name"][1])
    given = alibaba_credentials(*(values.get(field) or query.get(field) for field in
                                  ("access_key_id", "access_key_secret", "security_token")))
    creds = asdict(given)
    for field, env in (("access_key_id", ALIBABA_ACCESS_KEY_ID),
                       ("access_key_secret", ALIBABA_ACCESS_KEY_SECRET)):
        if not creds[field]:
            raise OptionError(option=_FIELD_TO_OPTION[field], value=None,
                              problem=f"is required for a Tablestore endpoint (or set {env})",
                              allowed=OPTIONS[_FIELD_TO_OPTION[field]][1])
    bundle = _ca_bundle_option(parts.scheme, values.get("ssl_ca_bundle") or query.get("ca_bundle"))
    params = {"instance": instance}
    params.update({k: v for k, v in creds.items() if v})
    if bundle:
        params["ca_bundle"] = bundle
    prefetch = values.get("read_prefetch", query.get("prefetch"))
    if prefetch is not None:
        try:
            if not _parse_bool(prefetch):
                params["prefetch"] = "false"
        except ValueError:
            raise OptionError(option="read.prefetch", value=prefetch, problem="is not a boolean",
                              allowed=OPTIONS["read.prefetch"][1]) from None
    values["endpoint"] = f"{parts.scheme}://{parts.netloc}?{urlencode(params)}"
    values["instance_name"] = instance
    values["ssl_ca_bundle"] = bundle
    with_ca = f"&ca_bundle={quote(bundle, safe='')}" if bundle else ""
    if "meta_store" not in values:
        table = values.get("checkpoint_table") or DEFAULT_CHECKPOINT_TABLE
        target = quote(f"{parts.scheme}://{parts.netloc}", safe="")
        values["meta_store"] = (f"tablestore://{instance}/{table}?endpoint={target}"
                                f"&create_table=true{with_ca}")
    else:
        meta = urlsplit(str(values["meta_store"]))
        meta_query = dict(parse_qsl(meta.query))
        if (meta.scheme == "tablestore" and bundle and "ca_bundle" not in meta_query
                and meta_query.get("endpoint", "").startswith("https://")):
            values["meta_store"] = f"{values['meta_store']}{'&' if meta.query else '?'}" + \
                with_ca.lstrip("&")  # the same CA verifies a meta table over https
    return values


def _ca_bundle_option(scheme: str, given: str | None) -> str | None:
    """The CA bundle of an https endpoint: the option, else the driver's REQUESTS_CA_BUNDLE /
    SSL_CERT_FILE, checked here so a bad one fails before the query starts (``OptionError``
    naming ``ssl.ca.bundle``); ``None`` for the system's trust store."""
    from cdc_common.tls import ca_bundle_origin, ca_bundle_problem

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
                          allowed=OPTIONS["ssl.ca.bundle"][1])
    return bundle


def resolve_tunnel_id(endpoint: str, table: str, tunnel_id: str, name: str | None) -> str:
    """The name of the tunnel ``tunnel_id`` on ``table`` (driver, once, at option validation;
    one ListTunnel call): ``OptionError`` if the table has no such tunnel, or if ``name``
    (``tunnel.name``) is given and differs."""
    from connector.tunnel import open_tunnel_service

    with open_tunnel_service(endpoint) as service:
        tunnels = service.list_tunnels(table)
    for t in tunnels:
        if t.tunnel_id == tunnel_id:
            if name is not None and t.tunnel_name != name:
                raise OptionError(option="tunnel.id", value=tunnel_id,
                                  problem=f"names tunnel {t.tunnel_name!r}, not tunnel.name "
                                  f"{name!r}", allowed="matching names")
            return t.tunnel_name
    raise OptionError(option="tunnel.id", value=tunnel_id,
                      problem=f"no tunnel with this id on table {table!r}",
                      allowed=", ".join(f"{t.tunnel_id} ({t.tunnel_name})" for t in tunnels)
                      or "create the tunnel first, or use tunnel.name")
