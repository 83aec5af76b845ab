"""``--target`` URIs: which table a change stream is applied into (driver: ``replicate``,
``reconcile``, ``resnapshot`` and ``lake optimize`` all open their table here).

- ``delta:///abs/path/to/table``: a Delta table in a local directory (created on the first
  batch);
- ``delta+s3://BUCKET/PREFIX``: a Delta table in S3 or an S3-compatible store (Alibaba OSS,
  MinIO), opened by delta-rs, which reads the standard AWS environment itself
  (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_PROFILE``); ``delta+gs://`` and
  ``delta+abfss://`` are handed to delta-rs the same way (untested here);
- ``iceberg:///abs/warehouse?table=NAMESPACE.TABLE``: an Iceberg table in pyiceberg's SQL catalog
  on the SQLite file ``<warehouse>/catalog.db``, its files under the warehouse directory;
  ``&catalog_db=/abs/other.db`` puts the catalog elsewhere. Namespace and table are created on
  the first batch;
- ``iceberg://CATALOG/NAMESPACE.TABLE``: an Iceberg table in the catalog pyiceberg's own
  configuration names ``CATALOG`` (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__<PROP>``
  environment variables): REST, Glue, Hive, SQL, whatever ``load_catalog`` loads.

``target_options`` (``--target-option KEY=VALUE``, a table's ``target_options`` in the
``--config`` TOML) are delta-rs storage options of a Delta target in an object store, or
catalog properties of an Iceberg catalog (they override its configuration). Credentials come
from the environment, a profile or a file the user names; an option whose key names a secret is
never shown (``shown_options``). ``AWS_S3_ALLOW_UNSAFE_RENAME`` is refused: delta-rs commits to
S3 with a conditional put (``If-None-Match``), so a second writer's commit is refused, not
overwritten, and the unsafe rename would give that up. delta-rs' retry and timeout options
(``max_retries``, ``retry_timeout``, ``timeout``, ``connect_timeout``, ``backoff_config.*``)
are checked here, so a value delta-rs would not parse is refused before anything starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cdc_common.uris import MASK, is_secret_key, redact_uri
from tablestore_cdc.lakehouse.errors import TargetUriError
from tablestore_cdc.lakehouse.sink import ApplySink, log

FORMS = ("delta:///abs/path, delta+s3://bucket/prefix, iceberg:///abs/warehouse?table="
         "namespace.table or iceberg://catalog/namespace.table")
#: ``delta+<scheme>``: the object stores whose URIs are handed to delta-rs (only s3 is tested)
DELTA_OBJECT_STORES = ("s3", "s3a", "gs", "abfss", "az")
#: storage options that are never passed: they give up the safe commit (module doc)
REFUSED_OPTIONS = frozenset({"aws_s3_allow_unsafe_rename"})
#: delta-rs' (object_store's) retry and timeout options, checked here so that a bad value is
#: refused before the job starts, naming the option (docs/lakehouse.md, "Faults of the object
#: store"): a count, durations (``500ms``, ``30s``, ``2min``, ``1m 30s``), a factor
COUNT_OPTIONS = frozenset({"max_retries"})
DURATION_OPTIONS = frozenset({"retry_timeout", "timeout", "connect_timeout",
                              "pool_idle_timeout", "backoff_config.init_backoff",
                              "backoff_config.max_backoff"})
FACTOR_OPTIONS = frozenset({"backoff_config.base"})
_DURATION = re.compile(r"(?:\s*\d+(?:\.\d+)?\s*[A-Za-z\u00b5]+)+\s*")


def open_apply_sink(uri: str, *, target_options: Mapping[str, str] | None = None,
                    **options: Any) -> ApplySink:
    """The sink for ``uri`` (module doc) with ``options`` (``sink.ApplySink``'s) and
    ``target_options`` (storage options or catalog properties, module doc). Opens nothing
    yet."""
    given = dict(target_options or {})
    shown = redact_uri(uri)
    try:
        parts = urlsplit(uri)
    except ValueError:
        raise TargetUriError(uri=shown, problem="it is not a URI", allowed=FORMS) from None
    scheme, _, store = parts.scheme.partition("+")
    if scheme not in ("delta", "iceberg"):  # before its path: detla://lake is a typo
        raise TargetUriError(uri=shown, problem=f"unknown scheme {parts.scheme!r}",
                             allowed=FORMS)
    # abfss://CONTAINER@ACCOUNT...: the container is where user info would be
    if parts.password is not None or (parts.username is not None and store != "abfss"):
        raise TargetUriError(uri=shown, problem="credentials do not go in the URI (give them "
                             "in the environment, a profile or a file the environment names)",
                             allowed=FORMS)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    if scheme == "delta" and store:
        return _delta_object_store(uri, shown, store, parts.netloc, parts.path, query, given,
                                   options)
    if scheme == "iceberg" and parts.netloc:
        return _iceberg_catalog(shown, parts.netloc, parts.path, query, given, options)
    if parts.netloc or not parts.path.startswith("/"):
        raise TargetUriError(uri=shown, problem="the path must be absolute (three slashes)",
                             allowed=FORMS)
    if parts.scheme == "delta":
        if query:
            raise TargetUriError(uri=shown, problem=f"unknown parameter(s) {sorted(query)}",
                                 allowed=FORMS)
        _no_options(shown, given, "a local Delta table")
        from tablestore_cdc.lakehouse.delta import DeltaApplySink

        return DeltaApplySink(parts.path, **options)
    if parts.scheme == "iceberg":
        table = query.pop("table", "")
        catalog_db = query.pop("catalog_db", None)
        if query:
            raise TargetUriError(uri=shown, problem=f"unknown parameter(s) {sorted(query)}",
                                 allowed=FORMS + " (and &catalog_db=/abs/catalog.db)")
        _check_identifier(shown, table, "table=NAMESPACE.TABLE is required")
        _no_options(shown, given, "the embedded SQLite catalog")
        from tablestore_cdc.lakehouse.iceberg import IcebergApplySink, sqlite_catalog_properties

        return IcebergApplySink(sqlite_catalog_properties(parts.path, catalog_db), table,
                                **options)
    raise TargetUriError(uri=shown, problem=f"unknown scheme {parts.scheme!r}", allowed=FORMS)


def _delta_object_store(uri: str, shown: str, store: str, bucket: str, path: str,
                        query: dict[str, str], given: dict[str, str],
                        options: dict[str, Any]) -> ApplySink:
    """``delta+<store>://BUCKET/PREFIX``: the sink of the table delta-rs finds at
    ``<store>://BUCKET/PREFIX`` with the storage options ``storage_options`` makes."""
    if store not in DELTA_OBJECT_STORES:
        raise TargetUriError(uri=shown, problem=f"unknown object store {store!r}",
                             allowed=FORMS + f" (delta+ one of {', '.join(DELTA_OBJECT_STORES)})")
    if not bucket or query:
        raise TargetUriError(uri=shown, problem=("unknown parameter(s) "
                                                 f"{sorted(query)} (storage options are "
                                                 "--target-option KEY=VALUE)") if bucket
                             else "it names no bucket", allowed=FORMS)
    from tablestore_cdc.lakehouse.delta import DeltaApplySink

    table_uri = uri.split("+", 1)[1].split("?", 1)[0].rstrip("/")
    found = storage_options(shown, store, given, bucket=bucket)
    if found:
        log.info("target %s: delta-rs storage options %s", shown, shown_options(found))
    return DeltaApplySink(table_uri, storage_options=found, **options)


def storage_options(shown: str, store: str, given: Mapping[str, str],
                    environ: Mapping[str, str] | None = None, *,
                    bucket: str = "") -> dict[str, str] | None:
    """The delta-rs storage options of a Delta table in ``store`` (``s3``, ``gs``, ...):
    the options the user gave (``given``), and for S3 behind an ``http://`` endpoint (the
    option's or ``AWS_ENDPOINT_URL``) ``AWS_ALLOW_HTTP=true``, which delta-rs needs for it.
    With virtual-hosted addressing (Alibaba Cloud OSS) and an endpoint that does not name
    ``bucket``, the endpoint with the bucket put before its host: delta-rs (object_store) then
    takes the endpoint as the bucket's own, where the AWS SDKs (S3A, pyarrow, boto3) add the
    bucket themselves, so one ``AWS_ENDPOINT_URL`` serves all. Everything else delta-rs reads
    from the environment itself. None: no options."""
    environ = os.environ if environ is None else environ
    for key in given:
        if key.lower() in REFUSED_OPTIONS:
            raise TargetUriError(uri=shown, problem=f"target option {key!r} is refused: "
                                 "delta-rs' conditional put keeps a second writer's commit, "
                                 "an unsafe rename would overwrite it", allowed=FORMS)
    for key, value in given.items():
        _check_retry_option(shown, key.lower(), value)
    found = dict(given)
    lowered = {k.lower(): v for k, v in given.items()}
    if store not in ("s3", "s3a"):
        return found or None
    from tablestore_cdc.lakehouse.object_store import (
        ENDPOINT_OPTIONS,
        s3_setting,
        virtual_hosted,
    )

    endpoint_key = next((k for k in given if k.lower() in ENDPOINT_OPTIONS), "AWS_ENDPOINT_URL")
    endpoint = s3_setting("endpoint_override", given, environ) or ""
    if "aws_allow_http" not in lowered and endpoint.lower().startswith("http://"):
        found["AWS_ALLOW_HTTP"] = "true"
    host = urlsplit(endpoint).hostname or ""
    if virtual_hosted(given, environ) and bucket and host and not host.startswith(f"{bucket}."):
        parts = urlsplit(endpoint)
        found[endpoint_key] = parts._replace(netloc=f"{bucket}.{parts.netloc}").geturl()
    return found or None


def _check_retry_option(shown: str, key: str, value: str) -> None:
    """``TargetUriError`` for a retry or timeout option (``COUNT_OPTIONS``, ...) whose value
    delta-rs would not parse; other options are delta-rs' to check."""
    text = value.strip()
    if key in COUNT_OPTIONS:
        ok, allowed = text.isdigit(), "a whole number, 0 or more"
    elif key in DURATION_OPTIONS:
        ok, allowed = bool(_DURATION.fullmatch(text)), "a duration such as 500ms, 30s, 2min"
    elif key in FACTOR_OPTIONS:
        try:
            ok = float(text) > 0
        except ValueError:
            ok = False
        allowed = "a number above 0"
    else:
        return
    if not ok:
        raise TargetUriError(uri=shown, problem=f"target option {key}={value!r} is not "
                             f"{allowed}", allowed=FORMS)


def _iceberg_catalog(shown: str, catalog: str, path: str, query: dict[str, str],
                     given: dict[str, str], options: dict[str, Any]) -> ApplySink:
    """``iceberg://CATALOG/NAMESPACE.TABLE``: the sink of the table in the catalog pyiceberg's
    configuration names ``CATALOG`` (read now, from the files and the environment), its
    properties overridden by ``given``."""
    from tablestore_cdc.lakehouse.iceberg import IcebergApplySink, _pyiceberg

    identifier = path.lstrip("/")
    if query:
        raise TargetUriError(uri=shown, problem=f"unknown parameter(s) {sorted(query)} "
                             "(catalog properties are --target-option KEY=VALUE)",
                             allowed=FORMS)
    _check_identifier(shown, identifier, "the path must be /NAMESPACE.TABLE")
    _pyiceberg()
    from pyiceberg.utils.config import Config

    configured = Config().get_catalog_config(catalog) or {}
    if not configured and not given:
        raise TargetUriError(uri=shown, problem=f"pyiceberg has no catalog {catalog!r}: "
                             f"configure it in .pyiceberg.yaml or with "
                             f"PYICEBERG_CATALOG__{catalog.upper()}__<PROPERTY> environment "
                             "variables (or --target-option)", allowed=FORMS)
    properties = {str(k): str(v) for k, v in configured.items() if not isinstance(v, dict)}
    if given:
        log.info("target %s: catalog properties given %s", shown, shown_options(given))
    return IcebergApplySink({**properties, **given}, identifier, catalog_name=catalog,
                            **options)


def _check_identifier(shown: str, identifier: str, problem: str) -> None:
    if identifier.count(".") < 1 or not all(identifier.split(".")):
        raise TargetUriError(uri=shown, problem=problem, allowed=FORMS)


def _no_options(shown: str, given: Mapping[str, str], what: str) -> None:
    if given:
        raise TargetUriError(uri=shown, problem=f"{what} takes no target options "
                             f"(got {shown_options(given)})", allowed=FORMS)


def shown_options(given: Mapping[str, str]) -> str:
    """Target options as they may be shown or logged: ``KEY=VALUE, ...`` with the value of
    every secret key (``cdc_common.uris.is_secret_key``: ``aws_secret_access_key``, any key
    with ``secret``, ``token``, ``password``, ...) ``***``."""
    return ", ".join(f"{k}={MASK if is_secret_key(k) else v}" for k, v in given.items())


def parse_target_options(pairs: list[str] | None) -> dict[str, str]:
    """``--target-option KEY=VALUE`` flags as a dict (``TargetUriError`` for a pair without
    ``=`` or with an empty key; a value is never echoed: it may be a secret)."""
    found: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise TargetUriError(uri="--target-option", problem="a value given is not "
                                 "KEY=VALUE (not shown: it may hold a secret)",
                                 allowed="--target-option KEY=VALUE")
        found[key.strip()] = value
    return found
