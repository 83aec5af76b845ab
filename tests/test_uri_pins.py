"""The shown and stored forms of every backend URI in use, pinned byte for byte.

The meta-store namespaces and checkpoint offsets written before the source identity named the
service (``connector.identity``) are ``SourceOptions.legacy_namespace``, built from the endpoint
with its secrets removed (``safe_endpoint``); the namespace description stores
``safe_endpoint`` too. They are still found by those strings, so a change to how an endpoint is
redacted would orphan every such meta table. The expected strings below were produced by the
code before the redaction was unified (``cdc_common.uris``) and must not change. The identity
of every form (``source_identity``, what new namespaces and offsets carry) is pinned too. The
same holds for the tunnel clients' ``uri`` and the meta stores' ``uri``, which reach logs,
exports and the feed.

Beyond the table of forms, property tests generate every form each backend accepts (parameter
order, percent-encoding, ``scheme:`` without ``//``, ...) and compare the redaction with the
function the namespaces were written with, kept here as the reference.

No request is made: URIs are parsed and clients constructed, nothing is opened over the network.
"""

from __future__ import annotations

import string
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
import trustme
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from connector.errors import OptionError
from connector.options import SourceOptions
from meta_store import open_meta_store

CREDENTIAL_ENV = ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
                  "ALIBABA_CLOUD_SECURITY_TOKEN")
BASE = {"table.name": "orders", "tunnel.name": "t1"}
TS_CREDS = {"access.key.id": "AKID", "access.key.secret": "SK-secret"}
DDB_META = "dynamodb://meta-t?region=us-east-1&endpoint_url=http://127.0.0.1:5000&create_table=true"

#: name -> (source options, safe_endpoint, default or given meta.store)
SOURCES: dict[str, tuple[dict[str, str], str, str]] = {
    "local": (
        {"endpoint": "local:///data/store.db"},
        "local:///data/store.db",
        "sqlite:///data/store.meta.db",
    ),
    "local with a query": (
        {"endpoint": "local:///data/store.db?access_key_secret=hunter2&region=x"},
        "local:///data/store.db?region=x",
        "sqlite:///data/store.meta.db",
    ),
    "local, own meta store": (
        {"endpoint": "local:///data/store.db",
         "meta.store": "sqlite:///data/other.meta.db?busy_timeout_ms=5000"},
        "local:///data/store.db",
        "sqlite:///data/other.meta.db?busy_timeout_ms=5000",
    ),
    "http emulator, instance option": (
        {"endpoint": "http://127.0.0.1:8080", "instance.name": "inst", **TS_CREDS},
        "http://127.0.0.1:8080?instance=inst",
        "tablestore://inst/tablestore_cdc_meta?endpoint=http%3A%2F%2F127.0.0.1%3A8080"
        "&create_table=true",
    ),
    "http emulator, instance in the query": (
        {"endpoint": "http://127.0.0.1:8080?instance=inst", **TS_CREDS},
        "http://127.0.0.1:8080?instance=inst",
        "tablestore://inst/tablestore_cdc_meta?endpoint=http%3A%2F%2F127.0.0.1%3A8080"
        "&create_table=true",
    ),
    "http emulator, credentials in the query": (
        {"endpoint": "http://127.0.0.1:8080?instance=inst&access_key_id=AKID"
                     "&access_key_secret=SK-secret&security_token=STS-tok"},
        "http://127.0.0.1:8080?instance=inst",
        "tablestore://inst/tablestore_cdc_meta?endpoint=http%3A%2F%2F127.0.0.1%3A8080"
        "&create_table=true",
    ),
    "https instance host, STS token": (
        {"endpoint": "https://myinst.cn-hangzhou.ots.aliyuncs.com", **TS_CREDS,
         "security.token": "STS-tok"},
        "https://myinst.cn-hangzhou.ots.aliyuncs.com?instance=myinst",
        "tablestore://myinst/tablestore_cdc_meta?endpoint=https%3A%2F%2Fmyinst.cn-hangzhou.ots"
        ".aliyuncs.com&create_table=true",
    ),
    "https with a trailing slash and checkpoint.table": (
        {"endpoint": "https://myinst.cn-hangzhou.ots.aliyuncs.com/", **TS_CREDS,
         "checkpoint.table": "my_meta"},
        "https://myinst.cn-hangzhou.ots.aliyuncs.com?instance=myinst",
        "tablestore://myinst/my_meta?endpoint=https%3A%2F%2Fmyinst.cn-hangzhou.ots.aliyuncs.com"
        "&create_table=true",
    ),
    "https with a DynamoDB meta store": (
        {"endpoint": "https://myinst.cn-hangzhou.ots.aliyuncs.com", **TS_CREDS,
         "meta.store": "dynamodb://meta-t?region=us-east-1"},
        "https://myinst.cn-hangzhou.ots.aliyuncs.com?instance=myinst",
        "dynamodb://meta-t?region=us-east-1",
    ),
    "dynamodb-streams with a table and endpoint_url": (
        {"endpoint": "dynamodb-streams://orders?checkpoint_table=ckpt&region=us-east-1"
                     "&endpoint_url=http://127.0.0.1:5000", "meta.store": DDB_META},
        "dynamodb-streams://orders?checkpoint_table=ckpt&region=us-east-1"
        "&endpoint_url=http://127.0.0.1:5000",
        DDB_META,
    ),
    "dynamodb-streams, every parameter": (
        {"endpoint": "dynamodb-streams://?checkpoint_table=ckpt&region=us-east-1&create_table=true"
                     "&numbers=decimal&max_attempts=3&retry_mode=adaptive&poll_interval_ms=200"
                     "&profile=dev", "meta.store": "sqlite:///data/m.db"},
        "dynamodb-streams://?checkpoint_table=ckpt&region=us-east-1&create_table=true"
        "&numbers=decimal&max_attempts=3&retry_mode=adaptive&poll_interval_ms=200&profile=dev",
        "sqlite:///data/m.db",
    ),
    "dynamodb-streams, percent-encoded endpoint_url": (
        {"endpoint": "dynamodb-streams://orders?checkpoint_table=ckpt&region=us-east-1"
                     "&endpoint_url=http%3A%2F%2F127.0.0.1%3A5000", "meta.store": "sqlite:///m.db"},
        "dynamodb-streams://orders?checkpoint_table=ckpt&region=us-east-1"
        "&endpoint_url=http%3A%2F%2F127.0.0.1%3A5000",
        "sqlite:///m.db",
    ),
}


