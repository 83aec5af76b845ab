"""An exactly-once ``foreachBatch`` sink: one Parquet directory per Spark batch id.

The exactly-once sink contract: a batch id already committed is skipped, never rewritten. Each
batch is written to a private temporary directory and renamed into place (atomic on one file
system), so a crash leaves either the whole batch or nothing. When Spark replays a batch whose
directory exists, the sink does not write it again; it compares the replay's idempotency keys
(``_channel_id``, ``_sequence``) with what it stored and appends the result to
``_replays.jsonl``, which the tests and the fault harness check.

Runs on the driver (``foreachBatch`` functions do); the Parquet writes run on executors.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from connector.crash_hook import crash_point
from tablestore_cdc.verify import Delivered, key_of, row_attributes

REPLAY_LOG = "_replays.jsonl"
META_COLUMNS = ("_op", "_channel_id", "_sequence", "_commit_ts", "_before", "_extra")


class ExactlyOnceParquetSink:
    """``query = df.writeStream.foreachBatch(ExactlyOnceParquetSink(path)).start()``"""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def batch_dir(self, batch_id: int) -> Path:
        return self.path / f"batch={batch_id:08d}"

    def __call__(self, df: Any, batch_id: int) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.batch_dir(batch_id)
        if final.exists():
            self._check_replay(df, batch_id, final)
            return
        staging = self.path / f"_staging-{batch_id}-{uuid.uuid4().hex}"
        df.write.parquet(str(staging))
        try:
            os.rename(staging, final)
        except OSError:  # a concurrent attempt won the rename: keep its copy
            shutil.rmtree(staging, ignore_errors=True)
            self._check_replay(df, batch_id, final)
            return
        crash_point("after_sink_write")

    def _check_replay(self, df: Any, batch_id: int, stored_dir: Path) -> None:
        replay = sorted((r["_channel_id"], r["_sequence"])
                        for r in df.select("_channel_id", "_sequence").collect())
        table = pq.read_table(stored_dir, columns=["_channel_id", "_sequence"])
        stored = sorted(zip(table.column("_channel_id").to_pylist(),
                            table.column("_sequence").to_pylist(), strict=True))
        entry = {"batch_id": batch_id, "rows": len(replay), "identical": replay == stored}
        with open(self.path / REPLAY_LOG, "a") as log:
            log.write(json.dumps(entry) + "\n")

    # --- reading back (verification) -----------------------------------------------------

    def committed_batches(self) -> list[int]:
        return sorted(int(p.name.split("=", 1)[1]) for p in self.path.glob("batch=*"))

    def replays(self) -> list[dict[str, Any]]:
        log = self.path / REPLAY_LOG
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line]

    def deliveries(self, key_columns: list[str]) -> Iterator[Delivered]:
        """Every stored change in delivery order: (batch id, channel, sequence)."""
        for batch_id in self.committed_batches():
            table = pq.read_table(self.batch_dir(batch_id))
            yield from deliveries_from_rows(table.to_pylist(), key_columns, (batch_id,))


def deliveries_from_rows(rows: list[dict[str, Any]], key_columns: list[str],
                         position_prefix: tuple[Any, ...] = ()) -> Iterator[Delivered]:
    """Turn output rows (dicts) into ``Delivered`` records for ``tablestore_cdc.verify``."""
    for row in rows:
        attributes = row_attributes(row, key_columns, META_COLUMNS)
        yield Delivered(
            channel_id=row["_channel_id"], sequence=row["_sequence"],
            key=key_of({k: row[k] for k in key_columns}), op=row["_op"],
            position=(*position_prefix, row["_channel_id"], row["_sequence"]),
            after=None if row["_op"] == "DELETE" else attributes,
        )

