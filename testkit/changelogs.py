"""A replicate job's change log read back by the tests: ``OUTPUT/changelog`` holds generic rows
of every selected table (``connector.generic_rows``), typed again here as one table's own
change rows (its key and declared columns, then the change columns), as the apply sees them.
Runs in the test process; pyarrow only, no Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from connector import generic_rows


def changelog_rows(out: Path, table: str) -> list[dict[str, Any]]:
    """``table``'s rows of the change log under the output directory ``out``, typed, in the
    order the files hold them ([] when it has none)."""
    log = pq.read_table(out / "changelog")
    rows = log.filter(pc.equal(log.column("_table"), table))
    if rows.num_rows == 0:
        return []
    changes, _ = generic_rows.decode(rows)
    return changes.to_pylist()
