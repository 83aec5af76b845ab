"""The endpoint URI, boto3 clients and the mapping of AWS errors (driver and executors).

URI::

    dynamodb-streams://[TABLE]?checkpoint_table=NAME&region=us-east-1
        [&endpoint_url=http://127.0.0.1:5000][&profile=NAME][&create_table=true]
        [&numbers=double|decimal][&max_attempts=8][&retry_mode=standard|adaptive]
        [&poll_interval_ms=1000]

- ``TABLE`` (optional): the only source table this endpoint serves; a call naming another
  table is refused. Without it the table comes from the ``table.name`` option alone.
- ``checkpoint_table`` (required): the DynamoDB table where tunnels and their checkpoints are
  kept (the stream keeps no consumer state); ``create_table=true`` creates it when missing.
- ``endpoint_url``: one endpoint for DynamoDB and DynamoDB Streams (moto, a VPC endpoint).
- ``numbers``: how ``N`` values are decoded (``codec.decode_value``).
- ``poll_interval_ms``: an idle driver probes the shards for new records (``has_new_data``) at
  most this often for the same positions (Spark polls an idle source every few milliseconds;
  ``GetRecords`` allows about 5 calls per second per shard across all readers).
- ``max_attempts`` / ``retry_mode``: botocore's own retries with backoff and jitter for
  throttling (``LimitExceededException``, ``ProvisionedThroughputExceededException``), 5xx and
  connection errors; what still fails becomes ``TransientTunnelError``, which
  ``connector.retry`` retries again around the whole call.

The query is validated by ``EndpointQuery`` (``cdc_common.uris.parse_query``). Credentials come
only from the standard AWS chain (environment, ``profile``, a role). A URI carrying credentials
(user info, a secret-looking key: ``cdc_common.uris``'s one rule) is refused with
``OptionError`` that hides the values.

boto3 is imported here and in ``service``/``checkpoints`` only: this package is imported lazily
by ``connector.tunnel.open_tunnel_service``, never by ``import connector``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
from botocore.config import Config
from pydantic import Field

from cdc_common.aws_errors import is_transient
from cdc_common.aws_responses import refuse_damaged_responses
from cdc_common.credentials import AWS_CREDENTIAL_CHAIN, AWS_DEFAULT_REGION
from cdc_common.uris import HttpEndpoint, UriBool, UriQuery, parse_query, redact_uri
from connector.errors import OptionError, TransientTunnelError, TunnelRequestError

SCHEME = "dynamodb-streams"
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,255}$")

_sessions: dict[str | None, Any] = {}
_lock = threading.Lock()


class EndpointQuery(UriQuery):
    """The query of a ``dynamodb-streams://`` endpoint (module docstring)."""

    credentials_hint: ClassVar[str] = f"use {AWS_CREDENTIAL_CHAIN}"

    checkpoint_table: str = Field(
        pattern=_TABLE_NAME.pattern,
        description="a DynamoDB table name (it keeps the tunnels and their checkpoints)")
    region: str | None = None
    endpoint_url: HttpEndpoint | None = Field(None, description="http(s)://host[:port]")
    profile: str | None = None
    create_table: UriBool = False
    numbers: Literal["double", "decimal"] = Field("double", description="double or decimal")
    max_attempts: int = Field(8, ge=1, le=50, description="an integer from 1 to 50")
    retry_mode: Literal["standard", "adaptive"] = Field("standard",
                                                        description="standard or adaptive")
    poll_interval_ms: int = Field(1000, ge=0, le=60_000, description="an integer from 0 to 60000")


class EndpointConfig(EndpointQuery):
    """A parsed ``dynamodb-streams://`` URI: its query, the URI as shown and the table it names
    (safe to log: it holds no secret)."""

    uri: str
    table: str | None


def parse_uri(uri: str) -> EndpointConfig:
    """Validate the endpoint URI (driver, executors). Raises ``OptionError`` naming the part."""
    shown = redact_uri(uri, EndpointQuery.model_fields)

    def refuse(problem: str) -> OptionError:
        return OptionError(option="endpoint", value=shown, problem=problem,
                           allowed=f"{SCHEME}://[TABLE]?checkpoint_table=NAME&region=...; "
                           f"parameters: {', '.join(EndpointQuery.model_fields)}")

    parts = urlsplit(uri)
    if parts.scheme != SCHEME:
        raise refuse(f"not a {SCHEME}:// URI")
    if "@" in parts.netloc:
        raise refuse(f"credentials are not accepted in the URI; use {AWS_CREDENTIAL_CHAIN}")
    if parts.netloc and not _TABLE_NAME.match(parts.netloc):
        raise refuse(f"table name {parts.netloc!r} is not valid")
    if parts.path not in ("", "/") or parts.fragment:
        raise refuse("nothing may follow the table name but ?parameters")
    query = parse_query(parts.query, EndpointQuery, refuse)
    return EndpointConfig(uri=shown, table=parts.netloc or None, **query.model_dump())


