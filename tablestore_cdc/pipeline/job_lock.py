"""One job per output directory: a second start of a running ``replicate`` is refused before it
touches anything (driver, the job's own process).

The job holds an exclusive ``flock`` on ``OUTPUT/.replicate.lock`` for its whole life; the
kernel drops it when the process ends, however it ends (kill -9 included), so a crashed job
never locks its restart out. The lock file holds who has it (host, pid, since) for the refusal's
line. A second job on the same source with another output directory is refused by the source's
lease instead (``SourceInUseError``, ``connector.planning.lease``), and so is a second job of an
output in object storage, which has no lock (``preflight``, step 7).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from cdc_common.errors import CdcError

LOCK_NAME = ".replicate.lock"


class JobAlreadyRunningError(CdcError):
    #: the CLI's exit code (``job.JobExit.IN_USE``)
    exit_code = 4
    template = ("a replicate job is already running on {output} (host {host}, pid {pid}, since "
                "{since}): it was left alone; stop it first to start this one")


class JobLock:
    """The exclusive lock of one output directory (module docstring); ``output`` None: an
    output in object storage, which has none (``output.JobOutput``)."""

    def __init__(self, output: Path | None) -> None:
        self.path = output / LOCK_NAME if output is not None else None
        self._file: IO[str] | None = None

    def acquire(self) -> JobLock:
        """Take the lock or raise ``JobAlreadyRunningError`` naming its holder. Creates the
        output directory (and nothing else) if it does not exist."""
        if self.path is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.seek(0)
            holder = lock_holder(lock_file.read())
            lock_file.close()
            raise JobAlreadyRunningError(output=str(self.path.parent), **holder) from None
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                    "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}))
        lock_file.flush()
        self._file = lock_file
        return self

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing drops the flock
            self._file = None

    def __enter__(self) -> JobLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(text: str) -> dict[str, Any]:
    """Who a lock file's ``text`` says holds it (host, pid, since; ``unknown`` where it does
    not say): here and by ``preflight``'s read-only look."""
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    return {key: str(data.get(key, "unknown")) for key in ("host", "pid", "since")}
