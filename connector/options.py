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
import enum
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core.core_schema import ValidationInfo

from cdc_common.credentials import (
    ALIBABA_ACCESS_KEY_ID,
    ALIBABA_ACCESS_KEY_SECRET,
    ALIBABA_SECURITY_TOKEN,
)
from cdc_common.schema_change import DEFAULT_POLICY, POLICIES_ALLOWED, policy_named
from cdc_common.uris import TABLESTORE_INSTANCE, redact_uri, shown_value
from connector.errors import OptionError
from connector.identity import SourceIdentity, identity_of, legacy_namespace
from connector.option_input import blamed, shown_key, text_problem, uri_problem
from connector.option_values import (
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    TIMESTAMP_ALLOWED,
    parse_bool,
    parse_bytes,
    parse_catalog,
    parse_duration_ms,
    parse_timestamp_ms,
)
from connector.tunnel import TUNNEL_BACKENDS, TunnelAdministration, endpoint_rules
from connector.tunnel.base import ColumnSpec, StartPosition, TableSchema, TunnelType
from connector.tunnel.endpoint import TunnelEndpoint
from meta_store import META_BACKENDS


class DataLossPolicy(str, enum.Enum):  # noqa: UP042 - keep str() as is for callers
    """``onDataLoss``: what records trimmed before the query read them do."""

    FAIL = "fail"
    RESNAPSHOT = "resnapshot"


class OptionSpec(NamedTuple):
    """One reader option. ``field``: the ``SourceOptions`` field it sets; ``allowed``: what is
    allowed (errors show it, and docs/options.md); ``meaning``: one line for docs/options.md.
    ``type`` and ``default`` as docs/options.md shows them, only where the field's annotation
    and default do not say it (URIs; defaults derived from other options). The reference table
    is generated from these and the fields (``testkit/options_reference.py``)."""

    field: str
    allowed: str
    meaning: str
    type: str | None = None
    default: str | None = None


