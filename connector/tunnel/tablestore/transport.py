"""Signed POSTs to a Tablestore endpoint: v2 request signing, response validation, retries.

``Transport.call("/tunnel/readrecords", body)`` sends one protobuf body and returns the
response body, after checking what the vendor SDKs check on every 2xx response: the body's MD5
(``x-ots-contentmd5``), the content type header, and the ``Authorization: OTS <id>:<sig>``
signature over the sorted ``x-ots-*`` response headers and the path. A response that fails any
of it is never used (``ResponseValidationError``): a proxy or a man in the middle cannot feed
the reader rows. Error responses are checked as the Python SDK checks them
(``tablestore.protocol.OTSProtocol.handle_error``): the MD5 and date when present, the
signature when present (except on a 403 ``OTSAuthFailed``, which the service sends unsigned).

Signing (the service's v2 scheme, as both SDKs implement it): headers ``x-ots-date`` (UTC,
milliseconds), ``x-ots-apiversion``, ``x-ots-accesskeyid``, ``x-ots-instancename``,
``x-ots-contentmd5``, optional ``x-ots-ststoken``; ``x-ots-signature`` =
base64(HMAC-SHA1(secret, ``"PATH\\nPOST\\n\\n"`` + each ``x-ots-*`` header as ``name:value\\n``
sorted by name)). The dates, MD5s and signed texts are ``signing.py``'s, which the emulator
uses for its end.

First contact (``cdc_common.first_contact``): at a query's start, while this transport has
had no answer yet, a request that gets none at all (no such host, connection refused, the
connection closed without an HTTP answer, a connect timeout) raises ``Unreachable`` at once:
a configuration error, never retried. Afterwards the same errors are retried as below.

https: the server's certificate and host name are always verified, against the CA bundle
given (``ca_bundle``: the source option ``ssl.ca.bundle``, else ``REQUESTS_CA_BUNDLE`` /
``SSL_CERT_FILE``, else the system's trust store; ``cdc_common.tls``). A certificate or
host-name failure, or a server that does not speak TLS, raises ``TlsError`` at once: a
configuration error, never retried.

Retries, with exponential backoff, for at most ``RETRY_DEADLINE_S`` per call; then
``Unavailable`` is raised and the caller's own bounded retry layer (``connector.retry``) may
try the whole call again:

- any call: network errors (refused, reset, timeout) and ``OTSTunnelServerUnavailable`` whose
  message does not begin ``OTSTrimmedDataAccess`` (a non-protobuf 5xx body counts as one, the
  Go SDK's rule);
- idempotent calls (``IDEMPOTENT_PATHS``: the Java SDK's list of reads) also
  ``OTSTimeout``, ``OTSInternalServerError``, ``OTSServerUnavailable`` and any 5xx status (the
  Java SDK's ``DefaultRetryStrategy``).

How long a call can take: each attempt connects within ``CONNECT_TIMEOUT_S`` and gets its
whole answer within ``RETRY_DEADLINE_S`` (``http``'s answer deadline, whatever the transport's
own ``retry_deadline_s``; each read within ``READ_TIMEOUT_S``), and no attempt begins after the
retry deadline: a server that drips its answer, or sends nothing, fails the call after 15 s; at
worst (an attempt begun just before the retry deadline) a call ends within 15 + 5 + 15 s. An
answer past the wire's size limits (``http``: ``MAX_ANSWER_BYTES``, ``MAX_HEADER_COUNT``,
``MAX_HEADER_BYTES``) raises ``http.AnswerTooLarge`` at once, never retried: it is not the
service's, and asking again would read as much again.

An answer that fails validation (a 2xx as above; an error answer whose ``x-ots-contentmd5``
does not match its body, as the SDKs check too) is asked again, at most
``VALIDATION_ATTEMPTS`` times within the same deadline.

Pipelined calls: ``send(path, body)`` sends a request on a connection of its own and returns a
``PendingCall`` at once; ``result()`` reads and checks its answer later, so the caller works
while the request is served (no thread: the client's ``read_page`` decodes a page while the next
one is on its way). A pending call that fails in any way -- the send, the connection, the
answer -- is done again by ``call`` (its retries, its errors), so the two give the same answers.

Secrets: the key secret and the STS token live only in this object: its ``Credentials`` (whose
``repr`` hides them) and the ``signing.SigningKey`` made from the secret; nothing here logs
headers or puts them in an exception.

Who uses it: ``connector.tunnel.tablestore.client`` (driver and executors).
"""

from __future__ import annotations

