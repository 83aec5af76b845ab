"""One table on each backend, for tests that run the same steps on all of them: the embedded
store, the same store over the emulator's wire, DynamoDB Streams on moto (``StreamsHarness``).

A ``Backend`` writes rows, splits a channel and gives the reader options of a query on its table;
``instant_between`` takes an instant with writes on both sides of it (``startingTimestamp``, a
range read's bounds).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from connector.local import LocalTablestore
from connector.options import SourceOptions
from tablestore_emulator.server import EmulatorServer
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.tunnel_harnesses import StreamsHarness


class Backend(ABC):
    """A table with one INTEGER/STRING key ``id`` on one backend: writes, a split, the
    options of a query reading it, the keys of its change log with their commit times."""

    #: how long to wait around the instant so the backend's commit times fall on either side
    settle_s = 0.01

    @abstractmethod
    def write(self, ids: range) -> None: ...

    @abstractmethod
    def split(self) -> None: ...

    @abstractmethod
    def options(self, **extra: str) -> SourceOptions: ...

    @abstractmethod
    def close(self) -> None: ...


class LocalBackend(Backend):
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.writer = LocalTablestore(tmp_path / "store.db")
        self.writer.create_table("t", primary_key=[("id", "INTEGER")],
                                 columns=[("v", "INTEGER")], channels=2)

    def write(self, ids: range) -> None:
        for i in ids:
            self.writer.put_row("t", {"id": i}, {"v": i})

    def split(self) -> None:
        open_channels = [c.channel_id for c in self.writer.list_channels("t") if not c.closed]
        self.writer.split_channel("t", sorted(open_channels)[0])

    def options(self, **extra: str) -> SourceOptions:
        return SourceOptions.from_spark({"endpoint": f"local://{self.writer.path}",
                                         "table.name": "t", "tunnel.name": "q", **extra})

    def close(self) -> None:
        self.writer.close()


class WireBackend(LocalBackend):
    """The same store served by the emulator: the query reads over HTTP."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.emulator = EmulatorServer(str(self.writer.path), INSTANCE, KEY_ID, SECRET).start()

    def options(self, **extra: str) -> SourceOptions:
        return SourceOptions.from_spark({
            "endpoint": self.emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
            "access.key.secret": SECRET, "table.name": "t", "tunnel.name": "q",
            "meta.store": f"sqlite://{self.tmp_path}/meta.db", **extra})

    def close(self) -> None:
        self.emulator.stop()
        super().close()


class DynamoBackend(Backend):
    """A DynamoDB table on moto with the shard map of ``StreamsFake``."""

    settle_s = 1.1  # ApproximateCreationDateTime is rounded down to the second

    def __init__(self, tmp_path: Path, url: str, fake: Any) -> None:
        self.tmp_path = tmp_path
        self.harness = StreamsHarness(url, fake)
        self.harness.create_table("t", 2)

    def write(self, ids: range) -> None:
        for i in ids:
            self.harness.put("t", str(i), i)

    def split(self) -> None:
        self.harness.split("t", sorted(self.harness.fake.open_shards("t"))[0])

    def options(self, **extra: str) -> SourceOptions:
        return SourceOptions.from_spark({
            "endpoint": self.harness.uri, "table.name": "t", "tunnel.name": "q",
            "meta.store": f"sqlite://{self.tmp_path}/meta.db", **extra})

    def close(self) -> None:
        self.harness.close()


def instant_between(backend: Backend, before: range, after: range) -> int:
    """Write ``before``, take the instant (ms since the epoch), write ``after``."""
    backend.write(before)
    time.sleep(backend.settle_s)
    instant = int(time.time() * 1000)
    time.sleep(backend.settle_s)
    backend.write(after)
    return instant


#: the ``backend`` fixture's parameters (``open_backend``)
BACKEND_KINDS = ["local", "wire", "dynamodb"]


def open_backend(kind: str, tmp_path: Path, request: Any) -> Backend:
    """The backend of a test's ``backend`` fixture parametrized over ``BACKEND_KINDS``: the
    DynamoDB one takes the ``moto_url`` and ``streams_fake`` fixtures from ``request``."""
    if kind == "local":
        return LocalBackend(tmp_path)
    if kind == "wire":
        return WireBackend(tmp_path)
    return DynamoBackend(tmp_path, request.getfixturevalue("moto_url"),
                         request.getfixturevalue("streams_fake"))