#: canonical option name -> its definition
OPTIONS: dict[str, OptionSpec] = {
    "endpoint": OptionSpec(
        "endpoint", f"a tunnel-service URI: {TUNNEL_BACKENDS.forms()}",
        "the tunnel service: local:// (embedded store), http(s):// (Tablestore), "
        "dynamodb-streams://", type="URI"),
    "table.name": OptionSpec(
        "table_name", "the source table's name (no surrounding whitespace)", "the source table"),
    "tunnel.name": OptionSpec(
        "tunnel_name", "a tunnel name, created if missing (no surrounding whitespace)",
        "the tunnel to read through; created if missing",
        default="required (unless tunnel.id is given)"),
    "tunnel.type": OptionSpec(
        "tunnel_type", "Stream or BaseAndStream",
        "Stream, or BaseAndStream: a consistent snapshot first, then the stream; used when the "
        "tunnel is created"),
    "startingPosition": OptionSpec(
        "starting_position", "earliest or latest",
        "where a new Stream tunnel starts; used when the tunnel is created"),
    "meta.store": OptionSpec(
        "meta_store", "a meta-store URI: sqlite:///abs/path.db, dynamodb://TABLE?... or "
        "tablestore://INSTANCE/TABLE?endpoint=...",
        "where the source keeps what each UUID offset stands for", type="URI",
        default="SQLite beside a local store; a table in the instance for a Tablestore "
        "endpoint; else required"),
    "maxOffsetsPerChannel": OptionSpec(
        "max_offsets_per_channel", "an integer >= 1 and <= 2147483647",
        "record cap per channel per batch"),
    "maxOffsetsPerTrigger": OptionSpec(
        "max_offsets_per_trigger", "an integer >= 1 and <= 9223372036854775807 (a Java long)",
        "total cap per batch (offered to Spark as its read limit)"),
    "commitInterval": OptionSpec(
        "commit_interval", "an integer >= 1 and <= 2147483647",
        "push checkpoints to the tunnel every N committed batches; at once when a channel "
        "finishes"),
    "channelRefreshIntervalMs": OptionSpec(
        "channel_refresh_interval_ms", "an integer >= 0 and <= 2147483647",
        "least time between two reads of the channel list"),
    "metaRetentionBatches": OptionSpec(
        "meta_retention_batches", "an integer >= 1 and <= 2147483647",
        "committed batches kept in the meta table"),
    "failOnDataLoss": OptionSpec(
        "fail_on_data_loss", "true or false",
        "fail when needed records were trimmed; false skips the gap with a warning"),
    "onDataLoss": OptionSpec(
        "on_data_loss", "fail or resnapshot",
        "what trimmed records and an expired Tablestore tunnel do: fail (as failOnDataLoss; "
        "TunnelExpiredError) or resnapshot: record a resnapshot signal for the table, warn, go "
        "on after the gap or on the tunnel created again (the replicate job repairs its "
        "target; docs/resnapshot.md)"),
    "skipEmptyBatches": OptionSpec(
        "skip_empty_batches", "true or false",
        "run no batch while the tunnel reports nothing new"),
    # the vendor's connector's names for a Tablestore endpoint (docs/tablestore.md)
    "instance.name": OptionSpec(
        "instance_name", "the Tablestore instance (default: the endpoint host's first label)",
        "the Tablestore instance", default="the endpoint host's first label"),
    "tunnel.id": OptionSpec(
        "tunnel_id", "the id of an existing tunnel on the table (instead of, or checked "
        "against, tunnel.name)", "an existing tunnel, by id"),
    "access.key.id": OptionSpec(
        "access_key_id", f"an AccessKey id (else {ALIBABA_ACCESS_KEY_ID})",
        "the AccessKey id", default=f"the environment's {ALIBABA_ACCESS_KEY_ID}"),
    "access.key.secret": OptionSpec(
        "access_key_secret", f"an AccessKey secret (else {ALIBABA_ACCESS_KEY_SECRET})",
        "the AccessKey secret (never logged or stored)",
        default=f"the environment's {ALIBABA_ACCESS_KEY_SECRET}"),
    "security.token": OptionSpec(
        "security_token", f"an STS token (else {ALIBABA_SECURITY_TOKEN})",
        "an STS token (never logged or stored)",
        default=f"the environment's {ALIBABA_SECURITY_TOKEN}"),
    "catalog": OptionSpec(
        "catalog", 'JSON {"columns": {"name": {"type": "string|long|double|boolean|binary"}, '
        '...}}', "the attribute columns' types (Tablestore declares only the key)",
        type="JSON"),
    "checkpoint.table": OptionSpec(
        "checkpoint_table", "a table name in the same instance for the meta store (default "
        "tablestore_cdc_meta)", "the meta table in the endpoint's instance",
        # connector.tunnel.tablestore.endpoint.DEFAULT_CHECKPOINT_TABLE (a test holds them equal)
        default="`tablestore_cdc_meta`"),
    "ssl.ca.bundle": OptionSpec(
        "ssl_ca_bundle", "the path of a PEM file of CA certificates that verifies an https "
        "endpoint, on the driver and every executor (else REQUESTS_CA_BUNDLE, then "
        "SSL_CERT_FILE, then the system's)",
        "the CA bundle that verifies an https endpoint (the tunnel and the meta table)",
        type="path", default="REQUESTS_CA_BUNDLE, then SSL_CERT_FILE, then the system's"),
    "read.prefetch": OptionSpec(
        "read_prefetch", "true or false (default true: executors request a channel's next page "
        "while the current one is decoded)",
        "executors send a channel's next ReadRecords request while the current page is decoded"),
    # where a new query starts, and the range of a batch read
    "startingTimestamp": OptionSpec(
        "starting_timestamp", TIMESTAMP_ALLOWED,
        "a query with no checkpoint starts at the first change committed at or after this "
        "instant; with endingTimestamp, the start of a batch read's range", type="instant"),
    "endingTimestamp": OptionSpec(
        "ending_timestamp", TIMESTAMP_ALLOWED + "; spark.read (batch) only",
        "the end (exclusive) of a batch read's range: spark.read returns the changes committed "
        "in [startingTimestamp, endingTimestamp)", type="instant"),
    # batch sizing (Kafka's names and meaning; connector/planning/read_limits.py)
    "minOffsetsPerTrigger": OptionSpec(
        "min_offsets_per_trigger", "an integer >= 1 and <= 9223372036854775807 (a Java long)",
        "no batch until this many records wait, or maxTriggerDelay passed since the last one"),
    "maxTriggerDelay": OptionSpec(
        "max_trigger_delay_ms", "a duration: 15m, 30s, 500ms, 1h, 1d or a number of "
        "milliseconds (with minOffsetsPerTrigger only)",
        "the longest a batch waits for minOffsetsPerTrigger records", type="duration",
        default="`15m`"),
    # Flink CDC's name and values (docs/schema.md, "Values of another type")
    "schema.change.behavior": OptionSpec(
        "schema_change_behavior", POLICIES_ALLOWED,
        "what a value of another type than its output column does: lenient keeps it in _extra "
        "with its own type, ignore drops it, exception and evolve fail the read after the "
        "batch's end is recorded"),
    # a Debezium-like envelope, as an option (docs/schema.md, "The before-image as a struct")
    "before.format": OptionSpec(
        "before_format", "json or struct",
        "_before as JSON text (json), or as a struct of the output's attribute columns with "
        "their types (struct)", type="string"),
    # Debezium marks snapshot reads (op = r); off by default (docs/schema.md, "Snapshot rows")
    "snapshot.op": OptionSpec(
        "snapshot_op", "PUT or READ",
        "_op of a row read from a BaseAndStream tunnel's base data (the table's snapshot before "
        "the stream): PUT, as a written row, or READ", type="string"),
    "maxBytesPerTrigger": OptionSpec(
        "max_bytes_per_trigger", "a number of bytes: 1048576, or with a unit 512k, 64m, 1g (>= 1)",
        "bytes of records read per batch (the last record of a channel may cross it)",
        type="size"),
}
#: options that only mean something for a Tablestore (http/https) endpoint: its rules take them
#: (``connector.tunnel.tablestore.endpoint``), every other endpoint refuses them
_TABLESTORE_ONLY = ("instance_name", "tunnel_id", "access_key_id", "access_key_secret",
                    "security_token", "checkpoint_table", "ssl_ca_bundle", "read_prefetch")
