"""Tablestore's v2 signatures: checking a request, signing a response.

Called by ``server`` for every POST (the headers before the body is read, the body's MD5
after), table API (``/PutRow`` ...) and tunnel API
(``/tunnel/readrecords`` ...) alike; route handlers never see an unauthenticated request.

Request (what the SDKs send, and what is checked here):
- ``x-ots-accesskeyid`` must be the configured key id, ``x-ots-instancename`` the instance;
- ``x-ots-apiversion`` present (any value: Java sends "2015-12-31", Go "2018-04-01" on tunnel
  calls; both SDKs mark it, and the instance name, mandatory);
- ``x-ots-date`` within 15 minutes of now (only ``YYYY-MM-DDTHH:MM:SS`` is parsed: the Go SDK's
  fraction is malformed, so the fraction is not validated);
- ``x-ots-contentmd5`` = base64(MD5(body));
- ``x-ots-signature`` = base64(HMAC-SHA1(secret, "PATH\\nPOST\\n\\n" + the sorted
  ``name:trimmed-value`` lines of every other ``x-ots-*`` header, each followed by "\\n")).

Response: ``x-ots-contentmd5``, ``x-ots-requestid``, ``x-ots-contenttype``, ``x-ots-date`` and
``Authorization: OTS <akid>:<sig>`` with sig = base64(HMAC-SHA1(secret, the sorted
``name:value`` lines of the ``x-ots-*`` response headers joined by "\\n", then "\\nPATH")).
The SDKs check all of it on every 2xx response.

The dates, MD5s and signed texts are ``connector.tunnel.tablestore.signing``'s, which the
client uses for its end (the official SDKs check this end in the tests).
"""

from __future__ import annotations

import functools
import hmac
import time
from collections.abc import Mapping

from connector.tunnel.tablestore.signing import (
    SIGNATURE_HEADER,
    SigningKey,
    content_md5,
    ots_date,
    ots_date_seconds,
    request_signature,
    response_signature,
)
from tablestore_emulator.errors import OtsError, auth_failed, parameter_invalid

__all__ = ["CONTENT_TYPE", "MAX_CLOCK_SKEW_S", "content_md5", "request_signature",
           "response_headers", "response_signature", "verify_body", "verify_headers"]

#: How far a request's x-ots-date may be from the server's clock, in seconds (the service's
#: rule: 15 minutes).
MAX_CLOCK_SKEW_S = 15 * 60
#: The value the service sends in x-ots-contenttype.
CONTENT_TYPE = "protocol buffer"
#: headers every request must carry (the SDKs always send them)
_REQUIRED_HEADERS = ("x-ots-date", "x-ots-apiversion", "x-ots-accesskeyid",
                     "x-ots-instancename", "x-ots-contentmd5", SIGNATURE_HEADER)


@functools.lru_cache(maxsize=4)
def _signing_key(secret: str) -> SigningKey:
    """The server's configured secret, ready to sign (made once per secret: every request and
    answer is signed with it)."""
    return SigningKey(secret)


def verify_headers(
    path: str,
    headers: Mapping[str, str],
    *,
    access_key_id: str,
    access_key_secret: str,
    instance: str,
    now: float | None = None,
) -> None:
    """Raise the service's ``OtsError`` unless the headers are signed with the configured keys.

    The server calls it before it reads the body: the signature covers the body's MD5 header,
    not the body, so an unsigned request is refused without its body being read;
    ``verify_body`` then checks the body against that header. ``headers`` must be keyed by
    lower-case names. ``now``: the server's clock (seconds since the epoch; default: this
    moment).
    """
    for name in _REQUIRED_HEADERS:
        if not headers.get(name):
            raise parameter_invalid(f"Missing header: '{name}'.")
    for name, value in headers.items():
        # every x-ots-* value the SDKs send is ASCII (dates, base64, ids, names); http.server
        # hands other bytes over as Latin-1 text, which no signature or name can match
        if name.startswith("x-ots-") and not value.isascii():
            raise parameter_invalid(f"Invalid header '{name}': not ASCII.")
    if headers["x-ots-accesskeyid"] != access_key_id:
        raise auth_failed("The AccessKeyID is disabled or does not exist.")
    instance_name = headers["x-ots-instancename"]
    if instance_name != instance:
        raise OtsError(403, "OTSAuthFailed", f"Instance {instance_name!r} does not exist.")
    date = headers["x-ots-date"]
    when = ots_date_seconds(date)
    if when is None:
        raise parameter_invalid(f"Invalid date format: {date}.")
    now = time.time() if now is None else now
    if abs(now - when) > MAX_CLOCK_SKEW_S:
        raise auth_failed(
            f"Mismatch between system time and x-ots-date: {ots_date(now)[:19]} vs {date}."
        )
    expected = request_signature(path, headers, _signing_key(access_key_secret))
    if not hmac.compare_digest(expected, headers[SIGNATURE_HEADER].strip()):
        raise auth_failed("Signature mismatch.")


def verify_body(headers: Mapping[str, str], body: bytes) -> None:
    """Raise the service's ``OtsError`` unless ``body``'s MD5 is the signed
    ``x-ots-contentmd5`` (after ``verify_headers``, once the body is read)."""
    if headers.get("x-ots-contentmd5") != content_md5(body):
        raise auth_failed(
            "Mismatch between MD5 value of request body and x-ots-contentmd5 in header."
        )


def response_headers(
    path: str,
    body: bytes,
    *,
    request_id: str,
    access_key_id: str,
    access_key_secret: str,
    now: float | None = None,
    corrupt_signature: bool = False,
    body_md5: str | None = None,
) -> dict[str, str]:
    """The signed headers of a response to a POST to ``path``.

    ``now``: the answer's date (seconds since the epoch; default: this moment).
    ``corrupt_signature`` (test switch) flips the signature so the client must reject it.
    ``body_md5``: ``content_md5(body)`` when the caller has it already (a body sent again).
    """
    headers = {
        "x-ots-contentmd5": body_md5 or content_md5(body),
        "x-ots-requestid": request_id,
        "x-ots-contenttype": CONTENT_TYPE,
        "x-ots-date": ots_date(now),
    }
    signature = response_signature(path, headers, _signing_key(access_key_secret))
    if corrupt_signature:
        signature = SigningKey(access_key_secret + "-corrupt").sign(signature)
    headers["authorization"] = f"OTS {access_key_id}:{signature}"
    return headers
