"""A current-state table applied idempotently from the change log (a SQLite file).

The change log may deliver a change more than once (a replayed file-source batch after a crash).
The idempotency key (``_channel_id``, ``_sequence``) makes applying safe: the table remembers,
per channel, the highest sequence applied, in the same transaction as the rows, and skips any
change at or below it. Within one micro-batch changes are applied in commit-time order, then by
channel and sequence, so a key's changes in a parent channel precede those in its children.

Used by the main job's second query (``foreachBatch`` on the driver).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from connector.schema import to_json
from tablestore_cdc.sinks import META_COLUMNS
from tablestore_cdc.verify import key_of

SCHEMA = """
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, pk TEXT NOT NULL, attrs TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS applied (channel_id TEXT PRIMARY KEY, max_sequence TEXT NOT NULL);
"""


class StateTable:
    def __init__(self, path: str | Path, key_columns: list[str]) -> None:
        self.path = str(path)
        self.key_columns = key_columns
        with self._connect() as conn:
            conn.executescript(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def apply(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Apply change-log rows (dicts with the output schema); returns how many were new."""
        ordered = sorted(rows, key=lambda r: (r["_commit_ts"], r["_channel_id"], r["_sequence"]))
        applied = 0
        conn = self._connect()
        try:
            with conn:  # one transaction: rows and the applied positions move together
                high = dict(conn.execute("SELECT channel_id, max_sequence FROM applied"))
                for row in ordered:
                    channel, sequence = row["_channel_id"], row["_sequence"]
                    if sequence <= high.get(channel, ""):
                        continue  # already applied: a replay
                    pk = {k: row[k] for k in self.key_columns}
                    key = key_of(pk)
                    if row["_op"] == "DELETE":
                        conn.execute("DELETE FROM state WHERE key = ?", (key,))
                    else:
                        conn.execute("INSERT OR REPLACE INTO state VALUES (?, ?, ?)",
                                     (key, to_json(pk), to_json(self._attributes(row))))
                    high[channel] = sequence
                    applied += 1
                conn.executemany("INSERT OR REPLACE INTO applied VALUES (?, ?)", high.items())
        finally:
            conn.close()
        return applied

    def _attributes(self, row: Mapping[str, Any]) -> dict[str, Any]:
        attrs = {k: v for k, v in row.items()
                 if k not in META_COLUMNS and k not in self.key_columns and v is not None}
        if row.get("_extra"):
            attrs.update(json.loads(row["_extra"]))
        return attrs

    def rows(self) -> dict[str, dict[str, Any]]:
        """key -> attribute columns of every live row (for verification)."""
        conn = self._connect()
        try:
            return {k: json.loads(a) for k, a in conn.execute("SELECT key, attrs FROM state")}
        finally:
            conn.close()

    def __len__(self) -> int:
        conn = self._connect()
        try:
            return int(conn.execute("SELECT count(*) FROM state").fetchone()[0])
        finally:
            conn.close()