_BY_LOWER = {name.lower(): name for name in OPTIONS}
#: upper bounds: what Spark's JVM side can hold (ReadMaxRows is a Java long)
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1
_FIELD_TO_OPTION = {spec.field: name for name, spec in OPTIONS.items()}


def _tunnel_type(text: str) -> Any:
    return next((t for t in TunnelType if t.value.lower() == text.strip().lower()), text)


def _policy(text: str) -> str:
    policy = policy_named(text)
    if policy is None:
        raise ValueError("unknown policy")
    return policy


def _lower(text: str) -> str:
    return text.strip().lower()


def _upper(text: str) -> str:
    return text.strip().upper()


#: how the option text of a field becomes its value (``SourceOptions._parsed``); a value that
#: is not text (a test's typed one) is taken as it is
_PARSERS: dict[str, Callable[[str], Any]] = {
    "catalog": parse_catalog, "starting_timestamp": parse_timestamp_ms,
    "ending_timestamp": parse_timestamp_ms, "max_trigger_delay_ms": parse_duration_ms,
    "max_bytes_per_trigger": parse_bytes, "tunnel_type": _tunnel_type,
    "schema_change_behavior": _policy, "on_data_loss": _lower, "before_format": _lower,
    "starting_position": _upper, "snapshot_op": _upper, "fail_on_data_loss": parse_bool,
    "skip_empty_batches": parse_bool, "read_prefetch": parse_bool}


