"""The benchmarks' wire server (``benchmarks.wire_server``) answers as the emulator does: a
signed request is served, a request signed with another secret is refused with the service's
``OTSAuthFailed``, unsigned. Its own process on a small store file, reached by the
connector's Tablestore client (the wire benchmarks' far side was failing every request with a
500 after the emulator's checks were split in two, and no test ran it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.wire_server import WireServerProcess
from connector.errors import CdcError
from connector.local import LocalTablestore
from connector.tunnel.tablestore.client import TablestoreTunnelService
from connector.tunnel.tablestore.transport import Credentials
from connector.tunnel.types import TunnelType
from testkit.emulator import INSTANCE, KEY_ID, SECRET

pytestmark = pytest.mark.slow  # a server process of its own


def test_the_wire_server_serves_a_signed_request_and_refuses_another_secret(
        tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    with LocalTablestore(store) as writer:
        writer.create_table("orders", [("id", "INTEGER")], [("v", "STRING")], channels=2)
    with WireServerProcess(store, tmp_path / "server.log", INSTANCE, KEY_ID, SECRET) as server:
        client = TablestoreTunnelService(server.url, INSTANCE, Credentials(KEY_ID, SECRET),
                                         retry_deadline_s=0)
        try:
            client.create_tunnel("orders", "bench", TunnelType.STREAM)
            described = client.describe_tunnel("orders", "bench")
            assert len(described.channels) == 2
        finally:
            client.close()
        wrong = TablestoreTunnelService(server.url, INSTANCE, Credentials(KEY_ID, "not-it"),
                                        retry_deadline_s=0)
        try:
            with pytest.raises(CdcError, match="OTSAuthFailed"):
                wrong.describe_tunnel("orders", "bench")
        finally:
            wrong.close()
        assert server.stats()["calls"]["/tunnel/describe"] >= 1
    assert "Traceback" not in (tmp_path / "server.log").read_text()
