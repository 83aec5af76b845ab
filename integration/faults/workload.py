"""The writer of a fault scenario: changes, channel splits and merges while the query runs.

Runs as a thread in the harness process (never in the Spark process tree, so it keeps writing
through every kill), on its own ``LocalTablestore`` connection to the scenario's store file.
Every ``tick_s`` it writes a few inserts/updates/deletes over a small key space (so keys see
many changes and the per-key order check has teeth), some of them grouped in one atomic
``batch_write``; every ``reshape_every_s`` it splits a channel or merges two adjacent ones,
alternating, so parents and children are read across kills and restarts.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from connector.local import LocalTablestore

TABLE = "t"
KEY_COLUMNS = ["id"]
#: keys of ``preload``'s rows start here, above every key the ``Writer`` writes
PRELOAD_KEYS_FROM = 1_000_000


def create_table(path: Path, channels: int) -> None:
    """A fresh store with the scenario table cut into ``channels`` channels."""
    store = LocalTablestore(path)
    try:
        store.create_table(TABLE, primary_key=[("id", "INTEGER")],
                           columns=[("name", "STRING"), ("qty", "INTEGER")], channels=channels)
    finally:
        store.close()


def preload(path: Path, rows: int) -> None:
    """``rows`` PUTs of keys above the writer's key space (from ``PRELOAD_KEYS_FROM``), in
    atomic groups of 100, before the query starts."""
    store = LocalTablestore(path, create=False)
    try:
        for start in range(0, rows, 100):
            store.batch_write(TABLE, [
                ("put", {"id": PRELOAD_KEYS_FROM + i}, {"name": f"p{i}", "qty": i})
                for i in range(start, min(rows, start + 100))])
    finally:
        store.close()


class Writer(threading.Thread):
    """Writes ~``rate`` changes per second until ``finish()``; splits and merges channels."""

    def __init__(self, store_path: Path, seed: str, rate: float = 30.0, keys: int = 200,
                 reshape_every_s: float = 7.0, min_channels: int = 2,
                 max_channels: int = 6, tick_s: float = 0.1) -> None:
        super().__init__(name="fault-writer", daemon=True)
        self.store_path = store_path
        self.rng = random.Random(f"writer:{seed}")
        self.rate = rate
        self.keys = keys
        self.reshape_every_s = reshape_every_s
        self.min_channels = min_channels
        self.max_channels = max_channels
        self.tick_s = tick_s
        self.changes = 0
        self.splits = 0
        self.merges = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._counter = 0
        self._store: LocalTablestore | None = None

    # --- thread ----------------------------------------------------------------------------

    def run(self) -> None:
        self._store = LocalTablestore(self.store_path, create=False)
        next_reshape = time.monotonic() + self.reshape_every_s * self.rng.uniform(0.3, 0.8)
        try:
            while not self._halt.is_set():
                burst = self.rate * self.tick_s * self.rng.uniform(0.5, 1.5)
                self._write_some(max(1, round(burst)))
                if time.monotonic() >= next_reshape:
                    self.reshape()
                    next_reshape = time.monotonic() + self.reshape_every_s
                self._halt.wait(self.tick_s)
        except BaseException as exc:  # reported by the harness as a scenario failure
            self.error = exc

    def finish(self) -> None:
        """Stop writing; make sure the run had at least one split and one merge (each followed
        by writes to the children) before returning."""
        self._halt.set()
        self.join(timeout=60)
        if self.error is not None:
            raise RuntimeError(f"the writer failed: {self.error!r}") from self.error
        assert self._store is not None
        try:
            while self.splits == 0 or self.merges == 0:
                self.reshape(split=self.splits == 0)
                self._write_some(40)
        finally:
            self._store.close()

    # --- writes --------------------------------------------------------------------------------

    def _write_some(self, n: int) -> None:
        assert self._store is not None
        ops: list[tuple[str, dict[str, int], dict[str, object] | None]] = []
        for _ in range(n):
            self._counter += 1
            i = self._counter
            key = {"id": self.rng.randrange(self.keys)}
            roll = self.rng.random()
            if roll < 0.2:
                ops.append(("delete", key, None))
            elif roll < 0.5:
                ops.append(("update", key, {"qty": i}))
            else:
                ops.append(("put", key, {"name": f"n{i}", "qty": i}))
        while ops:  # groups of 1-3 changes in one atomic write
            size = self.rng.randint(1, 3)
            group, ops = ops[:size], ops[size:]
            self._store.batch_write(TABLE, group)
            self.changes += len(group)

    def reshape(self, split: bool | None = None) -> None:
        """Split one open channel or merge two adjacent ones (alternating by default)."""
        assert self._store is not None
        open_channels = sorted((c for c in self._store.list_channels(TABLE) if not c.closed),
                               key=lambda c: c.range_lo)
        if split is None:
            split = self.splits <= self.merges
            if len(open_channels) <= self.min_channels:
                split = True
            elif len(open_channels) >= self.max_channels:
                split = False
        if split:
            candidates = [c for c in open_channels if c.range_hi - c.range_lo >= 2]
            self._store.split_channel(TABLE, self.rng.choice(candidates).channel_id)
            self.splits += 1
        else:
            i = self.rng.randrange(len(open_channels) - 1)
            self._store.merge_channels(TABLE, open_channels[i].channel_id,
                                       open_channels[i + 1].channel_id)
            self.merges += 1
