"""https to Tablestore: the emulator serving TLS, both clients verifying it.

A throwaway CA (``trustme``) signs the emulator's certificate for 127.0.0.1. The Tunnel wire
client and the Tablestore meta store (the official SDK) work over https with that CA given as
``ssl.ca.bundle`` (the URIs' ``ca_bundle``) or through ``REQUESTS_CA_BUNDLE`` / ``SSL_CERT_FILE``;
without it, or against a certificate for another host, both refuse at once with one line naming
the endpoint and what to fix -- no retries. The source options fold the bundle's path into the
endpoint and the meta-store URI (executors open their own clients), never into the source
identity.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

trustme = pytest.importorskip("trustme")

from connector.errors import EndpointTlsError, OptionError  # noqa: E402
from connector.local import LocalTablestore  # noqa: E402
from connector.options import SourceOptions  # noqa: E402
from connector.tunnel import open_tunnel_service  # noqa: E402
from connector.tunnel.base import Checkpoint  # noqa: E402
from meta_store import open_meta_store  # noqa: E402
from meta_store.errors import MetaStoreRequestError, MetaStoreUriError  # noqa: E402
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # noqa: E402

CREDS = {"access_key_id": KEY_ID, "access_key_secret": SECRET}


@dataclass
class Tls:
    url: str  # https://127.0.0.1:PORT, certificate for 127.0.0.1
    localhost_only_url: str  # a second server whose certificate names only "localhost"
    ca: Path  # the CA that signed both
    other_ca: Path  # a CA that signed neither
    writer: LocalTablestore


@pytest.fixture
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tls]:
    for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem"))
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "localhost.pem"))
    store = tmp_path / "store.db"
    writer = LocalTablestore(store)
    writer.create_table("t", [("id", "STRING")], [("value", "INTEGER")], channels=1)
    pem = str(tmp_path / "server.pem")
    local = str(tmp_path / "localhost.pem")
    with EmulatorServer(str(store), INSTANCE, KEY_ID, SECRET, tls_cert=pem, tls_key=pem) as a, \
            EmulatorServer(str(store), INSTANCE, KEY_ID, SECRET, tls_cert=local,
                           tls_key=local) as b:
        yield Tls(a.url, b.url, tmp_path / "ca.pem", tmp_path / "other-ca.pem", writer)
    writer.close()


def tunnel_uri(url: str, ca: Path | None = None) -> str:
    uri = f"{url}?instance={INSTANCE}&access_key_id={KEY_ID}&access_key_secret={SECRET}"
    return uri + (f"&ca_bundle={ca}" if ca else "")


def meta_uri(url: str, ca: Path | None = None) -> str:
    uri = f"tablestore://{INSTANCE}/cdc_meta?endpoint={quote(url, safe='')}&create_table=true"
    return uri + (f"&ca_bundle={ca}" if ca else "")


def test_tunnel_client_and_meta_store_work_over_https_with_the_ca(tls: Tls) -> None:
    assert tls.url.startswith("https://127.0.0.1:")
    tls.writer.put_row("t", {"id": "a"}, {"value": 1})
    with open_tunnel_service(tunnel_uri(tls.url, tls.ca)) as client:
        tid = client.create_tunnel("t", "tun").tunnel_id
        (cid,) = [c.channel_id for c in client.describe_tunnel("t", "tun").channels]
        start = client.get_checkpoint(tid, cid).token
        page = client.read_records(tid, cid, start, 10)
        assert [r.primary_key["id"] for r in page.records] == ["a"]
        client.checkpoint(tid, cid, Checkpoint(page.next_token, 1))
    meta = open_meta_store(meta_uri(tls.url, tls.ca), CREDS)
    assert "ca_bundle=" in meta.uri and SECRET not in meta.uri
    assert meta.list_namespaces() == []
    meta.close()


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"])
def test_the_usual_environment_variables_name_the_ca(tls: Tls, variable: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variable, str(tls.ca))
    with open_tunnel_service(tunnel_uri(tls.url)) as client:
        assert client.list_tunnels("t") == []
    meta = open_meta_store(meta_uri(tls.url), CREDS)
    meta.close()


def test_an_untrusted_certificate_is_refused_at_once_in_one_line(tls: Tls) -> None:
    for ca in (None, tls.other_ca):  # the system's trust store; a CA that signed nothing here
        client = open_tunnel_service(tunnel_uri(tls.url, ca))
        began = time.monotonic()
        with pytest.raises(EndpointTlsError) as exc:
            client.list_tunnels("t")
        assert time.monotonic() - began < 2  # a configuration error: not retried for 15 s
        message = str(exc.value)
        assert "\n" not in message and tls.url in message
        assert "not trusted" in message and "ssl.ca.bundle" in message
        assert SECRET not in message
        client.close()
    began = time.monotonic()
    with pytest.raises(MetaStoreRequestError) as meta_exc:
        open_meta_store(meta_uri(tls.url, tls.other_ca), CREDS)
    assert time.monotonic() - began < 5  # the SDK pool's own few quick attempts, no more
    assert "not trusted" in str(meta_exc.value) and "\n" not in str(meta_exc.value)


def test_a_certificate_for_another_host_is_refused_at_once(tls: Tls) -> None:
    client = open_tunnel_service(tunnel_uri(tls.localhost_only_url, tls.ca))
    with pytest.raises(EndpointTlsError) as exc:
        client.list_tunnels("t")
    assert "not valid for this host name" in str(exc.value)
    assert tls.localhost_only_url in str(exc.value)
    client.close()
    with pytest.raises(MetaStoreRequestError, match="not valid for this host name"):
        open_meta_store(meta_uri(tls.localhost_only_url, tls.ca), CREDS)


def test_a_bad_ca_bundle_is_named_before_any_request(tls: Tls, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for bundle, problem in ((tmp_path / "absent.pem", "no file"), (junk, "not a PEM")):
        with pytest.raises(OptionError, match="ssl.ca.bundle") as exc:
            open_tunnel_service(tunnel_uri(tls.url, bundle))
        assert problem in str(exc.value)
        with pytest.raises(MetaStoreUriError, match=problem):
            open_meta_store(meta_uri(tls.url, bundle), CREDS)


def test_the_option_travels_in_the_uris_not_in_the_identity(
    tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark = {"endpoint": tls.url, "instance.name": INSTANCE, "table.name": "t",
             "tunnel.name": "tun", "access.key.id": KEY_ID, "access.key.secret": SECRET}
    plain = SourceOptions.from_spark(spark)
    given = SourceOptions.from_spark({**spark, "ssl.ca.bundle": str(tls.ca)})
    assert f"ca_bundle={quote(str(tls.ca), safe='')}" in given.endpoint.uri
    assert f"ca_bundle={quote(str(tls.ca), safe='')}" in given.meta_store
    assert given.source_identity == plain.source_identity  # moving the file orphans nothing
    assert "ca_bundle" not in plain.endpoint.uri
    with open_tunnel_service(given.endpoint) as client:  # what an executor opens
        assert client.list_tunnels("t") == []
    open_meta_store(given.meta_store, given.meta_store_credentials).close()
    # the driver's environment is folded in like the option (executors may not have it)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca))
    assert "ca_bundle=" in SourceOptions.from_spark(spark).endpoint.uri
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/no/such/ca.pem")
    with pytest.raises(OptionError, match="from REQUESTS_CA_BUNDLE"):
        SourceOptions.from_spark(spark)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    # a meta.store given explicitly over https gets the same CA
    explicit = SourceOptions.from_spark({**spark, "ssl.ca.bundle": str(tls.ca),
                                         "meta.store": meta_uri(tls.url)})
    assert explicit.meta_store.endswith(f"&ca_bundle={quote(str(tls.ca), safe='')}")
    with pytest.raises(OptionError, match="https endpoint only"):
        SourceOptions.from_spark({**spark, "endpoint": "http://127.0.0.1:9",
                                  "ssl.ca.bundle": str(tls.ca)})


def test_emulator_command_wants_both_tls_flags(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tablestore_cdc.commands.app import app

    result = CliRunner().invoke(app, [
        "emulator", "--store", str(tmp_path / "s.db"), "--instance", "i", "--access-key-id",
        "a", "--access-key-secret", "s", "--tls-cert", str(tmp_path / "cert.pem")])
    assert result.exit_code == 2
    assert "--tls-cert and --tls-key go together" in result.output