#: name (of ``SOURCES``) -> the source identity: the service, not the endpoint's spelling
IDENTITIES: dict[str, str] = {
    "local": "local:/data/store.db#orders#t1",
    "local with a query": "local:/data/store.db#orders#t1",
    "local, own meta store": "local:/data/store.db#orders#t1",
    "http emulator, instance option": "tablestore:inst#orders#t1",
    "http emulator, instance in the query": "tablestore:inst#orders#t1",
    "http emulator, credentials in the query": "tablestore:inst#orders#t1",
    "https instance host, STS token": "tablestore:myinst#orders#t1",
    "https with a trailing slash and checkpoint.table": "tablestore:myinst#orders#t1",
    "https with a DynamoDB meta store": "tablestore:myinst#orders#t1",
    "dynamodb-streams with a table and endpoint_url": "dynamodb-streams:us-east-1/ckpt#orders#t1",
    "dynamodb-streams, every parameter": "dynamodb-streams:us-east-1/ckpt#orders#t1",
    "dynamodb-streams, percent-encoded endpoint_url":
        "dynamodb-streams:us-east-1/ckpt#orders#t1",
}


@pytest.fixture
def no_credential_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*CREDENTIAL_ENV, *CA_BUNDLE_ENV):  # the pins are of URIs written before https
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)


#: where an https endpoint's CA bundle comes from when no option names one (cdc_common.tls)
CA_BUNDLE_ENV = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")


