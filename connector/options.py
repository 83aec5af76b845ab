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
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from connector.errors import OptionError
from connector.tunnel.base import StartPosition, TunnelType

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

    endpoint: str
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

    @field_validator("table_name", "tunnel_name")
    @classmethod
    def _name(cls, value: str) -> str:
        # a blank or padded name would make a distinct source identity (and tunnel) silently
        if not value.strip():
            raise ValueError("is blank")
        if value != value.strip():
            raise ValueError("has leading or trailing whitespace")
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

    @field_validator("fail_on_data_loss", "skip_empty_batches", mode="before")
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
                raise OptionError(option=key, value=value, problem=f"unknown option; {hint}",
                                  allowed=", ".join(OPTIONS))
            values[OPTIONS[canonical][0]] = value
        for required in ("endpoint", "table.name", "tunnel.name"):
            if OPTIONS[required][0] not in values:
                raise OptionError(option=required, value=None, problem="is required",
                                  allowed=OPTIONS[required][1])
        if "meta_store" not in values and (default := default_meta_store(values["endpoint"])):
            values["meta_store"] = default
        try:
            return cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = str(error["loc"][0]) if error["loc"] else "?"
            option = _FIELD_TO_OPTION.get(field, field)
            raise OptionError(option=option, value=values.get(field),
                              problem=_problem(error["msg"]),
                              allowed=OPTIONS.get(option, ("", "see docs/options.md"))[1]) from None

    # --- derived facts ----------------------------------------------------------------------

    @property
    def safe_endpoint(self) -> str:
        return strip_secrets(self.endpoint)

    @property
    def source_identity(self) -> str:
        """What a Spark checkpoint directory is bound to: endpoint + table + tunnel.

        Also the meta-store namespace, so it never contains secrets."""
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


def strip_secrets(uri: str) -> str:
    """Drop user info and query parameters that look like credentials from a URI."""
    parts = urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    secret_words = ("secret", "token", "key", "password")
    query = "&".join(
        kv for kv in parts.query.split("&")
        if kv and not any(word in kv.split("=", 1)[0].lower() for word in secret_words)
    )
    # not urlunsplit: it turns "local:///abs" into "local:/abs"
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def default_meta_store(endpoint: str) -> str | None:
    """For a local endpoint, a SQLite meta store beside the store file; else none."""
    parts = urlsplit(endpoint)
    if parts.scheme == "local" and not parts.netloc and parts.path.startswith("/"):
        base, _ = os.path.splitext(parts.path)
        return f"sqlite://{base}.meta.db"
    return None
