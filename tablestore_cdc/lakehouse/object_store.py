"""pyarrow's S3 file system for what the application writes into object storage itself (driver
and executors): the data files Spark's executors write into a Delta table in S3
(``delta.DeltaApplySink``, a large append) and the job's own files under ``--output
s3://`` (``pipeline.output``).

Its settings as delta-rs takes them: a target's storage options (``--target-option``, any case:
``aws_endpoint_url``, ``aws_region``, ``aws_access_key_id``...), else the AWS environment
(``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``,
``AWS_VIRTUAL_HOSTED_STYLE_REQUEST``); credentials not given as options are found by the AWS
SDK's own chain (environment, profile, instance role) where the file system is used. The file
system pickles with its settings (a Spark task gets it whole): nothing here logs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

#: pyarrow's ``S3FileSystem`` argument: the storage option names delta-rs reads it from
_OPTIONS = {
    "endpoint_override": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
    "region": ("aws_region", "region", "aws_default_region"),
    "access_key": ("aws_access_key_id", "access_key_id"),
    "secret_key": ("aws_secret_access_key", "secret_access_key"),
    "session_token": ("aws_session_token", "session_token", "token"),
}
_ENVIRONMENT = {"endpoint_override": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
                "region": ("AWS_REGION", "AWS_DEFAULT_REGION")}
_VIRTUAL_HOSTED = ("aws_virtual_hosted_style_request", "virtual_hosted_style_request")


#: the storage option names an S3 endpoint is read from (any case), as delta-rs reads them
ENDPOINT_OPTIONS = _OPTIONS["endpoint_override"]


def s3_setting(argument: str, options: Mapping[str, str] | None = None,
               environ: Mapping[str, str] = os.environ) -> str | None:
    """One of ``S3FileSystem``'s settings (``endpoint_override``, ``region``, ...): the
    storage option's (``_OPTIONS``, any case), else the environment's (``_ENVIRONMENT``)."""
    given = {key.lower(): value for key, value in (options or {}).items()}
    return next((given[n] for n in _OPTIONS[argument] if given.get(n)), None) or next(
        (environ[n] for n in _ENVIRONMENT.get(argument, ()) if environ.get(n)), None)


def virtual_hosted(options: Mapping[str, str] | None = None,
                   environ: Mapping[str, str] = os.environ) -> bool:
    """Is virtual-hosted addressing asked for, by a storage option or
    ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST``?"""
    given = {key.lower(): value for key, value in (options or {}).items()}
    value = next((given[n] for n in _VIRTUAL_HOSTED if n in given), None)
    return (value or environ.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "")).lower() in (
        "1", "true")


def s3_filesystem(options: Mapping[str, str] | None = None, bucket: str = "") -> Any:
    """pyarrow's ``S3FileSystem`` for the storage ``options`` and the environment (module
    docstring). With virtual-hosted addressing, an endpoint naming ``bucket`` (as delta-rs is
    given it, ``target.storage_options``) is taken without it: the AWS SDK adds the bucket."""
    from pyarrow.fs import S3FileSystem

    settings: dict[str, Any] = {}
    for argument in _OPTIONS:
        value = s3_setting(argument, options)
        if value:
            settings[argument] = value
    if not ("access_key" in settings and "secret_key" in settings):
        settings.pop("access_key", None)  # half a key pair: the SDK's chain finds both
        settings.pop("secret_key", None)
        settings.pop("session_token", None)
    endpoint = settings.get("endpoint_override", "")
    virtual = virtual_hosted(options)
    if virtual and bucket and endpoint:
        parts = urlsplit(endpoint)
        if parts.netloc.startswith(f"{bucket}."):
            settings["endpoint_override"] = parts._replace(
                netloc=parts.netloc.removeprefix(f"{bucket}.")).geturl()
    return S3FileSystem(**settings, scheme="http" if endpoint.startswith("http://") else "https",
                        force_virtual_addressing=virtual)


def s3_location(uri: str) -> str | None:
    """``BUCKET/PREFIX`` of an ``s3://`` or ``s3a://`` URI (as pyarrow's file system names
    it), None for any other."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in ("s3", "s3a"):
        return None
    return f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
