"""The demo's writer: inserts, updates and deletes at a steady rate, with channel splits and a
merge along the way (a thread in the demo's driver process).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector.tunnel.local import LocalTablestore

DEMO_TABLE = "orders"


@dataclass(eq=False)  # a thread must stay hashable
class DemoWriter(threading.Thread):
    """Writes inserts, updates and deletes at a steady rate, splitting two channels and merging
    two adjacent ones along the way. Opens its own store connection (its own thread)."""

    store_path: Path
    changes: int
    duration_s: float
    seed: int
    #: write through the official SDK to this emulator instead of the store file
    emulator: Any = None
    written: int = 0
    splits: int = 0
    merges: int = 0
    error: BaseException | None = None

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name="demo-writer", daemon=True)

    def run(self) -> None:
        try:
            self._write()
        except BaseException as exc:  # surfaced by the job
            self.error = exc

    def _write(self) -> None:
        rng = random.Random(self.seed)
        live: list[int] = []
        next_id = 0
        interval = self.duration_s / max(self.changes, 1)
        started = time.monotonic()
        with LocalTablestore(self.store_path) as store:
            rows: Any = store if self.emulator is None else _SdkRows(self.emulator)
            for i in range(self.changes):
                self._reshape(store, i)
                roll = rng.random()
                if not live or roll < 0.45:
                    next_id += 1
                    live.append(next_id)
                    rows.put_row(DEMO_TABLE, {"order_id": next_id}, {
                        "customer": f"c{rng.randrange(50)}",
                        "amount": round(rng.uniform(1, 500), 2), "status": "new"})
                elif roll < 0.8:
                    rows.update_row(DEMO_TABLE, {"order_id": rng.choice(live)}, {
                        "status": rng.choice(["paid", "shipped", "returned"]),
                        "amount": round(rng.uniform(1, 500), 2)})
                else:
                    rows.delete_row(DEMO_TABLE, {"order_id": live.pop(rng.randrange(len(live)))})
                self.written = i + 1
                # steady pace: sleep off any lead over the schedule
                lead = started + (i + 1) * interval - time.monotonic()
                if lead > 0:
                    time.sleep(lead)

    def _reshape(self, store: LocalTablestore, i: int) -> None:
        """Split at 25% and 50% of the run, merge the first split's children at 75%."""
        if i == self.changes // 4 or i == self.changes // 2:
            open_channels = [c for c in store.list_channels(DEMO_TABLE) if not c.closed]
            store.split_channel(DEMO_TABLE, open_channels[0].channel_id)
            self.splits += 1
        elif i == 3 * self.changes // 4:
            first_split = [c for c in store.list_channels(DEMO_TABLE)
                           if len(c.parent_ids) == 1 and not c.closed]
            ordered = sorted(first_split, key=lambda c: c.range_lo)
            for a, b in zip(ordered, ordered[1:], strict=False):
                if a.range_hi == b.range_lo:
                    store.merge_channels(DEMO_TABLE, a.channel_id, b.channel_id)
                    self.merges += 1
                    return


class _SdkRows:
    """The writer's row calls through the official ``tablestore`` SDK to the emulator."""

    def __init__(self, emulator: Any) -> None:
        from tablestore import Condition, OTSClient, RowExistenceExpectation
        from tablestore.retry import WriteRetryPolicy

        self.client = OTSClient(emulator.url, emulator.access_key_id, emulator.access_key_secret,
                                emulator.instance, retry_policy=WriteRetryPolicy(),
                                logger_name="tablestore-cdc-demo")
        self.ignore = Condition(RowExistenceExpectation.IGNORE)

    def put_row(self, table: str, pk: dict[str, Any], columns: dict[str, Any]) -> None:
        from tablestore import Row

        self.client.put_row(table, Row(list(pk.items()), list(columns.items())), self.ignore)

    def update_row(self, table: str, pk: dict[str, Any], columns: dict[str, Any]) -> None:
        from tablestore import Row

        self.client.update_row(table, Row(list(pk.items()), {"PUT": list(columns.items())}),
                               self.ignore)

    def delete_row(self, table: str, pk: dict[str, Any]) -> None:
        from tablestore import Row

        self.client.delete_row(table, Row(list(pk.items())), self.ignore)
