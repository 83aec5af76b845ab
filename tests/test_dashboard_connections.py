"""The dashboard's server when a browser closes its connection mid-answer: a routine event,
logged at DEBUG without a traceback; the server goes on answering."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import urllib.request
from pathlib import Path

import pytest

from meta_store import open_meta_store
from tablestore_cdc.dashboard import DashboardApp, make_server


def test_a_connection_closed_by_the_browser_logs_no_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path / 'meta.db'}"
    open_meta_store(uri).close()
    app = DashboardApp.open(uri, cache_s=0)
    server = make_server(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    caplog.set_level(logging.DEBUG, logger="tablestore_cdc.dashboard")
    try:
        for _ in range(5):
            # ask for the page and reset the connection at once (SO_LINGER 0: an RST)
            sock = socket.create_connection((str(host), int(port)))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(b"GET /dashboard.js HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.close()
        with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as answer:
            assert answer.read() == b"ok\n"
    finally:
        server.shutdown()
        server.server_close()
        app.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert all(r.levelno <= logging.DEBUG for r in caplog.records
               if r.name == "tablestore_cdc.dashboard")
    assert not any(r.exc_info for r in caplog.records)
