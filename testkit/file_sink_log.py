"""What Spark's file sink committed, read from its log (``<out>/_spark_metadata``): the files
each batch's entry lists, in batch order. Files the log does not list are leftovers of killed
or uncommitted attempts. The tests that read it turn compaction off, so every batch keeps its
own entry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq


def committed_rows(log_dir: Path) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(batch id, the rows of one file the batch committed), in batch order."""
    assert not list(log_dir.glob("*.compact")), "the file sink's log was compacted"
    for entry in sorted((p for p in log_dir.iterdir() if p.name.isdigit()),
                        key=lambda p: int(p.name)):
        lines = entry.read_text().splitlines()
        assert lines[0] == "v1"
        for line in lines[1:]:
            record = json.loads(line)
            assert record["action"] == "add"
            path = unquote(urlsplit(record["path"]).path)
            yield int(entry.name), pq.read_table(path).to_pylist()
