"""Option values nobody would type: every failure is an ``OptionError`` naming the option.

``SourceOptions.from_spark`` takes whatever a job hands Spark. Besides the ordinary mistakes
(tests/test_options.py), a value may hold text no encoder takes (a lone surrogate), a NUL,
JSON nested past Python's recursion limit, a URI ``urlsplit`` cannot read, digits of another
script, a port that is not one. Each class below is tried on every option it applies to: the
error is always ``OptionError`` naming the option (never a raw ``ValueError``,
``RecursionError`` or ``UnicodeEncodeError``), and its message is printable UTF-8 text.
"""

from __future__ import annotations

from typing import Any

import pytest

from connector.errors import OptionError
from connector.options import OPTIONS, SourceOptions

LOCAL = {"endpoint": "local:///data/store.db", "table.name": "orders", "tunnel.name": "t1"}
TABLESTORE = {"endpoint": "https://inst.cn-hangzhou.ots.aliyuncs.com", "table.name": "orders",
              "tunnel.name": "t1", "access.key.id": "AK", "access.key.secret": "SK"}
#: options that only apply to a Tablestore endpoint (others are refused there)
TABLESTORE_ONLY = {"instance.name", "tunnel.id", "access.key.id", "access.key.secret",
                   "security.token", "checkpoint.table", "ssl.ca.bundle", "read.prefetch"}


def refused(options: dict[str, Any]) -> OptionError:
    with pytest.raises(OptionError) as info:
        SourceOptions.from_spark(options)
    message = str(info.value)
    message.encode("utf-8")  # printable: no lone surrogate left in it
    assert message.isprintable(), message
    return info.value


def base_for(option: str) -> dict[str, str]:
    return dict(TABLESTORE if option in TABLESTORE_ONLY else LOCAL)


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("value", ["\ud800", "ok\udfff", "\udc80tail", "a\x00b"], ids=repr)
def test_a_value_that_is_not_text_names_its_option(option: str, value: str) -> None:
    error = refused({**base_for(option), option: value})
    assert error.fields["option"] == option
    assert "lone surrogate" in error.fields["problem"] or "NUL" in error.fields["problem"]


@pytest.mark.parametrize("key", ["\ud800", "max\udcffOffsets", "a\x00", "\u2028"], ids=repr)
def test_an_unknown_key_that_is_not_text_is_named_escaped(key: str) -> None:
    error = refused({**LOCAL, key: "1"})
    assert error.fields["problem"].startswith("unknown option")
    assert error.fields["option"] == repr(key)[1:-1]


@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
@pytest.mark.parametrize("opening", ["[", '{"a":', '{"columns":{"c":{"type":'])
def test_a_catalog_nested_past_the_recursion_limit(depth: int, opening: str) -> None:
    error = refused({**LOCAL, "catalog": opening * depth})
    assert error.fields["option"] == "catalog"


@pytest.mark.parametrize("uri", [
    "sqlite://[::1", "tablestore://[bad/table", "dynamodb://[", "sqlite://h:99999/x.db",
    "dynamodb://t:port?region=x", "meta.db", "", "://", "ftp://x/y", "\\\\server",
])
@pytest.mark.parametrize("base", [LOCAL, TABLESTORE], ids=["local", "tablestore"])
def test_a_meta_store_uri_that_cannot_be_read(uri: str, base: dict[str, str]) -> None:
    error = refused({**base, "meta.store": uri})
    assert error.fields["option"] == "meta.store"


@pytest.mark.parametrize("endpoint", [
    "http://h:99999", "https://h:-1", "http://h:abc", "http://[::1", "http://:80",
    "https://inst.cn-hangzhou.ots.aliyuncs.com:1e3",
])
def test_a_tablestore_endpoint_that_cannot_be_read(endpoint: str) -> None:
    error = refused({**TABLESTORE, "instance.name": "inst", "endpoint": endpoint})
    assert error.fields["option"] == "endpoint"


@pytest.mark.parametrize("option, value", [
    ("startingTimestamp", "١٧٦٧٢٢٥٦٠٠٠٠٠"),  # Arabic-Indic digits: int() would read them
    ("startingTimestamp", "١٢٣"),
    ("maxTriggerDelay", "٥m"),
    ("maxBytesPerTrigger", "٥k"),
    ("maxOffsetsPerChannel", "٥"),
    ("startingTimestamp", "0001-01-01T00:00:00+01:00"),  # before year 1 in UTC
    ("startingTimestamp", "9" * 400),
    ("maxBytesPerTrigger", "9" * 400 + "t"),
])
def test_numbers_only_in_ascii_digits_and_in_range(option: str, value: str) -> None:
    extra = {"minOffsetsPerTrigger": "1"} if option == "maxTriggerDelay" else {}
    error = refused({**LOCAL, **extra, option: value})
    assert error.fields["option"] == option