import hmac
import http.client
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc_common.first_contact import at_query_start, unreachable_problem
from cdc_common.tls import tls_problem
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.http import Answer, AnswerTooLarge, Connection, ConnectionPool
from connector.tunnel.tablestore.signing import (
    SigningKey,
    content_md5,
    ots_date,
    ots_date_seconds,
    response_signature,
)

#: what a request that got no usable answer raises (``connector.tunnel.tablestore.http``)
_NETWORK_ERRORS = (OSError, http.client.HTTPException)

log = logging.getLogger("connector.tunnel.tablestore")

API_VERSION = "2015-12-31"
USER_AGENT = "tablestore-cdc"
#: the documented 15 s (docs/operations.md, "Errors"): a network error or a retryable service
#: error is retried until this long after a call began (then ``Unavailable``), and one answer,
#: across all its reads, must come whole within as long (``http``'s answer deadline: else a
#: timeout, retried as any network error while the call's retries last)
RETRY_DEADLINE_S = 15.0
#: calls that read only, so any server-side failure may be retried (the Java SDK's
#: ``OperationNames.IdempotentActionTool``; GetRpo reads too)
IDEMPOTENT_PATHS = frozenset({
    "/tunnel/list", "/tunnel/describe", "/tunnel/readrecords", "/tunnel/getcheckpoint",
    "/tunnel/getrpo", "/ListTable", "/DescribeTable",
})
#: retried on idempotent calls besides OTSTunnelServerUnavailable (Java ``DefaultRetryStrategy``)
IDEMPOTENT_RETRY_CODES = frozenset({"OTSTimeout", "OTSInternalServerError",
                                    "OTSServerUnavailable"})
TRIMMED_PREFIX = "OTSTrimmedDataAccess"
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 2.0
#: how far a response's x-ots-date may be from this machine's clock (the SDKs' rule)
MAX_CLOCK_SKEW_S = 15 * 60
#: answers failing validation (MD5, signature, date) tolerated per call before giving up
VALIDATION_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 5.0
#: each read of an answer (the whole answer is bounded by ``RETRY_DEADLINE_S``, the tighter)
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Credentials:
    """An AccessKey pair and optional STS token. ``repr`` shows the key id only."""

    access_key_id: str
    access_key_secret: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)


class ServiceError(Exception):
    """A non-2xx answer: the service's ``code`` and ``message`` (client maps it to types)."""

    def __init__(self, http_status: int, code: str, message: str, request_id: str) -> None:
        super().__init__(f"{code} (HTTP {http_status}): {message}")
        self.http_status = http_status
        self.code = code
        self.message = message
        self.request_id = request_id


class Unavailable(Exception):
    """The service could not be reached, or stayed unavailable, for ``RETRY_DEADLINE_S``."""


class ResponseValidationError(Exception):
    """A response whose MD5, signature or date does not verify."""


class Unreachable(Exception):
    """At a query's start, the endpoint gave no answer at all (``cdc_common.first_contact``);
    the message is one line naming the endpoint and what to fix."""


class TlsError(Exception):
    """The endpoint's TLS cannot be verified (untrusted certificate, wrong host name, no TLS on
    the port); the message is one line naming the endpoint and what to fix."""


def retryable(exc: ServiceError, idempotent: bool) -> bool:
    """Whether ``exc`` is worth another attempt of the same call (module docstring)."""
    if exc.code == "OTSTunnelServerUnavailable":
        return not exc.message.startswith(TRIMMED_PREFIX)
    return idempotent and (exc.code in IDEMPOTENT_RETRY_CODES or 500 <= exc.http_status < 600)


