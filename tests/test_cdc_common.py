"""The foundation package: URI redaction and query models, the backend registry, credentials."""

from __future__ import annotations

import pickle
from typing import ClassVar, Literal

import pytest
from pydantic import Field

from cdc_common.aws_errors import is_transient
from cdc_common.credentials import ALIBABA_ENV, alibaba_credentials
from cdc_common.errors import CdcError
from cdc_common.registry import INCLUDED, Backend, BackendRegistry
from cdc_common.uris import (
    HttpEndpoint,
    HttpOrigin,
    UriBool,
    UriQuery,
    has_user_info,
    is_secret_key,
    parse_query,
    redact_uri,
)

# --- redaction ------------------------------------------------------------------------------


@pytest.mark.parametrize("uri, shown", [
    ("local:///abs/store.db", "local:///abs/store.db"),
    ("local:/abs/store.db", "local:///abs/store.db"),  # as it has always been shown
    ("sqlite:relative/meta.db", "sqlite:relative/meta.db"),
    ("meta.db", "meta.db"),
    ("dynamodb://", "dynamodb://"),
    ("dynamodb-streams:?checkpoint_table=c", "dynamodb-streams://?checkpoint_table=c"),
    ("dynamodb-streams://?checkpoint_table=c", "dynamodb-streams://?checkpoint_table=c"),
    ("https://AK:pw@host:1/p?a=1#frag", "https://host:1/p?a=1"),
    ("x://h?Access%5FKey=s&b=%41&c", "x://h?b=%41&c"),  # keys are decoded before the rule
    ("x://h?url=http%3A%2F%2Fu%3Apw%40h", "x://h?url=***"),
    ("x://h?profile=me@corp", "x://h?profile=me@corp"),  # no URL: not user info
    ("x://[::1?a=1", "x://<unparseable URI>"),
])
def test_redact_uri(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


def test_redact_uri_hides_the_values_of_keys_a_backend_does_not_know() -> None:
    uri = "dynamodb://t?region=us-east-1&colour=blue&session_id=s"
    assert redact_uri(uri, known_keys={"region"}) == "dynamodb://t?region=us-east-1&colour=***"


@pytest.mark.parametrize("key, secret", [
    ("access_key_secret", True), ("SecurityToken", True), ("PASSWD", True), ("x-auth", True),
    ("aws_session_token", True), ("signature", True), ("credentials", True), ("key", True),
    ("region", False), ("endpoint_url", False), ("checkpoint_table", False),
    ("retry_deadline_s", False), ("instance", False), ("busy_timeout_ms", False),
])
def test_one_rule_for_secret_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_user_info_is_any_at_sign_after_the_scheme() -> None:
    assert has_user_info("http://u:p@h") and has_user_info("http://u:p/q@h")
    assert not has_user_info("me@corp") and not has_user_info("http://host:1/path")


# --- query models ---------------------------------------------------------------------------


class DemoQuery(UriQuery):
    credentials_hint: ClassVar[str] = "use the demo chain"

    endpoint: HttpOrigin = Field(description="http(s)://host[:port]")
    url: HttpEndpoint | None = None
    create_table: UriBool = False
    mode: Literal["fast", "safe"] = Field("safe", description="fast or safe")
    attempts: int = Field(3, ge=1, le=9, description="an integer from 1 to 9")


class DemoError(CdcError, ValueError):
    template = "demo URI: {reason}"


def parse(query: str) -> DemoQuery:
    return parse_query(query, DemoQuery, lambda reason: DemoError(reason=reason))


def test_a_valid_query_becomes_the_model() -> None:
    q = parse("endpoint=http://127.0.0.1:1&create_table=TRUE&mode=fast&attempts=9"
              "&url=https%3A%2F%2Fh%2Fp")
    assert (q.endpoint, q.create_table, q.mode, q.attempts) == ("http://127.0.0.1:1", True,
                                                                 "fast", 9)
    assert q.url == "https://h/p"
    assert parse("endpoint=http://h/").attempts == 3


@pytest.mark.parametrize("query, message", [
    ("endpoint=http://h&atempts=2", "unknown parameter 'atempts'; did you mean 'attempts'? "
     "allowed: endpoint, url, create_table, mode, attempts"),
    ("endpoint=http://h&zzz=1", "unknown parameter 'zzz'; allowed: endpoint"),
    ("endpoint=http://h&api_key=XYZ", "parameter 'api_key' looks like a credential; credentials "
     "are not accepted in the URI (it is shown in logs and Spark plans); use the demo chain"),
    ("endpoint=http://h&mode=fast&mode=safe", "parameter 'mode' given twice"),
    ("endpoint=http://h&mode=", "parameter 'mode' is empty"),
    ("mode=fast", "parameter 'endpoint' is required: http(s)://host[:port]"),
    ("endpoint=http://h&attempts=10", "attempts must be an integer from 1 to 9, got '10'"),
    ("endpoint=http://h&attempts=two", "attempts must be an integer from 1 to 9, got 'two'"),
    ("endpoint=http://h&mode=slow", "mode must be fast or safe, got 'slow'"),
    ("endpoint=http://h&create_table=yes", "create_table must be true or false, got 'yes'"),
    ("endpoint=ftp://h", "endpoint must be http(s)://host[:port] with no path or query, "
     "got 'ftp://h'"),
    ("endpoint=http://h/p", "endpoint must be http(s)://host[:port] with no path or query"),
    ("endpoint=http://u:XYZ@h", "endpoint must not carry user info: credentials are not "
     "accepted in the URI, got '***'"),
    ("endpoint=http://h&url=http://u:XYZ@h/p", "url must not carry user info"),
])
def test_a_bad_query_is_the_backends_error(query: str, message: str) -> None:
    with pytest.raises(DemoError) as info:
        parse(query)
    assert message in str(info.value) and "XYZ" not in str(info.value)
    assert pickle.loads(pickle.dumps(info.value)).reason == info.value.reason


# --- registry -------------------------------------------------------------------------------


class RegistryError(CdcError):
    template = "{uri}: {problem} ({allowed})"


REGISTRY = BackendRegistry(
    {"sqlite": Backend("meta_store.sqlite:SqliteMetaStore"),
     "gone": Backend("no_such_package.backend:Thing", "pip install 'tablestore-cdc[gone]'")},
    refuse=lambda uri, problem, allowed: RegistryError(uri=uri, problem=problem, allowed=allowed),
)


def test_registry_imports_the_backend_of_a_scheme() -> None:
    from meta_store.sqlite import SqliteMetaStore

    assert REGISTRY.load("sqlite:///x.db") is SqliteMetaStore
    assert sorted(REGISTRY) == ["gone", "sqlite"] and REGISTRY["sqlite"].install == INCLUDED


def test_registry_names_the_install_line_of_a_backend_whose_module_is_missing() -> None:
    with pytest.raises(RegistryError) as info:
        REGISTRY.load("gone://user:pw@host?token=t")
    assert str(info.value) == ("gone://host: backend unavailable (No module named "
                               "'no_such_package') (pip install 'tablestore-cdc[gone]')")
    assert isinstance(info.value.__cause__, ImportError)


def test_registry_refuses_an_unknown_scheme_naming_the_known_ones() -> None:
    with pytest.raises(RegistryError, match=r"^ftp://h: unsupported scheme 'ftp' "
                       r"\(gone://\.\.\., sqlite://\.\.\.\)$"):
        REGISTRY.load("ftp://h?password=pw")


# --- credentials and AWS codes --------------------------------------------------------------


def test_alibaba_credentials_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ALIBABA_ENV:
        monkeypatch.delenv(name, raising=False)
    assert not alibaba_credentials().complete
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "env-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "env-secret")
    monkeypatch.setenv("ALIBABA_CLOUD_SECURITY_TOKEN", "")
    creds = alibaba_credentials(access_key_secret="given-secret")
    assert (creds.access_key_id, creds.access_key_secret, creds.security_token) == (
        "env-id", "given-secret", None)
    assert creds.complete and "given-secret" not in repr(creds)


def test_aws_codes_worth_retrying() -> None:
    assert is_transient("ThrottlingException", 400) and is_transient("", 503)
    assert not is_transient("AccessDeniedException", 400)
