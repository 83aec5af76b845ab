"""Tablestore's v2 signatures: checking a request, signing a response.

Called by ``server`` for every POST, table API (``/PutRow`` ...) and tunnel API
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
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Mapping

from tablestore_emulator.errors import OtsError, auth_failed, parameter_invalid

#: How far a request's x-ots-date may be from the server's clock (the service's rule).
MAX_CLOCK_SKEW = dt.timedelta(minutes=15)
#: The value the service sends in x-ots-contenttype.
CONTENT_TYPE = "protocol buffer"
_SIGNATURE_HEADER = "x-ots-signature"
#: headers every request must carry (the SDKs always send them)
_REQUIRED_HEADERS = ("x-ots-date", "x-ots-apiversion", "x-ots-accesskeyid",
                     "x-ots-instancename", "x-ots-contentmd5", _SIGNATURE_HEADER)
_DATE_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})")


def content_md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode("ascii")


def _hmac_sha1(secret: str, text: str) -> str:
    digest = hmac.digest(secret.encode("utf-8"), text.encode("utf-8"), "sha1")
    return base64.b64encode(digest).decode("ascii")


def _ots_lines(headers: Mapping[str, str], skip: str = "") -> list[str]:
    lines = []
    for k, v in headers.items():
        name = k.lower()
        if name.startswith("x-ots-") and name != skip:
            lines.append(f"{name}:{v.strip()}")
    lines.sort()
    return lines


def request_signature(path: str, headers: Mapping[str, str], secret: str) -> str:
    """The v2 signature a client computes for a POST to ``path`` with these headers."""
    text = f"{path}\nPOST\n\n" + "".join(
        line + "\n" for line in _ots_lines(headers, skip=_SIGNATURE_HEADER)
    )
    return _hmac_sha1(secret, text)


def response_signature(path: str, headers: Mapping[str, str], secret: str) -> str:
    """The signature a client expects in a response's ``Authorization`` header."""
    return _hmac_sha1(secret, "\n".join(_ots_lines(headers)) + "\n" + path)


def parse_ots_date(value: str) -> dt.datetime:
    """``x-ots-date`` as an aware UTC datetime; ``OtsError`` when it is not a date."""
    m = _DATE_RE.match(value.strip())
    if not m:
        raise parameter_invalid(f"Invalid date format: {value}.")
    try:
        y, mo, d, h, mi, sec = (int(g) for g in m.groups())
        return dt.datetime(y, mo, d, h, mi, sec, tzinfo=dt.UTC)
    except ValueError:
        raise parameter_invalid(f"Invalid date format: {value}.") from None


def verify_request(
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    access_key_id: str,
    access_key_secret: str,
    instance: str,
    now: dt.datetime | None = None,
) -> None:
    """Raise the service's ``OtsError`` unless the request is signed with the configured keys.

    ``headers`` must be keyed by lower-case names.
    """
    for name in _REQUIRED_HEADERS:
        if not headers.get(name):
            raise parameter_invalid(f"Missing header: '{name}'.")
    if headers["x-ots-accesskeyid"] != access_key_id:
        raise auth_failed("The AccessKeyID is disabled or does not exist.")
    instance_name = headers["x-ots-instancename"]
    if instance_name != instance:
        raise OtsError(403, "OTSAuthFailed", f"Instance {instance_name!r} does not exist.")
    when = parse_ots_date(headers["x-ots-date"])
    now = now or dt.datetime.now(dt.UTC)
    if abs(now - when) > MAX_CLOCK_SKEW:
        raise auth_failed(
            f"Mismatch between system time and x-ots-date: "
            f"{now.strftime('%Y-%m-%dT%H:%M:%S')} vs {headers['x-ots-date']}."
        )
    if headers["x-ots-contentmd5"] != content_md5(body):
        raise auth_failed(
            "Mismatch between MD5 value of request body and x-ots-contentmd5 in header."
        )
    expected = request_signature(path, headers, access_key_secret)
    if not hmac.compare_digest(expected, headers[_SIGNATURE_HEADER].strip()):
        raise auth_failed("Signature mismatch.")


def response_headers(
    path: str,
    body: bytes,
    *,
    request_id: str,
    access_key_id: str,
    access_key_secret: str,
    now: dt.datetime | None = None,
    corrupt_signature: bool = False,
    body_md5: str | None = None,
) -> dict[str, str]:
    """The signed headers of a response to a POST to ``path``.

    ``corrupt_signature`` (test switch) flips the signature so the client must reject it.
    ``body_md5``: ``content_md5(body)`` when the caller has it already (a body sent again).
    """
    now = now or dt.datetime.now(dt.UTC)
    headers = {
        "x-ots-contentmd5": body_md5 or content_md5(body),
        "x-ots-requestid": request_id,
        "x-ots-contenttype": CONTENT_TYPE,
        "x-ots-date": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z",
    }
    signature = response_signature(path, headers, access_key_secret)
    if corrupt_signature:
        signature = _hmac_sha1(access_key_secret + "-corrupt", signature)
    headers["authorization"] = f"OTS {access_key_id}:{signature}"
    return headers