class Transport:
    """One endpoint, one instance, one key pair; a small connection pool (thread-safe:
    ``call`` may run in several threads at once). Not fork-safe by itself: the client opens a
    new one in each process.

    ``clock`` and ``sleep`` time the retries (``time.monotonic`` and ``time.sleep``; tests pass
    a fake clock to check the backoff without waiting for it)."""

    def __init__(self, endpoint: str, instance: str, credentials: Credentials,
                 retry_deadline_s: float = RETRY_DEADLINE_S, *, ca_bundle: str | None = None,
                 pool_size: int = 4, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.instance = instance
        self.credentials = credentials
        self.retry_deadline_s = retry_deadline_s
        self.ca_bundle = ca_bundle
        self._clock = clock
        self._sleep = sleep
        for name, value in (("instance", instance), ("access key id",
                                                     credentials.access_key_id),
                            ("security token", credentials.security_token or "")):
            if "\r" in value or "\n" in value:  # each goes into a header line as it is
                raise ValueError(f"the {name} holds a line break")
        self._pool = ConnectionPool(
            # kept-alive connections: one per caller at once (the driver's concurrent calls,
            # an executor's read and its prefetch), so none is opened anew per request
            self.endpoint, ca_bundle=ca_bundle, connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S, max_idle=pool_size, answer_deadline_s=RETRY_DEADLINE_S)
        #: has the endpoint answered a request of this transport (any HTTP status)?
        self.answered = False
        self._key = SigningKey(credentials.access_key_secret)
        self._signed = self._signed_request_parts()

    def close(self) -> None:
        self._pool.close()

    def _signed_request_parts(self) -> tuple[str, str, str]:
        """What every request of this transport carries unchanged, made once: the signed text's
        ``x-ots-*`` lines before and after the date and the body's MD5 (sorted by name, as
        signed), and the header lines sent besides those two and the signature."""
        creds = self.credentials
        before = (f"x-ots-accesskeyid:{creds.access_key_id.strip()}\n"
                  f"x-ots-apiversion:{API_VERSION}\n")
        after = f"x-ots-instancename:{self.instance.strip()}\n"
        head = (f"User-Agent: {USER_AGENT}\r\nx-ots-apiversion: {API_VERSION}\r\n"
                f"x-ots-accesskeyid: {creds.access_key_id}\r\n"
                f"x-ots-instancename: {self.instance}\r\n")
        if creds.security_token:
            after += f"x-ots-ststoken:{creds.security_token.strip()}\n"
            head += f"x-ots-ststoken: {creds.security_token}\r\n"
        return before, after, head

    def _validate(self, path: str, headers: dict[str, str], body: bytes,
                  success: bool = True, check_signature: bool = True) -> None:
        """A 2xx response must carry and pass every check; an error response is checked on
        what it carries (the Python SDK's ``handle_error``)."""
        def bad(reason: str) -> ResponseValidationError:
            return ResponseValidationError(f"{path}: response rejected: {reason}")

        md5 = headers.get("x-ots-contentmd5")
        if (success or md5 is not None) and md5 != content_md5(body):
            raise bad("x-ots-contentmd5 missing or not the body's MD5")
        if success and "x-ots-contenttype" not in headers:
            raise bad("x-ots-contenttype missing")
        if success or "x-ots-date" in headers:
            when = ots_date_seconds(headers.get("x-ots-date", ""))
            if when is None or abs(time.time() - when) > MAX_CLOCK_SKEW_S:
                raise bad("x-ots-date missing or more than 15 minutes off this machine's clock")
        auth = headers.get("authorization")
        if not check_signature or (auth is None and not success):
            return
        expected = response_signature(path, headers, self._key)
        prefix = f"OTS {self.credentials.access_key_id}:"
        auth = auth or ""
        if not (auth.startswith(prefix) and hmac.compare_digest(auth[len(prefix):], expected)):
            raise bad("the Authorization signature does not verify")

    def _request(self, path: str, body: bytes) -> bytes:
        """The request's bytes: the headers, signed (module docstring), then the body. The
        fixed parts are made once (``_signed_request_parts``): the driver signs hundreds of
        checkpoint pushes per batch."""
        before, after, head = self._signed
        date, md5 = ots_date(), content_md5(body)
        signature = self._key.sign(
            f"{path}\nPOST\n\n{before}x-ots-contentmd5:{md5}\nx-ots-date:{date}\n{after}")
        return self._pool.post_bytes(
            path, f"{head}x-ots-date: {date}\r\nx-ots-contentmd5: {md5}\r\n"
                  f"x-ots-signature: {signature}\r\n", body)

    def _network_error(self, exc: BaseException) -> Exception:
        """What a request that got no usable answer raises (module docstring)."""
        problem = tls_problem(exc, self.endpoint)
        if problem is not None:
            return TlsError(problem)
        if at_query_start() and not self.answered:
            problem = unreachable_problem(exc, self.endpoint, "endpoint")
            if problem is not None:
                return Unreachable(problem)
        return Unavailable(f"{type(exc).__name__}: {exc}")

    def _once(self, path: str, body: bytes) -> bytes:
        try:
            answer = self._pool.exchange(self._request(path, body))
        except AnswerTooLarge:
            self.answered = True  # an answer, though not one the service sends: not retried
            raise
        except _NETWORK_ERRORS as exc:
            raise self._network_error(exc) from None
        return self._answer(path, answer)

    def _answer(self, path: str, resp: Answer) -> bytes:
        """The checked body of an answer, or the ``ServiceError`` it carries."""
        self.answered = True
        headers = resp.headers
        data = resp.body
        if 200 <= resp.status < 300:
            self._validate(path, headers, data)
            return data
        md5 = headers.get("x-ots-contentmd5")
        if md5 is not None and md5 != content_md5(data):
            # an error answer altered on the way: its code and message cannot be trusted
            raise ResponseValidationError(f"{path}: HTTP {resp.status} answer rejected: "
                                          "x-ots-contentmd5 is not the body's MD5")
        request_id = headers.get("x-ots-requestid", "")
        try:
            error = m.parse(m.Error, data)
            code, message = error.code, error.message
        except m.MessageError:
            # the Go SDK's rule: a 5xx without a protobuf body is "server unavailable"
            code = "OTSTunnelServerUnavailable" if resp.status >= 500 else "OTSClientError"
            message = data[:200].decode("utf-8", "replace")
        # the service leaves its authentication refusals unsigned (it cannot know the key)
        self._validate(path, headers, data, success=False,
                       check_signature=not (resp.status == 403 and code == "OTSAuthFailed"))
        raise ServiceError(resp.status, code, message, request_id)

    def send(self, path: str, body: bytes) -> PendingCall:
        """Send ``body`` to ``path`` now on a connection of the pool taken for it; the answer is
        read by the returned call's ``result()`` (module docstring)."""
        conn = self._pool.take()  # its own connection until the answer is read
        try:
            conn.send(self._request(path, body))
        except Exception:  # noqa: BLE001 - result() does the call again, and meets the error
            self._pool.give_back(conn)
            return PendingCall(self, path, body, None, self._pool)
        return PendingCall(self, path, body, conn, self._pool)

    def call(self, path: str, body: bytes) -> bytes:
        """POST ``body`` to ``path``; the validated response body. Raises ``ServiceError``,
        ``Unavailable`` (after bounded retries), ``ResponseValidationError``, ``TlsError``,
        ``Unreachable`` or ``http.AnswerTooLarge`` (an answer past the wire's limits, at once:
        asking again would read as much again)."""
        idempotent = path in IDEMPOTENT_PATHS
        began = self._clock()
        deadline = began + self.retry_deadline_s
        delay = BACKOFF_INITIAL_S
        attempt = validation_failures = 0
        while True:
            attempt += 1
            try:
                return self._once(path, body)
            except ServiceError as exc:
                if not retryable(exc, idempotent):
                    raise
                last: Exception = exc
            except Unavailable as exc:
                last = exc
            except ResponseValidationError as exc:
                # altered on the way (or not the service's): never used, asked again; the
                # request may have taken effect, and every call is safe to repeat. An answer
                # that keeps failing is no accident of the network: raised as it is.
                validation_failures += 1
                if validation_failures >= VALIDATION_ATTEMPTS:
                    raise
                last = exc
            if self._clock() + delay > deadline:
                raise Unavailable(f"{path}: {last} (gave up after {attempt} attempt(s) in "
                                  f"{self._clock() - began:.1f} s)")
            # WARNING: an outage is worth seeing, and executors' Python workers show only that
            log.warning("%s %s failed (attempt %d): %s; retrying in %.2f s", self.endpoint,
                        path, attempt, last, delay)
            self._sleep(delay + random.uniform(0, delay / 4))
            delay = min(delay * 2, BACKOFF_MAX_S)


class PendingCall:
    """A request ``Transport.send`` sent, its answer not read yet. Used by one thread."""

    def __init__(self, transport: Transport, path: str, body: bytes, conn: Connection | None,
                 pool: ConnectionPool) -> None:
        self.path, self.body = path, body
        self._transport, self._conn, self._pool = transport, conn, pool

    def result(self, again: bool = True) -> bytes:
        """The checked answer, as ``Transport.call`` returns it; raises as ``call`` does. Read
        once: the connection goes back to the pool. ``again=False``: a failure is raised as
        it is (``Unavailable`` for one of the network) instead of doing the call again, for a
        caller that does it again its own way."""
        conn, self._conn = self._conn, None
        if conn is None:
            if not again:
                raise Unavailable(f"{self.path}: the request could not be sent")
            return self._transport.call(self.path, self.body)
        try:
            resp = conn.read()  # the whole body is read here
        except AnswerTooLarge:
            self._pool.give_back(conn)
            self._transport.answered = True
            raise  # as ``call`` raises it: asking again would read as much again
        except Exception as exc:  # noqa: BLE001 - any failure: the call is done again
            self._pool.give_back(conn)  # closed by the failure: not kept
            if not again:
                raise self._transport._network_error(exc) from None
            return self._transport.call(self.path, self.body)
        self._pool.give_back(conn)  # once, and only now: the connection is free again
        try:
            return self._transport._answer(self.path, resp)
        except Exception:  # noqa: BLE001 - a refused answer too: the call meets it itself
            if not again:
                raise
            return self._transport.call(self.path, self.body)

    def discard(self) -> None:
        """The answer is not wanted: its connection is closed unread (and back in the pool,
        to be opened anew when needed)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            self._pool.give_back(conn)
