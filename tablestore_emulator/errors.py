"""The service's errors as the emulator raises them: an HTTP status, a code and a message.

Any route handler (table API in ``table_api``, tunnel API in ``tunnel_api``) raises ``OtsError``;
``server`` renders it the way Tablestore does: a non-2xx status, a protobuf ``Error{code=1,
message=2}`` body and an ``x-ots-requestid`` header. The SDKs turn that into their own service
error (``tablestore.OTSServiceError`` in Python) carrying the same status, code and message.

The helpers below name the codes the real service uses, with the status it sends for each.
"""

from __future__ import annotations


class OtsError(Exception):
    """A service error: ``http_status``, ``code`` (e.g. ``OTSObjectNotExist``), ``message``."""

    def __init__(self, http_status: int, code: str, message: str) -> None:
        super().__init__(f"{http_status} {code}: {message}")
        self.http_status = http_status
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.http_status, self.code, self.message))


def parameter_invalid(message: str) -> OtsError:
    """400 ``OTSParameterInvalid``: a malformed or out-of-range request."""
    return OtsError(400, "OTSParameterInvalid", message)


def object_not_exist(message: str = "Requested table does not exist.") -> OtsError:
    """404 ``OTSObjectNotExist``: the table (or tunnel) is not there."""
    return OtsError(404, "OTSObjectNotExist", message)


def object_already_exist(message: str = "Requested table already exists.") -> OtsError:
    """409 ``OTSObjectAlreadyExist``: CreateTable of a name in use."""
    return OtsError(409, "OTSObjectAlreadyExist", message)


def condition_check_fail(message: str = "Condition check failed.") -> OtsError:
    """403 ``OTSConditionCheckFail``: a row condition (EXPECT_EXIST / EXPECT_NOT_EXIST) is false."""
    return OtsError(403, "OTSConditionCheckFail", message)


def auth_failed(message: str) -> OtsError:
    """403 ``OTSAuthFailed``: unknown key, bad signature, date too far off."""
    return OtsError(403, "OTSAuthFailed", message)


def unsupported_operation(message: str) -> OtsError:
    """400 ``OTSUnsupportOperation``: a request the emulator (or service) does not support."""
    return OtsError(400, "OTSUnsupportOperation", message)


def server_unavailable(message: str = "Server is busy, please retry later.") -> OtsError:
    """503 ``OTSServerUnavailable``: retryable; the SDK's retry policy retries it."""
    return OtsError(503, "OTSServerUnavailable", message)


def internal_error(message: str = "Internal server error.") -> OtsError:
    """500 ``OTSInternalServerError``: a bug in the emulator."""
    return OtsError(500, "OTSInternalServerError", message)
