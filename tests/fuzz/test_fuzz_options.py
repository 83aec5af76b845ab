"""Fuzz target: option maps into ``SourceOptions.from_spark``.

Input: an option map as a job could hand it to Spark: each known option (in any key case)
with a value that is right, nearly right (a URI with a broken host, port or query, a catalog
with the wrong shape or nested deep, numbers with units, other scripts' digits, timestamps of
every form) or any text at all -- lone surrogates and NUL included -- over each kind of
endpoint, plus now and then an unknown key.

Property: a ``SourceOptions``, or an ``OptionError`` naming an option of the map (its message
printable, UTF-8 encodable text). Never another error. (Validation makes no request: a
``tunnel.id`` is looked up when the query binds, ``SourceOptions.resolved``.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from connector.errors import OptionError
from connector.option_input import shown_key
from connector.options import OPTIONS, SourceOptions
from testkit.fuzzing import fuzz_settings, mostly

pytestmark = pytest.mark.fuzz

ANY_TEXT = st.text(max_size=12) | st.text(st.characters(categories=["Cs", "Nd", "Zs", "Cc"]),
                                          max_size=6)
HOSTS = st.sampled_from(["inst.cn-hangzhou.ots.aliyuncs.com", "127.0.0.1", "[::1]", "[::1",
                         "h:99999", "h:abc", "", "h\u00e9", "user:pw@h", "h:-1", "a" * 300])
QUERIES = st.sampled_from(["", "?instance=i", "?instance=", "?region=x&checkpoint_table=t",
                           "?ca_bundle=/nope", "?prefetch=maybe", "?a=1&a=2", "?%ff=1", "#frag"])
GOOD_ENDPOINTS = st.sampled_from([
    "local:///data/store.db", "https://inst.cn-hangzhou.ots.aliyuncs.com",
    "http://127.0.0.1:8080?instance=dev", "dynamodb-streams://?region=us-east-1&checkpoint_table=t",
])
ENDPOINTS = mostly(GOOD_ENDPOINTS, st.one_of(
    st.sampled_from(["local://host/x", "local:relative.db", "127.0.0.1:80", "htp://x", "local:",
                     ""]),
    st.builds(lambda scheme, host, query: f"{scheme}://{host}{query}",
              st.sampled_from(["http", "https", "dynamodb-streams", "local", "sqlite"]),
              HOSTS, QUERIES),
), one_in=3)
META_STORES = st.one_of(
    st.builds(lambda scheme, rest: f"{scheme}{rest}",
              st.sampled_from(["sqlite://", "dynamodb://", "tablestore://", "ftp://", ""]),
              st.sampled_from(["/abs/meta.db", "[::1", "t?region=x", "inst/table?endpoint=http"
                               "://h:1", "h:99999/x", "", "%zz", "t\ud800"])),
)
CATALOGS = st.one_of(
    st.just('{"columns": {"price": {"type": "double"}, "name": {"type": "string"}}}'),
    st.builds(lambda opening, n: opening * n, st.sampled_from(["[", '{"a":', '{"columns":']),
              st.sampled_from([10, 1_000, 100_000])),
    st.builds(json.dumps, st.recursive(st.none() | st.text(max_size=4) | st.integers(),
                                       lambda inner: st.lists(inner, max_size=3)
                                       | st.dictionaries(st.text(max_size=4), inner,
                                                         max_size=3), max_leaves=6)),
)
NUMBERS = st.one_of(st.integers(-2**70, 2**70).map(str), st.sampled_from(
    ["1", "0", "10k", "5m", "1h", "15m", "500ms", "1e3", "٣", "1_000", " 7 ", "9" * 40, "1g",
     "2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "0001-01-01T00:00:00+01:00",
     "9999-12-31T23:59:59-01:00", "true", "FALSE", "earliest", "Latest", "BaseAndStream"]))

#: per option, the values worth trying besides any text
VALUES: dict[str, Any] = {
    "endpoint": ENDPOINTS, "meta.store": META_STORES, "catalog": CATALOGS,
    "ssl.ca.bundle": st.sampled_from(["/nonexistent.pem", "/etc/hostname", "", "/"]),
}


@st.composite
def option_maps(draw: Any) -> dict[str, str]:
    chosen = draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=5, unique=True))
    endpoint = draw(ENDPOINTS)
    out = {"endpoint": endpoint, "table.name": "orders", "tunnel.name": "t1"}
    if endpoint.startswith("http") and draw(mostly(st.just(True), st.just(False))):
        out.update({"access.key.id": "AK", "access.key.secret": "SK"})
    if endpoint.startswith("dynamodb") and draw(mostly(st.just(True), st.just(False))):
        out["meta.store"] = "dynamodb://meta?region=us-east-1"
    for option in chosen:
        usual = VALUES.get(option, NUMBERS)
        key = option if draw(st.booleans()) else option.lower()
        out[key] = draw(mostly(usual, ANY_TEXT, one_in=4))
    if draw(mostly(st.just(False), st.just(True), one_in=20)):
        out[draw(ANY_TEXT)] = draw(ANY_TEXT)
    return out


@fuzz_settings()
@given(option_maps())
def test_fuzz_options_validate_or_raise_an_option_error(options: dict[str, str]) -> None:
    try:
        built = SourceOptions.from_spark(options)
    except OptionError as exc:
        message = str(exc)
        message.encode("utf-8")
        given_names = {OPTIONS.get(k) and k for k in options} | {shown_key(k) for k in options}
        named = exc.fields["option"]
        assert named in OPTIONS or named in given_names or named == "path", (named, options)
        event(f"refused: {named if named in OPTIONS else 'an unknown key'}")
    else:
        assert built.endpoint and built.meta_store
        event("accepted")