def _session_and_region(cfg: EndpointConfig) -> tuple[Any, str]:
    """The cached boto3 session of the endpoint's profile and the region it uses: the URI's,
    else the profile's or the environment's. Call with ``_lock`` held."""
    session = _sessions.get(cfg.profile)
    if session is None:
        try:
            session = _sessions[cfg.profile] = boto3.session.Session(profile_name=cfg.profile)
        except botocore.exceptions.ProfileNotFound as exc:
            raise OptionError(option="endpoint", value=cfg.uri, problem=str(exc),
                              allowed="a profile of the shared AWS config") from None
    region = cfg.region or session.region_name
    if not region:
        raise OptionError(option="endpoint", value=cfg.uri, problem="no AWS region",
                          allowed=f"region=... in the URI, {AWS_DEFAULT_REGION} or a profile")
    return session, region


def service_name(cfg: EndpointConfig) -> str:
    """``REGION/CHECKPOINT_TABLE``: what names the service behind the endpoint (the region's
    DynamoDB Streams, and the table keeping this consumer's tunnels), the same whichever
    ``endpoint_url`` reaches it (a VPC endpoint, moto at ``localhost`` or ``127.0.0.1``) and
    whatever retry or polling parameters it has. No request (a region the URI does not give
    comes from the profile or the environment)."""
    region = cfg.region
    if not region:
        with _lock:
            _, region = _session_and_region(cfg)
    return f"{region}/{cfg.checkpoint_table}"


def clients(cfg: EndpointConfig) -> tuple[Any, Any]:
    """``(dynamodb, dynamodbstreams)`` boto3 clients for the endpoint (thread-safe clients)."""
    with _lock:  # sessions and client creation are not thread-safe
        session, region = _session_and_region(cfg)
        settings: dict[str, Any] = {
            "region_name": region,
            "retries": {"mode": cfg.retry_mode, "total_max_attempts": cfg.max_attempts},
            "connect_timeout": 5, "read_timeout": 20,
            "user_agent_extra": "tablestore-cdc-streams",
        }
        try:
            # the regional endpoint, not the account-based one botocore >= 1.44 picks for
            # streams: moto answers the account-based host with 404
            config = Config(**settings, account_id_endpoint_mode="disabled")
        except TypeError:  # botocore older than account-based endpoints
            config = Config(**settings)
        # every answer checked before it is parsed (length, x-amz-crc32): a damaged one is
        # never used, and is retried as a transient error
        ddb = refuse_damaged_responses(
            session.client("dynamodb", endpoint_url=cfg.endpoint_url, config=config))
        streams = refuse_damaged_responses(
            session.client("dynamodbstreams", endpoint_url=cfg.endpoint_url, config=config))
    return ddb, streams


class AwsError(Exception):
    """Internal: an AWS error code the caller turns into the product's own error."""

    def __init__(self, code: str, message: str, response: dict[str, Any]) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.response = response


#: codes the callers handle themselves (everything else is transient or a request error)
HANDLED_CODES = frozenset({
    "ResourceNotFoundException", "ConditionalCheckFailedException",
    "TransactionCanceledException", "TrimmedDataAccessException", "ExpiredIteratorException",
    "ResourceInUseException",
})


def call(uri: str, operation: str, method: Callable[..., Any], **kwargs: Any) -> Any:
    """One AWS request (botocore retried it already): throttling, 5xx and unreachable
    endpoints become ``TransientTunnelError``, codes in ``HANDLED_CODES`` ``AwsError``, the rest
    ``TunnelRequestError``."""
    try:
        return method(**kwargs)
    except botocore.exceptions.ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", "")) or str(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in HANDLED_CODES:
            raise AwsError(code, message, exc.response) from None
        if is_transient(code, status):
            raise TransientTunnelError(
                detail=f"{uri}: {operation} failed with {code or status}: {message}") from None
        raise TunnelRequestError(endpoint=uri, operation=operation,
                                 reason=f"{code}: {message}") from None
    except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as exc:
        raise TransientTunnelError(detail=f"{uri}: {operation}: {exc}") from None
    except botocore.exceptions.NoCredentialsError:
        raise TunnelRequestError(
            endpoint=uri, operation=operation,
            reason=f"no AWS credentials found; provide them through {AWS_CREDENTIAL_CHAIN}",
        ) from None
    except botocore.exceptions.BotoCoreError as exc:
        raise TunnelRequestError(endpoint=uri, operation=operation, reason=str(exc)) from None
