"""No secret put into a backend URI survives in any form that is shown or stored (property tests).

A secret goes into each backend's URI the ways a user could put it there: as the URI's user info,
as the value of a query key that names a secret (any key ``cdc_common.uris.SECRET_KEY`` matches,
in any case), inside a URL-valued parameter's user info, and, for a Tablestore endpoint, as the
credential options. Then every form the product shows or stores is checked, from the options
through opening the backend, as the driver goes: the redacted URI, ``safe_endpoint``,
``source_identity`` (the meta-store namespace), ``repr`` of the options and of a partition, the
tunnel client's and the meta store's ``uri`` and ``repr``, and every error message on the way.

Nothing is sent over the network: clients are constructed (the meta stores without
``create_table``) but make no request.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_common.errors import CdcError
from cdc_common.uris import redact_uri
from connector.options import SourceOptions
from connector.reader import ChannelPartition
from connector.tunnel import open_tunnel_service
from meta_store import open_meta_store

SECRET_WORDS = ("secret", "password", "passwd", "token", "credential", "key", "session",
                "signature", "auth")
#: secrets with the characters URIs treat specially (each is percent-encoded into the URI)
SECRETS = st.text(alphabet=string.ascii_letters + string.digits + "-_.~%+/=&:@?#",
                  min_size=6, max_size=24).map(lambda s: "Zq8" + s)
SECRET_KEYS = st.builds(
    lambda prefix, word, suffix, upper: prefix + (word.upper() if upper else word) + suffix,
    st.sampled_from(["", "aws_", "x-", "my_", "access_"]), st.sampled_from(SECRET_WORDS),
    st.sampled_from(["", "_id", "_value", "2", "s"]), st.booleans())
PLACES = ("user info", "secret key", "url value")
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

#: tunnel endpoints: base URI -> a query key whose value may be a URL
TUNNEL_ENDPOINTS = {
    "local:///data/store.db": "region",
    "http://127.0.0.1:8080?instance=inst": "instance",
    "https://myinst.cn-hangzhou.ots.aliyuncs.com": "instance",
    "dynamodb-streams://orders?checkpoint_table=ckpt&region=us-east-1": "endpoint_url",
}
#: meta-store URIs (``{tmp}``: a directory) -> a query key whose value may be a URL
META_URIS = {
    "sqlite://{tmp}/meta.db": "busy_timeout_ms",
    "dynamodb://meta-t?region=us-east-1": "endpoint_url",
    "tablestore://inst/meta?create_table=false": "endpoint",
}


def with_secret(uri: str, place: str, key: str, secret: str, url_key: str) -> str:
    """``uri`` with ``secret`` put in at ``place`` (percent-encoded, as a URI carries it)."""
    encoded = quote(secret, safe="")
    if place == "user info":
        scheme, _, rest = uri.partition("://")
        return f"{scheme}://user:{encoded}@{rest}"
    pair = (f"{key}={encoded}" if place == "secret key"
            else f"{url_key}=http://user:{encoded}@127.0.0.1:5000")
    return uri + ("&" if "?" in uri else "?") + pair


def assert_hidden(secret: str, texts: list[str]) -> None:
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    for text in texts:
        for form in forms:
            assert form not in text, f"{form!r} shown in {text!r}"


def error_texts(exc: BaseException) -> list[str]:
    return [str(exc), repr(exc), repr(exc.args), *(str(v) for v in getattr(exc, "fields",
                                                                              {}).values())]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
                 "ALIBABA_CLOUD_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    yield


def driver_forms(options: dict[str, str], open_backends: bool = True) -> list[str]:
    """Every form the driver shows or stores for these reader options, opening the tunnel and
    the meta store as a query does (errors included), and a partition once both are open.
    (``open_backends=False`` for a meta store that would create its table: that is a request.)"""
    try:
        opts = SourceOptions.from_spark({"table.name": "orders", "tunnel.name": "t1", **options})
    except CdcError as exc:
        return error_texts(exc)
    texts = [opts.safe_endpoint, opts.source_identity, repr(opts), str(opts)]
    if not open_backends:
        return texts
    try:
        tunnel = open_tunnel_service(opts.endpoint)
        meta = open_meta_store(opts.meta_store, opts.meta_store_credentials)
    except CdcError as exc:
        return texts + error_texts(exc)
    texts += [tunnel.uri, repr(tunnel), meta.uri, repr(meta), str(meta)]
    partition = ChannelPartition(
        namespace=opts.source_identity, meta_uri=opts.meta_store, endpoint=opts.endpoint,
        tunnel_id="tid", end_uuid="uuid", channel_id="ch", start_token="tok",
        start_sequence_number=0, start_last_sequence=None, max_records=10,
        stop_after_sequence=None, fail_on_data_loss=True,
        meta_credentials=tuple(sorted((opts.meta_store_credentials or {}).items())))
    tunnel.close()
    meta.close()
    return texts + [repr(partition)]


@PROPERTY
@given(base=st.sampled_from(sorted(TUNNEL_ENDPOINTS)), place=st.sampled_from(PLACES),
       key=SECRET_KEYS, secret=SECRETS)
def test_no_secret_in_a_tunnel_endpoint_is_shown(clean_env: None, tmp_path: Path, base: str,
                                                 place: str, key: str, secret: str) -> None:
    uri = with_secret(base, place, key, secret, TUNNEL_ENDPOINTS[base])
    texts = [redact_uri(uri), redact_uri(uri, known_keys=("region", "instance"))]
    texts += driver_forms({"endpoint": uri, "access.key.id": "AKID", "access.key.secret": "SK1",
                           "meta.store": f"sqlite://{tmp_path}/meta.db"}
                          if base.startswith("http") else
                          {"endpoint": uri, "meta.store": f"sqlite://{tmp_path}/meta.db"})
    try:
        open_tunnel_service(uri).close()  # the URI as given, outside the options (the CLI's way)
    except CdcError as exc:
        texts += error_texts(exc)
    assert_hidden(secret, texts)


@PROPERTY
@given(base=st.sampled_from(sorted(META_URIS)), place=st.sampled_from(PLACES),
       key=SECRET_KEYS, secret=SECRETS)
def test_no_secret_in_a_meta_store_uri_is_shown(clean_env: None, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, base: str,
                                                place: str, key: str, secret: str) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "AKID")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "SK1")
    uri = with_secret(base.format(tmp=tmp_path), place, key, secret, META_URIS[base])
    if base.startswith("tablestore") and place != "url value":
        uri += "&endpoint=http://127.0.0.1:1"
    texts = [redact_uri(uri)]
    try:
        with open_meta_store(uri) as store:
            texts += [store.uri, repr(store), str(store)]
    except CdcError as exc:
        texts += error_texts(exc)
    texts += driver_forms({"endpoint": f"local:///{tmp_path}/none.db", "meta.store": uri})
    assert_hidden(secret, texts)


@PROPERTY
@given(endpoint=st.sampled_from(["http://127.0.0.1:8080?instance=inst",
                                 "https://myinst.cn-hangzhou.ots.aliyuncs.com",
                                 "http://127.0.0.1:8080/path?instance=inst"]),
       key_id=SECRETS, secret=SECRETS, token=SECRETS,
       meta=st.sampled_from([None, "tablestore://myinst/meta?endpoint=http://127.0.0.1:1",
                             "sqlite:///nowhere/meta.db"]),
       misspelt=st.booleans())
def test_tablestore_credential_options_are_never_shown(
    clean_env: None, endpoint: str, key_id: str, secret: str, token: str, meta: str | None,
    misspelt: bool,
) -> None:
    options = {"endpoint": endpoint, "access.key.id": key_id,
               "acess.key.secret" if misspelt else "access.key.secret": secret,
               "security.token": token}
    if meta:
        options["meta.store"] = meta
    # the default meta store (a table in the instance, create_table=true) is checked as a string
    texts = driver_forms(options, open_backends=meta is not None)
    for value in (key_id, secret, token):
        assert_hidden(value, texts)
