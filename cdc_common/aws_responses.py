"""AWS answers checked before botocore parses them: used by both AWS backends (the DynamoDB meta
store, ``meta_store.dynamodb``, and the DynamoDB Streams tunnel,
``connector.tunnel.dynamodb_streams``).

botocore does not enforce ``Content-Length`` (``enforce_content_length=False``), checks
DynamoDB's ``x-amz-crc32`` only to decide on a retry (the last damaged answer would still be
used) and DynamoDB Streams' not at all: a truncated Streams answer was parsed into one missing
its fields. ``refuse_damaged_responses`` makes every damaged answer an error before it is
parsed, so it is never used and the retry layer asks again.

Unlike the rest of ``cdc_common`` this module imports an SDK (botocore): only the AWS backends,
which need the ``dynamodb`` extra anyway, import it.
"""

from __future__ import annotations

import zlib
from typing import Any

import botocore.exceptions


class DamagedResponseError(botocore.exceptions.HTTPClientError):
    """An answer damaged on the way: shorter or longer than its ``Content-Length``, or not
    matching its ``x-amz-crc32``. Raised before botocore parses it, so it is never used; an
    ``HTTPClientError``, so callers count it as transient (the request may have taken effect:
    every write here is safe to repeat, and the retry layer sends it again)."""

    fmt = "Damaged response to {operation}: {reason}"


def _check_response(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
    body = response_dict.get("body")
    if not isinstance(body, bytes):
        return  # a streamed body: not ours to check here
    headers = response_dict.get("headers") or {}
    length = str(headers.get("content-length", ""))
    if length.isdigit() and int(length) != len(body):
        raise DamagedResponseError(operation=operation_model.name,
                                   reason=f"{len(body)} of {length} bytes arrived")
    crc = str(headers.get("x-amz-crc32", ""))
    if crc.isdigit() and zlib.crc32(body) & 0xFFFFFFFF != int(crc):
        raise DamagedResponseError(operation=operation_model.name,
                                   reason="the body does not match its x-amz-crc32")


def refuse_damaged_responses(client: Any) -> Any:
    """Check every answer ``client`` (boto3, any service) gets before it is parsed: botocore
    does not enforce ``Content-Length``, checks DynamoDB's ``x-amz-crc32`` only to retry (the
    last damaged answer would still be used) and DynamoDB Streams' not at all. Used by the
    DynamoDB meta store and the DynamoDB Streams tunnel."""
    client.meta.events.register("before-parse", _check_response)
    return client