class SourceOptions(BaseModel):
    """The validated options of one ``readStream.format("tablestore")`` query."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the typed endpoint its backend's rules built (``connector.tunnel.endpoint``): for a
    #: Tablestore endpoint the instance and the credentials (``SecretStr``); travels to
    #: executors inside partitions. ``safe_endpoint`` is the form to show or store
    endpoint: TunnelEndpoint = Field(repr=False)
    table_name: str = Field(min_length=1)
    #: ``None`` only while ``tunnel.id`` alone names the tunnel: ``resolved`` fills it in when
    #: the query binds
    tunnel_name: str | None = Field(default=None, min_length=1)
    tunnel_type: TunnelType = TunnelType.STREAM
    starting_position: StartPosition = StartPosition.EARLIEST
    meta_store: str
    max_offsets_per_channel: int = Field(default=10_000, ge=1, le=_INT_MAX)
    max_offsets_per_trigger: int | None = Field(default=None, ge=1, le=_LONG_MAX)
    commit_interval: int = Field(default=1, ge=1, le=_INT_MAX)
    channel_refresh_interval_ms: int = Field(default=1_000, ge=0, le=_INT_MAX)
    meta_retention_batches: int = Field(default=100, ge=1, le=_INT_MAX)
    fail_on_data_loss: bool = True
    on_data_loss: DataLossPolicy = DataLossPolicy.FAIL
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
    #: in the endpoint, and in the meta-store URI as ``ca_bundle=`` (a path, no secret)
    ssl_ca_bundle: str | None = Field(default=None, min_length=1)
    #: ``startingTimestamp``, milliseconds since the epoch: a new query's first batch starts at
    #: the first change committed at or after it; a batch read's inclusive start
    starting_timestamp: int | None = Field(default=None, ge=0, le=_LONG_MAX)
    #: ``endingTimestamp``, milliseconds since the epoch: a batch read's exclusive end
    ending_timestamp: int | None = Field(default=None, ge=0, le=_LONG_MAX)
    min_offsets_per_trigger: int | None = Field(default=None, ge=1, le=_LONG_MAX)
    max_trigger_delay_ms: int = Field(default=DEFAULT_MAX_TRIGGER_DELAY_MS, ge=0, le=_LONG_MAX)
    max_bytes_per_trigger: int | None = Field(default=None, ge=1, le=_LONG_MAX)
    #: executors' Tablestore clients send a channel's next ReadRecords request ahead; in the
    #: endpoint (connector/tunnel/tablestore/prefetch.py)
    read_prefetch: bool = True
    #: ``schema.change.behavior``: the policy's canonical name (``cdc_common.schema_change``);
    #: read on executors (``connector.misfits``)
    schema_change_behavior: str = DEFAULT_POLICY
    #: ``before.format``: ``_before`` as JSON text or a typed struct (``connector.schema``)
    before_format: Literal["json", "struct"] = "json"
    #: ``snapshot.op``: the ``_op`` of base-data rows (``connector.schema.mark_snapshot_reads``)
    snapshot_op: Literal["PUT", "READ"] = "PUT"

    @field_validator("table_name", "tunnel_name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        # a blank or padded name would make a distinct source identity (and tunnel) silently
        if value is None:
            return value
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

    @field_validator(*_PARSERS, mode="before")
    @classmethod
    def _parsed(cls, value: Any, info: ValidationInfo) -> Any:
        return _PARSERS[str(info.field_name)](value) if isinstance(value, str) else value

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
                raise OptionError(option=shown_key(key), value=shown_value(key, value),
                                  problem=f"unknown option; {hint}",
                                  allowed=", ".join(OPTIONS))
            field = OPTIONS[canonical].field
            problem = text_problem(value)
            if problem is not None:  # before any parser: none of them reads it
                raise OptionError(option=canonical, value=_shown(field, value), problem=problem,
                                  allowed=OPTIONS[canonical].allowed)
            values[field] = value
        if "meta_store" in values:
            problem = uri_problem(values["meta_store"], META_BACKENDS)
            if problem is not None:
                raise OptionError(option="meta.store", value=_shown("meta_store",
                                                                    values["meta_store"]),
                                  problem=problem, allowed=OPTIONS["meta.store"].allowed)
        # in the order a person reads a query: the endpoint and its scheme first (it decides
        # which other options apply), then the table and the tunnel, then the rest
        for required in ("endpoint", "table.name", "tunnel.name"):
            if required == "tunnel.name" and values.get("tunnel_id"):
                continue  # read from the tunnel id when the query binds (resolved)
            if OPTIONS[required].field not in values:
                raise OptionError(option=required, value=None, problem="is required",
                                  allowed=OPTIONS[required].allowed)
            if required == "endpoint":
                _check_endpoint_scheme(str(values["endpoint"]))
        # what the endpoint takes is its backend's knowledge (connector/tunnel/endpoint.py)
        rules = endpoint_rules(str(values["endpoint"]))
        for field in _TABLESTORE_ONLY:
            if values.get(field) is not None and field not in rules.option_fields:
                option = _FIELD_TO_OPTION[field]
                raise OptionError(option=option, value=_shown(field, values[field]),
                                  problem="applies to a Tablestore (http/https) endpoint "
                                  "only", allowed="leave it out")
        with blamed("endpoint", _shown("endpoint", values["endpoint"]),
                    OPTIONS["endpoint"].allowed):
            values = rules.configure(values, allowed=lambda option: OPTIONS[option].allowed)
        try:
            built = cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else "?"
            option = _FIELD_TO_OPTION.get(field, field)
            spec = OPTIONS.get(option)
            raise OptionError(option=option, value=_shown(field, values.get(field)),
                              problem=_problem(error["msg"]),
                              allowed=spec.allowed if spec else "see docs/options.md") from None
        _check_combinations(built, given=set(values))
        if built.on_data_loss is DataLossPolicy.RESNAPSHOT:  # the read goes on after a gap
            built = built.model_copy(update={"fail_on_data_loss": False})
        # an endpoint that names no service is refused at load(), before any tunnel is named
        with blamed("endpoint", built.safe_endpoint, OPTIONS["endpoint"].allowed):
            identity_of(built.endpoint.uri, built.table_name, built.tunnel_name or "")
        return built

    def resolved(self, tunnel: TunnelAdministration) -> SourceOptions:
        """These options with ``tunnel.name`` read from ``tunnel.id`` (driver, when the query
        binds: one ListTunnel through ``tunnel``, never during validation); ``OptionError``
        when the table has no tunnel of that id, or ``tunnel.name`` names another. Without
        ``tunnel.id`` the options themselves."""
        if self.tunnel_id is None:
            return self
        name = endpoint_rules(self.endpoint.uri).resolve_tunnel_name(
            tunnel, self.table_name, self.tunnel_id, self.tunnel_name)
        return self.model_copy(update={"tunnel_name": name})

    # --- checks per kind of read (driver: DataSource.streamReader / reader) ---------------------

    def check_for_stream(self) -> None:
        """A streaming query (``readStream``): ``endingTimestamp`` belongs to batch reads."""
        if self.ending_timestamp is not None:
            raise OptionError(option="endingTimestamp", value=self.ending_timestamp,
                              problem="applies to a batch read (spark.read) only; a streaming "
                              "query has no end", allowed="leave it out of readStream")

    def check_for_batch(self) -> None:
        """A bounded batch read (``spark.read``): both ends of the range are required and the
        per-trigger options mean nothing there."""
        for option, value in (("startingTimestamp", self.starting_timestamp),
                              ("endingTimestamp", self.ending_timestamp)):
            if value is None:
                raise OptionError(option=option, value=None, problem="is required for a batch "
                                  "read (spark.read): it reads the changes committed in "
                                  "[startingTimestamp, endingTimestamp)",
                                  allowed=TIMESTAMP_ALLOWED)
        assert self.starting_timestamp is not None and self.ending_timestamp is not None
        if self.ending_timestamp <= self.starting_timestamp:
            raise OptionError(option="endingTimestamp", value=self.ending_timestamp,
                              problem=f"is not after startingTimestamp "
                              f"({self.starting_timestamp})", allowed="a later instant")
        if self.tunnel_type is not TunnelType.STREAM:
            raise OptionError(option="tunnel.type", value=self.tunnel_type.value,
                              problem="a batch read reads the change stream of a time range",
                              allowed="Stream (leave it out)")

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
        options or the driver's ``ALIBABA_CLOUD_*``, in the typed endpoint). They travel to
        executors inside partitions, like the endpoint, and are never stored or shown."""
        if urlsplit(self.meta_store).scheme != "tablestore":
            return None
        return self.endpoint.credentials()

    @property
    def safe_endpoint(self) -> str:
        """The endpoint as it may be shown and stored (``cdc_common.uris.redact_uri``: no user
        info, no secret query pair): in the namespace description and the legacy namespace;
        its form for an endpoint in use never changes (tests/test_uri_pins.py)."""
        return redact_uri(self.endpoint.uri)

    @property
    def named_tunnel(self) -> str:
        """``tunnel.name``; a query named by ``tunnel.id`` alone has one once ``resolved``."""
        if self.tunnel_name is None:
            raise OptionError(option="tunnel.id", value=self.tunnel_id, problem="names a "
                              "tunnel whose name is read when the query binds, not yet",
                              allowed="the options returned by SourceOptions.resolved")
        return self.tunnel_name

    @property
    def identity(self) -> SourceIdentity:
        """The source this query reads: the service (not the URL's spelling), the table and
        the tunnel (``connector.identity``). Parses the endpoint only; no request."""
        return identity_of(self.endpoint.uri, self.table_name, self.named_tunnel)

    @property
    def source_identity(self) -> str:
        """The identity's text: what a Spark checkpoint directory is bound to (every offset's
        ``source``) and the meta-store namespace of a new query. Holds no secret and no CA
        bundle path (neither names the service)."""
        return self.identity.namespace

    @property
    def legacy_namespace(self) -> str:
        """The namespace earlier versions gave this query (``endpoint#table#tunnel`` with the
        endpoint's shown form), still used where their rows are (``connector.identity``)."""
        return legacy_namespace(self.safe_endpoint, self.table_name, self.named_tunnel)