@pytest.mark.parametrize("name", SOURCES)
def test_a_ca_bundle_from_the_environment_leaves_the_namespace_as_pinned(
        no_credential_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        name: str) -> None:
    """A CA bundle says how to reach the service, not which one it is: folded into the URIs
    for executors, never into a shown or stored form."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text(trustme.CA().cert_pem.bytes().decode())
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    options, safe_endpoint, _ = SOURCES[name]
    opts = SourceOptions.from_spark({**BASE, **options})
    assert opts.legacy_namespace == f"{safe_endpoint}#orders#t1"
    assert opts.source_identity == IDENTITIES[name]
    assert "ca_bundle" not in opts.safe_endpoint


@pytest.mark.parametrize("name", SOURCES)
def test_namespace_of_every_source_form_is_pinned(no_credential_env: None, name: str) -> None:
    options, safe_endpoint, meta_store = SOURCES[name]
    opts = SourceOptions.from_spark({**BASE, **options})
    assert opts.safe_endpoint == safe_endpoint
    assert opts.legacy_namespace == f"{safe_endpoint}#orders#t1"
    assert opts.meta_store == meta_store
    assert opts.source_identity == IDENTITIES[name]


@pytest.mark.parametrize("name", [n for n in SOURCES if n.startswith(("http", "https"))])
def test_tablestore_tunnel_client_uri_is_the_safe_endpoint(no_credential_env: None,
                                                           name: str) -> None:
    from connector.tunnel import open_tunnel_service

    options, safe_endpoint, _ = SOURCES[name]
    opts = SourceOptions.from_spark({**BASE, **options})
    with open_tunnel_service(opts.endpoint) as tunnel:
        assert tunnel.uri == safe_endpoint
        assert repr(tunnel) == f"<TablestoreTunnelService {safe_endpoint}>"


@pytest.mark.parametrize("name", [n for n in SOURCES if n.startswith("dynamodb-streams")])
def test_dynamodb_streams_endpoint_uri_is_the_safe_endpoint(no_credential_env: None,
                                                            name: str) -> None:
    """(This client's ``uri`` reaches error messages only. Before the redaction was unified it
    showed a percent-encoded ``endpoint_url`` decoded; it now shows the query as written, the
    same string as the namespace's endpoint.)"""
    from connector.tunnel.dynamodb_streams.aws import parse_uri

    options, safe_endpoint, _ = SOURCES[name]
    assert parse_uri(options["endpoint"]).uri == safe_endpoint


#: meta-store URI (``{tmp}`` for a directory) -> the store's ``uri`` (exports, the feed, logs)
META_STORES: dict[str, str] = {
    "sqlite://{tmp}/meta.db": "sqlite://{tmp}/meta.db",
    "sqlite://{tmp}/meta2.db?lock_retries=5&busy_timeout_ms=2000":
        "sqlite://{tmp}/meta2.db?busy_timeout_ms=2000&lock_retries=5",
    "sqlite://{tmp}/meta3.db?busy_timeout_ms=10000&lock_retries=3": "sqlite://{tmp}/meta3.db",
    "dynamodb://meta-t?region=us-east-1": "dynamodb://meta-t?region=us-east-1",
    "dynamodb://meta-t?region=us-east-1&endpoint_url=http%3A%2F%2F127.0.0.1%3A5000":
        "dynamodb://meta-t?region=us-east-1&endpoint_url=http://127.0.0.1:5000",
    "dynamodb://meta.t_1?endpoint_url=http://127.0.0.1:5000&region=eu-west-1&max_attempts=3"
    "&page_size=100&read_timeout=3.5&connect_timeout=5&retry_mode=adaptive":
        "dynamodb://meta.t_1?region=eu-west-1&endpoint_url=http://127.0.0.1:5000"
        "&retry_mode=adaptive&max_attempts=3&read_timeout=3.5&page_size=100",
    "tablestore://inst/tablestore_cdc_meta?endpoint=https%3A%2F%2Finst.cn-hangzhou.ots"
    ".aliyuncs.com":
        "tablestore://inst/tablestore_cdc_meta?endpoint=https://inst.cn-hangzhou.ots.aliyuncs.com",
    "tablestore://inst/meta?endpoint=http://127.0.0.1:1/&max_attempts=2&socket_timeout=1.5"
    "&page_size=10":
        "tablestore://inst/meta?endpoint=http://127.0.0.1:1&max_attempts=2&socket_timeout=1.5"
        "&page_size=10",
}


@pytest.mark.parametrize("uri", META_STORES)
def test_meta_store_uri_is_pinned(no_credential_env: None, monkeypatch: pytest.MonkeyPatch,
                                  tmp_path: Path, uri: str) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "AKID")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "SK-secret")
    with open_meta_store(uri.format(tmp=tmp_path)) as store:
        expected = META_STORES[uri].format(tmp=tmp_path)
        assert store.uri == expected
        assert repr(store) == f"{type(store).__name__}(uri={expected!r})"


