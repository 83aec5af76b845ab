"""The Tablestore emulator as the tests reach it: the instance and key pair of an in-process
``EmulatorServer`` (the one place the tests take them from; ``SOURCE_OPTIONS`` as reader
options), the tunnel service URI that reaches it with them, and ``EmulatorProcess``,
the emulator as a child process (``tablestore-cdc emulator``) that a test can SIGKILL and
start again on the same port."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Self

from testkit.processes import REPO

#: the ``tablestore-cdc`` command of this environment
CLI = str(Path(sys.executable).with_name("tablestore-cdc"))

INSTANCE = "inst"
KEY_ID = "test-key-id"
SECRET = "test-secret-3f9a1c"
#: the reader options (``option(...)``) that name the instance and give its key pair
SOURCE_OPTIONS = {"instance.name": INSTANCE, "access.key.id": KEY_ID, "access.key.secret": SECRET}


def service_uri(url: str, secret: str = SECRET, **extra: str) -> str:
    query = f"instance={INSTANCE}&access_key_id={KEY_ID}&access_key_secret={secret}"
    for k, v in extra.items():
        query += f"&{k}={v}"
    return f"{url}?{query}"


class EmulatorProcess:
    """``tablestore-cdc emulator`` serving ``store`` in a child process (its log in ``log``):
    SIGKILL-able, and started again on the same port (``port`` is the bound one after the
    first start); https when given a PEM file holding the certificate chain and its key;
    ``channels`` per created table (the command's default unless given)."""

    def __init__(self, store: Path, log: Path, instance: str, key_id: str, secret: str, *,
                 port: int = 0, tls_pem: Path | None = None, channels: int | None = None
                 ) -> None:
        self.store, self.log, self.port, self.tls_pem = store, log, port, tls_pem
        self.instance, self.key_id, self.secret, self.channels = instance, key_id, secret, channels
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> Self:
        tls = ["--tls-cert", str(self.tls_pem), "--tls-key", str(self.tls_pem)] \
            if self.tls_pem else []
        channels = ["--channels", str(self.channels)] if self.channels else []
        self.proc = subprocess.Popen(
            [CLI, "emulator", "--store", str(self.store), "--instance", self.instance,
             "--access-key-id", self.key_id, "--access-key-secret", self.secret,
             "--port", str(self.port), *channels, *tls],
            stdout=subprocess.PIPE, stderr=open(self.log, "ab"), text=True, cwd=REPO)  # noqa: SIM115 - the child owns it
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        scheme = "https" if self.tls_pem else "http"
        if not line.startswith(f"listening on {scheme}://"):
            raise RuntimeError(f"the emulator did not start: {line!r}")
        self.url = line.removeprefix("listening on ")
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def kill(self) -> None:
        """SIGKILL the emulator (a restart later binds the same port)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