def _check_combinations(built: SourceOptions, given: set[str]) -> None:
    """Options that are valid alone but not together (``given``: the fields the user set)."""
    if (built.on_data_loss is DataLossPolicy.RESNAPSHOT and "fail_on_data_loss" in given
            and built.fail_on_data_loss):
        raise OptionError(option="onDataLoss", value=built.on_data_loss.value,
                          problem="conflicts with failOnDataLoss=true: resnapshot goes on "
                          "after trimmed records", allowed="one of onDataLoss=resnapshot and "
                          "failOnDataLoss=true")
    if built.starting_timestamp is not None:
        if "starting_position" in given:
            raise OptionError(option="startingTimestamp", value=built.starting_timestamp,
                              problem="conflicts with startingPosition: both say where a new "
                              "query starts", allowed="one of startingTimestamp and "
                              "startingPosition")
        if built.tunnel_type is TunnelType.BASE_AND_STREAM:
            raise OptionError(option="startingTimestamp", value=built.starting_timestamp,
                              problem="conflicts with tunnel.type BaseAndStream, which starts "
                              "with a full copy of the table", allowed="tunnel.type Stream")
    if "max_trigger_delay_ms" in given and built.min_offsets_per_trigger is None:
        raise OptionError(option="maxTriggerDelay", value=built.max_trigger_delay_ms,
                          problem="caps how long minOffsetsPerTrigger holds a batch back, and "
                          "minOffsetsPerTrigger is not set",
                          allowed="minOffsetsPerTrigger with it, or leave it out")
    if (built.min_offsets_per_trigger is not None and built.max_offsets_per_trigger is not None
            and built.min_offsets_per_trigger > built.max_offsets_per_trigger):
        raise OptionError(option="minOffsetsPerTrigger", value=built.min_offsets_per_trigger,
                          problem=f"is above maxOffsetsPerTrigger "
                          f"({built.max_offsets_per_trigger}): no batch could satisfy both",
                          allowed="a value <= maxOffsetsPerTrigger")