# --- the same bytes for every accepted form, not only the ones above ----------------------------


def strip_secrets_before_unification(uri: str) -> str:
    """``connector.options.strip_secrets`` as it was when every existing namespace was written:
    the reference the one redaction must agree with on every endpoint a backend accepts."""
    parts = urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    secret_words = ("secret", "token", "key", "password")
    query = "&".join(
        kv for kv in parts.query.split("&")
        if kv and not any(word in kv.split("=", 1)[0].lower() for word in secret_words)
    )
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


NAME = st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=12)
STREAMS_VALUES = {
    "region": st.sampled_from(["us-east-1", "eu-west-1"]),
    "endpoint_url": st.sampled_from(["http://127.0.0.1:5000", "https://ddb.local:443/x"]),
    "profile": NAME,
    "create_table": st.sampled_from(["true", "false", "TRUE"]),
    "numbers": st.sampled_from(["double", "decimal"]),
    "max_attempts": st.integers(1, 50).map(str),
    "retry_mode": st.sampled_from(["standard", "adaptive"]),
    "poll_interval_ms": st.integers(0, 60_000).map(str),
}


@st.composite
def streams_endpoints(draw: st.DrawFn) -> str:
    keys = draw(st.lists(st.sampled_from(sorted(STREAMS_VALUES)), unique=True))
    pairs = [("checkpoint_table", draw(NAME))] + [(k, draw(STREAMS_VALUES[k])) for k in keys]
    pairs = draw(st.permutations(pairs))
    encode = draw(st.booleans())
    query = "&".join(f"{k}={quote(v, safe='') if encode else v}" for k, v in pairs)
    head = draw(st.sampled_from(["dynamodb-streams://", "dynamodb-streams:", "dynamodb-streams:/",
                                 "dynamodb-streams:///"]))
    table = draw(st.one_of(st.just(""), NAME)) if head == "dynamodb-streams://" else ""
    return f"{head}{table}?{query}"


@settings(max_examples=200, deadline=None)
@given(endpoint=streams_endpoints())
def test_every_accepted_streams_endpoint_keeps_its_namespace(endpoint: str) -> None:
    from connector.tunnel.dynamodb_streams.aws import parse_uri

    try:
        parse_uri(endpoint)
    except OptionError:
        assume(False)  # a form the backend refuses never had a namespace
    # the identity names the region: without one in the URI it comes from a profile (none
    # exists here) or the environment (not set here), and load() refuses the endpoint
    assume("region=" in endpoint)
    opts = SourceOptions.from_spark({**BASE, "endpoint": endpoint,
                                     "meta.store": "sqlite:///m.db"})
    assert opts.safe_endpoint == strip_secrets_before_unification(endpoint)


@settings(max_examples=200, deadline=None)
@given(path=st.lists(NAME.filter(lambda s: s not in (".", "..")), min_size=1, max_size=4),
       head=st.sampled_from(["local://", "local:"]))
def test_every_accepted_local_endpoint_keeps_its_namespace(path: list[str], head: str) -> None:
    endpoint = f"{head}/{'/'.join(path)}"
    opts = SourceOptions.from_spark({**BASE, "endpoint": endpoint})
    assert opts.safe_endpoint == strip_secrets_before_unification(endpoint)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scheme=st.sampled_from(["http", "https"]),
       host=st.sampled_from(["127.0.0.1:8080", "myinst.cn-hangzhou.ots.aliyuncs.com", "[::1]:9"]),
       slash=st.booleans(), instance_in_query=st.booleans(),
       key_id=NAME, secret=NAME, token=st.one_of(st.none(), NAME))
def test_every_accepted_tablestore_endpoint_keeps_its_namespace(
    no_credential_env: None, scheme: str, host: str, slash: bool, instance_in_query: bool,
    key_id: str, secret: str, token: str | None,
) -> None:
    endpoint = f"{scheme}://{host}{'/' if slash else ''}"
    options = {**BASE, "access.key.id": key_id, "access.key.secret": secret}
    if instance_in_query:
        endpoint += "?instance=inst"
    else:
        options["instance.name"] = "inst"
    if token is not None:
        options["security.token"] = token
    opts = SourceOptions.from_spark({**options, "endpoint": endpoint})
    assert opts.safe_endpoint == strip_secrets_before_unification(opts.endpoint.uri)
