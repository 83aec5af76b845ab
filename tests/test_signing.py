"""The v2 signature scheme's parts both ends use (``connector.tunnel.tablestore.signing``):
the HMAC against the standard library's, the dates against ``datetime``, and the emulator's
clock-skew rule, which the official SDK meets in tests/test_emulator_table_api.py."""

from __future__ import annotations

import base64
import datetime as dt
import hmac
import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connector.tunnel.tablestore import signing
from tablestore_emulator import auth
from tablestore_emulator.errors import OtsError

KEY_ID, SECRET, INSTANCE = "key", "secret", "inst"


@given(secret=st.text(max_size=150), text=st.text(max_size=400))
def test_hmac_is_the_standard_librarys(secret: str, text: str) -> None:
    # keys shorter and longer than SHA-1's 64-byte block (a long key is hashed first)
    expected = hmac.digest(secret.encode(), text.encode(), "sha1")
    assert signing.SigningKey(secret).sign(text) == base64.b64encode(expected).decode()


def test_a_key_signs_again_and_again_and_never_shows() -> None:
    # the keyed states are copied per signature: a second one starts where the first did
    key = signing.SigningKey("secret")
    for text in ("t", "t", "another", "t"):
        expected = base64.b64encode(hmac.digest(b"secret", text.encode(), "sha1")).decode()
        assert key.sign(text) == expected
    assert "secret" not in repr(key)


@given(st.floats(min_value=0, max_value=4_102_444_799.999, allow_nan=False))
def test_date_text_and_its_seconds(now: float) -> None:
    text = signing.ots_date(now)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text)
    whole = dt.datetime.fromtimestamp(int(now), dt.UTC)
    assert text[:19] == whole.strftime("%Y-%m-%dT%H:%M:%S")
    assert int(text[20:23]) == int((now - int(now)) * 1000)
    assert signing.ots_date_seconds(text) == int(now)


def test_date_of_this_moment_moves_with_the_clock() -> None:
    first = signing.ots_date_seconds(signing.ots_date())
    assert first is not None and abs(first - time.time()) < 2
    # the cached second is replaced, not reused, once the clock passes it
    assert signing.ots_date(first + 1.5)[:19] != signing.ots_date(first + 0.5)[:19]


@pytest.mark.parametrize("text", [
    "", "2026-11-27", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-11-27 02:00:00Z",
    "2026-11-27T25:00:00Z", "20２6-11-27T02:00:00Z", "2026-11-27T02:00:0",
    "Fri, 27 Nov 2026 02:00:00 GMT",
])
def test_text_that_is_not_a_date(text: str) -> None:
    assert signing.ots_date_seconds(text) is None


def test_date_with_any_fraction_or_none() -> None:
    # only the text up to the second is read: the Go SDK's fraction is malformed
    seconds = signing.ots_date_seconds("2026-11-27T02:00:00Z")
    assert seconds == int(dt.datetime(2026, 11, 27, 2, tzinfo=dt.UTC).timestamp())
    assert signing.ots_date_seconds(" 2026-11-27T02:00:00.1234567+0800 ") == seconds


def _signed_request(body: bytes, date: str) -> dict[str, str]:
    headers = {"x-ots-date": date, "x-ots-apiversion": "2015-12-31",
               "x-ots-accesskeyid": KEY_ID, "x-ots-instancename": INSTANCE,
               "x-ots-contentmd5": signing.content_md5(body)}
    headers["x-ots-signature"] = signing.request_signature("/ListTable", headers, SECRET)
    return headers


def _verify(headers: dict[str, str], body: bytes, now: float) -> None:
    auth.verify_headers("/ListTable", headers, access_key_id=KEY_ID,
                        access_key_secret=SECRET, instance=INSTANCE, now=now)
    auth.verify_body(headers, body)


@pytest.mark.parametrize(("offset_s", "accepted"), [(0, True), (-899, True), (899, True),
                                                    (-901, False), (901, False)])
def test_emulator_refuses_requests_dated_more_than_15_minutes_off(offset_s: int,
                                                                  accepted: bool) -> None:
    now = 1_800_000_000.5
    body = b"\x08\x01"
    headers = _signed_request(body, signing.ots_date(now + offset_s))
    if accepted:
        _verify(headers, body, now)
        return
    with pytest.raises(OtsError) as info:
        _verify(headers, body, now)
    assert (info.value.http_status, info.value.code) == (403, "OTSAuthFailed")
    assert "x-ots-date" in info.value.message


def test_emulator_refuses_a_request_whose_date_is_not_one() -> None:
    body = b""
    headers = _signed_request(body, "yesterday")
    with pytest.raises(OtsError) as info:
        _verify(headers, body, time.time())
    assert (info.value.http_status, info.value.code) == (400, "OTSParameterInvalid")


def test_emulator_answers_are_signed_as_the_scheme_says() -> None:
    headers = auth.response_headers("/ListTable", b"payload", request_id="r", access_key_id=KEY_ID,
                                    access_key_secret=SECRET, now=1_800_000_000.25)
    assert headers["x-ots-date"] == "2027-01-15T08:00:00.250Z"
    assert headers["x-ots-contentmd5"] == signing.content_md5(b"payload")
    lines = sorted(f"{k}:{v}" for k, v in headers.items() if k.startswith("x-ots-"))
    digest = hmac.digest(SECRET.encode(), ("\n".join(lines) + "\n/ListTable").encode(), "sha1")
    assert headers["authorization"] == f"OTS {KEY_ID}:{base64.b64encode(digest).decode()}"