def _check_endpoint_scheme(endpoint: str) -> None:
    """Refuse an endpoint whose scheme names no tunnel backend (``htp://...``, a bare
    ``127.0.0.1:PORT``), naming ``endpoint`` and the schemes there are: checked before any
    backend-specific option, whose errors would otherwise blame a correct option."""
    try:
        scheme = urlsplit(endpoint).scheme
    except ValueError:
        scheme = ""
    if scheme in TUNNEL_BACKENDS:
        return
    if re.fullmatch(r"[\w.-]+:\d+/?", endpoint):
        problem = "not a URI: a host and port alone has no scheme (expected scheme://...)"
    elif not scheme or not endpoint.partition(":")[2].startswith("/"):
        problem = "not a URI (expected scheme://...)"
    else:
        problem = f"unsupported scheme {scheme!r}"
    raise OptionError(option="endpoint", value=redact_uri(endpoint), problem=problem,
                      allowed=f"one of the schemes {', '.join(TUNNEL_BACKENDS)}: "
                      + TUNNEL_BACKENDS.forms())


def _problem(message: str) -> str:
    message = message.removeprefix("Value error, ")
    if message == "Field required":
        return "is required for this endpoint"
    return message


def _shown(field: str, value: Any) -> Any:
    """An option value as an error may show it: secrets masked, endpoints redacted, cut to
    200 characters (a catalog may be long)."""
    if field in ("endpoint", "meta_store") and isinstance(value, str):
        value = redact_uri(value)
    elif isinstance(value, str) and value:
        value = shown_value(field, value)
    return value[:197] + "..." if isinstance(value, str) and len(value) > 200 else value
