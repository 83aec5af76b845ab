"""One Tunnel RPC and its errors: the base every role of the Tablestore client stands on.

``TablestoreCalls._call`` sends a protobuf request over the signed transport (``transport``) and
parses the answer; the transport's failures and the service's refusals become the product's
errors here (``refusals`` for the wording): an unavailable service a ``TransientTunnelError``
(the seam's retries take it; an answer that did not come whole within the answer deadline is
one), a refused signature ``TunnelAuthError``, an answer past the wire's size limits
``TunnelAnswerTooLargeError`` (never retried), and so on. A role's
``on_error`` sees a ``ServiceError`` first and may map it to something more precise (a tunnel
that exists, a channel that was trimmed). Driver and executors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connector.errors import (
    EndpointTlsError,
    EndpointUnreachableError,
    TransientTunnelError,
    TunnelAnswerTooLargeError,
    TunnelAuthError,
    TunnelExpiredError,
    TunnelParameterError,
    TunnelServiceError,
)
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.http import AnswerTooLarge
from connector.tunnel.tablestore.refusals import auth_hint
from connector.tunnel.tablestore.transport import (
    PendingCall,
    ResponseValidationError,
    ServiceError,
    TlsError,
    Transport,
    Unavailable,
    Unreachable,
)

#: the client id sent with reads and checkpoints (the service accepts ids it never issued)
CLIENT_ID = "tablestore-cdc"
#: maps a refusal to the product's error (``None``: the generic one)
OnError = Callable[[ServiceError], Exception | None]


class TablestoreCalls:
    """Sends RPCs for one client (``client.TablestoreTunnelService`` sets the fields)."""

    #: the endpoint and instance, secrets removed (``TunnelClient.uri``)
    uri: str
    _transport: Transport

    def _call(self, path: str, request: Any, response_type: Any,
              on_error: OnError | None = None) -> Any:
        return self._send(path, request.SerializeToString(), response_type, on_error)

    def _send(self, path: str, body: bytes, response_type: Any, on_error: OnError | None = None,
              answer: PendingCall | None = None,
              parse: Callable[[bytes], Any] | None = None) -> Any:
        """``_call`` with the request already serialized; with ``answer`` (a request sent
        ahead), its answer instead of sending ``body``; ``parse`` instead of
        ``messages.parse(response_type, ...)`` when given."""
        try:
            data = answer.result() if answer is not None else self._transport.call(path, body)
        except Unavailable as exc:
            raise TransientTunnelError(detail=f"{self.uri} {path}: {exc}") from None
        except ResponseValidationError as exc:
            raise TunnelAuthError(endpoint=self.uri, operation=path, code="ResponseInvalid",
                                  http_status=200, message=str(exc),
                                  hint=auth_hint("ResponseInvalid")) from None
        except TlsError as exc:
            raise EndpointTlsError(problem=str(exc)) from None
        except Unreachable as exc:
            raise EndpointUnreachableError(problem=str(exc)) from None
        except AnswerTooLarge as exc:
            raise TunnelAnswerTooLargeError(endpoint=self.uri, operation=path, what=exc.what,
                                            limit=exc.limit) from None
        except ServiceError as exc:
            mapped = on_error(exc) if on_error is not None else None
            raise (mapped or self._generic(path, exc)) from None
        try:
            return parse(data) if parse is not None else m.parse(response_type, data)
        except m.MessageError as exc:
            raise TunnelServiceError(endpoint=self.uri, operation=path, code="BadResponse",
                                     http_status=200, message=str(exc)) from None

    def _generic(self, path: str, exc: ServiceError) -> Exception:
        fields = {"endpoint": self.uri, "operation": path, "code": exc.code,
                  "http_status": exc.http_status, "message": exc.message}
        if exc.code == "OTSTunnelServerUnavailable":
            return TransientTunnelError(detail=f"{self.uri} {path}: {exc.message}")
        if exc.code in ("OTSAuthFailed", "OTSPermissionDenied"):
            return TunnelAuthError(**fields, hint=auth_hint(exc.code))
        if exc.code == "OTSTunnelExpired":
            return TunnelExpiredError(**fields)
        if exc.code == "OTSParameterInvalid":
            return TunnelParameterError(**fields)
        return TunnelServiceError(**fields)


__all__ = ["CLIENT_ID", "OnError", "TablestoreCalls"]
