"""``tablestore-cdc emulator``: serve the local Tablestore emulator until SIGINT/SIGTERM.

Mounted by ``tablestore_cdc/cli.py``. Prints exactly one line, ``listening on http://HOST:PORT``
(the real port when ``--port 0``), to stdout once the
socket accepts connections, so a script or test can read the URL. Logs go to stderr.

Example::

    tablestore-cdc emulator --store /tmp/s.db --instance demo \\
        --access-key-id AK --access-key-secret SK --port 0
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from tablestore_cdc.cli_errors import fail, reported_errors


def emulator_command(
    store: Annotated[
        Path, typer.Option("--store", help="SQLite file of the embedded store (created if absent).")
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
) -> None:
    """Serve a local Tablestore emulator (table API and tunnel API)."""
    # imported here: the emulator needs the ``tablestore`` extra, the rest of the CLI does not
    from tablestore_emulator.server import EmulatorServer

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for name in ("tablestore.encoder", "tablestore.decoder"):  # "native codec not available"
        logging.getLogger(name).setLevel(logging.ERROR)
    if not store.parent.is_dir():
        fail(f"--store: directory {store.parent} does not exist")
    if not 0 <= port <= 65535:
        fail(f"--port must be in 0..65535, got {port}")
    if not 1 <= channels <= 1024:
        fail(f"--channels must be in 1..1024, got {channels}")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    with reported_errors():
        server = EmulatorServer(
            str(store), instance, access_key_id, access_key_secret, host, port, channels=channels
        )
        server.start()
    try:
        print(f"listening on {server.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
