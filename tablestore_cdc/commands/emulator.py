"""``tablestore-cdc emulator``: serve the local Tablestore emulator until SIGINT/SIGTERM.

Mounted by ``tablestore_cdc/commands/app.py``. Prints exactly one line, ``listening on http://HOST:PORT``
(``https://`` with ``--tls-cert`` and ``--tls-key``; the real port when ``--port 0``), to stdout
once the socket accepts connections, so a script or test can read the URL. Logs go to stderr.

Example::

    tablestore-cdc emulator --store /tmp/s.db --instance demo \\
        --access-key-id AK --access-key-secret SK --port 0 \\
        [--tls-cert server.pem --tls-key server.key]
"""

from __future__ import annotations

import logging
import signal
import ssl
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from tablestore_cdc.commands.errors import fail, reported_errors
from tablestore_cdc.commands.local import check_store_file


def emulator_command(
    store: Annotated[
        Path, typer.Option("--store", help="SQLite file of the embedded store (created if "
                           "absent); a file that is not a store is refused.")
    ],
    instance: Annotated[str, typer.Option("--instance", help="Instance name clients must use.")],
    access_key_id: Annotated[
        str, typer.Option("--access-key-id", help="The one access key id accepted.")
    ],
    access_key_secret: Annotated[
        str, typer.Option("--access-key-secret", help="Its secret (signs requests and replies).")
    ],
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 127.0.0.1 unless set.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to bind; 0 picks a free one.")] = 0,
    channels: Annotated[
        int, typer.Option("--channels", help="Change-log channels per created table.")
    ] = 4,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", help="Serve https with this PEM certificate (chain); "
                     "needs --tls-key."),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option("--tls-key", help="The PEM private key of --tls-cert."),
    ] = None,
) -> None:
    """Serve a local Tablestore emulator (table API and tunnel API)."""
    # imported here: the emulator needs the ``tablestore`` extra, the rest of the CLI does not
    try:
        from tablestore_emulator.server import EmulatorServer
    except ImportError as exc:
        fail(f"the emulator needs the Tablestore SDK ({exc}): "
             "pip install 'tablestore-cdc[tablestore]'")

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # (SDK notices: cdc_common)
    if not store.parent.is_dir():
        fail(f"--store: directory {store.parent} does not exist")
    if store.is_dir():
        fail(f"--store: {store} is a directory; give the store's file")
    if store.is_file() and store.stat().st_size:
        # a meta store or another database would get the store's tables written into it
        check_store_file(store)
    if not 0 <= port <= 65535:
        fail(f"--port must be in 0..65535, got {port}")
    if not 1 <= channels <= 1024:
        fail(f"--channels must be in 1..1024, got {channels}")
    if (tls_cert is None) != (tls_key is None):
        fail("--tls-cert and --tls-key go together: give both to serve https, or neither")
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not path.is_file():
            fail(f"{flag}: no file at {path}")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    with reported_errors():
        server = EmulatorServer(
            str(store), instance, access_key_id, access_key_secret, host, port, channels=channels,
            tls_cert=str(tls_cert) if tls_cert else None,
            tls_key=str(tls_key) if tls_key else None,
        )
        try:
            server.start()
        except ssl.SSLError as exc:
            fail(f"--tls-cert/--tls-key: cannot load the certificate and key ({exc.reason or exc}):"
                 " give a PEM certificate and the PEM private key that belongs to it")
    try:
        print(f"listening on {server.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
