"""Which AWS error codes are worth retrying: plain data shared by the DynamoDB meta store
(``meta_store.dynamodb``) and the DynamoDB Streams tunnel (``connector.tunnel.dynamodb_streams``).

botocore already retried these with backoff and jitter (``max_attempts``) before its caller
sees one; a code in ``TRANSIENT_ERROR_CODES`` (or any HTTP status >= 500) then becomes the
caller's retryable error (``TransientMetaStoreError`` / ``TransientTunnelError``), anything else
a request error that retrying will not fix. Nothing here imports boto3.
"""

from __future__ import annotations

#: throttling, capacity and server-side failures: the same request may succeed later
TRANSIENT_ERROR_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "Throttling",
    "RequestLimitExceeded", "InternalServerError", "InternalFailure", "ServiceUnavailable",
    "ServiceUnavailableException", "LimitExceededException", "TransactionInProgressException",
})


def is_transient(code: str, http_status: int) -> bool:
    """Is an AWS error with this code and HTTP status worth retrying later?"""
    return code in TRANSIENT_ERROR_CODES or http_status >= 500
