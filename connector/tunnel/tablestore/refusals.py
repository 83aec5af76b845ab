"""How the Tablestore Tunnel service's refusals become the product's errors (pure functions).

Errors (service code -> the product's type): retryable ones (``transport``'s rules, the
SDKs') are retried inside the transport for a bounded time, then ``TransientTunnelError``; an
``OTSTunnelServerUnavailable`` whose message begins ``OTSTrimmedDataAccess`` is
``TrimmedDataError`` at once (never retried); ``OTSSequenceNumberNotMatch`` is handled by
``checkpoint``; ``OTSTunnelExist`` is ``TunnelExistsError``; ``OTSTunnelExpired``,
``OTSAuthFailed`` / ``OTSPermissionDenied`` are ``TunnelExpiredError`` and ``TunnelAuthError``.
The service says "not there" in two shapes -- 404 ``OTSObjectNotExist`` and 400
``OTSParameterInvalid`` ("parameter incorrect or the requested data table does not exist") --
and the second also means a bad request. So a refusal in either shape is *confirmed* before
it becomes ``UnknownTableError`` / ``UnknownTunnelError`` / ``UnknownChannelError`` (and before
``ensure_tunnel`` creates anything): ListTable for the table, ListTunnel for the tunnel,
DescribeTunnel for the channel and its status (a WAIT channel is
``ChannelNotReadableError``; a refused ``"finished"`` push or a push to a terminated channel
``InvalidCheckpointError``; any other refused read or push names the token,
``MalformedTokenError``). What cannot be confirmed stays ``TunnelParameterError`` /
``TunnelServiceError`` carrying the service's code and message; messages are never parsed for
meaning. An https endpoint whose certificate or host name does not verify is
``EndpointTlsError`` at once; at a query's start, an endpoint that gives no answer at all (no
such host, connection refused, no HTTP answer) is ``EndpointUnreachableError`` at once
(``cdc_common.first_contact``). Refused credentials (``TunnelAuthError``) name the options that
carry them (``auth_hint``).

The client (``client.py``) sends the calls; what needs another call to be confirmed (ListTable,
ListTunnel, DescribeTunnel) is asked there, and the answer decided here.
"""

from __future__ import annotations

import re

from cdc_common.credentials import (
    ALIBABA_ACCESS_KEY_ID,
    ALIBABA_ACCESS_KEY_SECRET,
    ALIBABA_SECURITY_TOKEN,
)
from connector.errors import (
    ChannelNotReadableError,
    InvalidCheckpointError,
    MalformedTokenError,
    TrimmedDataError,
    UnknownChannelError,
)
from connector.tunnel.base import ChannelInfo, ChannelStatus, Checkpoint
from connector.tunnel.tablestore.transport import TRIMMED_PREFIX, ServiceError

#: the emulator's addition to a trimmed-data message (the first position still held)
_TRIM_DETAIL = re.compile(r"\[requested=(\S+) earliest=(\S+) lost=(\S+) resume=(\S*)\]")
#: the two shapes in which the service refuses a table, tunnel or channel that is not there
NOT_THERE_CODES = ("OTSObjectNotExist", "OTSParameterInvalid")


def auth_hint(code: str) -> str:
    """What to fix when the service refuses the credentials (``TunnelAuthError``): the options
    that carry them, and the environment variables they default to."""
    keys = (f"access.key.id / access.key.secret (or {ALIBABA_ACCESS_KEY_ID} / "
            f"{ALIBABA_ACCESS_KEY_SECRET})")
    if code == "OTSPermissionDenied":
        return (f"the key lacks a permission on this instance: grant it (a RAM policy) or use "
                f"another key in {keys}")
    if code == "ResponseInvalid":
        return (f"check access.key.secret (or {ALIBABA_ACCESS_KEY_SECRET}), and that nothing "
                "between this machine and the endpoint alters responses")
    return (f"the service refused the credentials: check {keys}, security.token (or "
            f"{ALIBABA_SECURITY_TOKEN}) for an STS key, and instance.name")


def is_not_there(exc: ServiceError) -> bool:
    """Is the refusal in one of the "not there" shapes (to be confirmed before believed)?"""
    return exc.code in NOT_THERE_CODES


def trimmed_data_error(exc: ServiceError, tunnel_id: str,
                       channel_id: str) -> TrimmedDataError | None:
    """The refusal of a read whose records were trimmed (its code and message prefix: the
    service's documented shape), else ``None``."""
    msg = exc.message
    if exc.code != "OTSTunnelServerUnavailable" or not msg.startswith(TRIMMED_PREFIX):
        return None
    detail = _TRIM_DETAIL.search(msg)
    requested, earliest, lost, resume = (
        detail.groups() if detail else ("(unknown)", "(unknown)", "(unknown)", ""))
    return TrimmedDataError(channel_id=channel_id, tunnel_id=tunnel_id, requested=requested,
                            earliest=earliest, lost=lost, resume_token=resume,
                            service_message=msg)


def channel_refusal(exc: ServiceError, tunnel_id: str, channel_id: str,
                    channel: ChannelInfo | None, token: str,
                    push: Checkpoint | None) -> Exception | None:
    """A channel call (a read from ``token``, or the ``push`` of a checkpoint) refused in a
    "not there" shape, decided by what DescribeTunnel says of the channel (``None``: not in
    the tunnel). ``None`` when it cannot be told: the service's own error stands."""
    msg = exc.message
    if channel is None:
        return UnknownChannelError(channel_id=channel_id, tunnel_id=tunnel_id)
    if push is not None:
        if push.finished or channel.status is ChannelStatus.TERMINATED:
            return InvalidCheckpointError(channel_id=channel_id, tunnel_id=tunnel_id,
                                          reason=f"refused by the service: {msg}")
        return MalformedTokenError(channel_id=channel_id, token=token, reason=msg)
    if channel.status is ChannelStatus.WAIT:
        return ChannelNotReadableError(channel_id=channel_id, tunnel_id=tunnel_id,
                                       status=channel.status.value)
    if token:  # a read: the channel is there and readable, so the token is refused
        return MalformedTokenError(channel_id=channel_id, token=token, reason=msg)
    return None


__all__ = ["NOT_THERE_CODES", "auth_hint", "channel_refusal", "is_not_there",
           "trimmed_data_error"]
