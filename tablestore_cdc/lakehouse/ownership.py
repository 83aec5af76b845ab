"""Which job a target table belongs to (driver, called by the Delta and Iceberg sinks before
they write anything to a table that exists).

A table the sink creates carries a **marker** in its table properties (Delta: the table's
``configuration``; Iceberg: the table's properties), written in the table's first commit:

- ``tablestore-cdc.source``: the source's identity, as the caller names it (``replicate``: the
  endpoint without credentials and the table, ``local:///data/shop.db#orders``); empty when the
  sink was not told (a ``foreachBatch`` of the user's own);
- ``tablestore-cdc.job``: the job that writes the table: the streaming query's id (``app_id``),
  which lives in the query's checkpoint, survives restarts, and is new for a new checkpoint;
- ``tablestore-cdc.key-columns``: the key the rows are applied by.

Before the first write of each batch the sink compares the table's marker with its own: a table
with no marker (not created by this sink), or marked by another job (another query, of the same
source or not), or of another source, is refused with ``ForeignTargetError`` and nothing is
written; a table whose key columns differ from the batch's is refused always
(``TargetKeysError``). ``adopt_target=True`` takes a table over on purpose: its keys and their
types are checked, then the marker is rewritten to this job (Delta: a properties-only commit just
before the batch's; Iceberg: in the batch's own commit), and from then on the previous job is
refused. A table written by this very job before markers existed (its commits carry the job's
id: a Delta ``txn`` or an Iceberg snapshot summary) is marked on its next batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from cdc_common.schema_change import type_fits
from tablestore_cdc.lakehouse.errors import ForeignTargetError, TargetKeysError

SOURCE_PROPERTY = "tablestore-cdc.source"
JOB_PROPERTY = "tablestore-cdc.job"
KEYS_PROPERTY = "tablestore-cdc.key-columns"


@dataclass(frozen=True)
class Marker:
    """Who a table belongs to (module doc)."""

    source: str
    job: str
    key_columns: tuple[str, ...]

    def properties(self) -> dict[str, str]:
        return {SOURCE_PROPERTY: self.source, JOB_PROPERTY: self.job,
                KEYS_PROPERTY: ",".join(self.key_columns)}

    @classmethod
    def of(cls, properties: Mapping[str, str]) -> Marker | None:
        """The marker in a table's properties, or None (a table the sink did not create)."""
        if JOB_PROPERTY not in properties:
            return None
        keys = properties.get(KEYS_PROPERTY, "")
        return cls(properties.get(SOURCE_PROPERTY, ""), properties[JOB_PROPERTY],
                   tuple(keys.split(",")) if keys else ())

    def describe(self) -> str:
        return f"job {self.job!r}" + (f" of source {self.source!r}" if self.source else "")


def claim(table: str, properties: Mapping[str, str], schema: pa.Schema, batch_keys: pa.Schema,
          wanted: Marker, adopt: bool, written_by_job: bool) -> bool:
    """Check that ``wanted``'s job may write the existing table (module doc); True when the
    marker must be written first (an adoption, or a table of this job from before markers).

    ``schema``: the table's; ``batch_keys``: the key columns as the batch carries them;
    ``written_by_job``: the table's commits carry ``wanted.job``'s id."""
    found = Marker.of(properties)
    if (found is not None and found.key_columns and wanted.key_columns
            and found.key_columns != wanted.key_columns):
        raise TargetKeysError(table=table, problem=f"its rows are keyed by "
                              f"{list(found.key_columns)}, the changes by "
                              f"{list(wanted.key_columns)}")
    for key in batch_keys:
        if key.name not in schema.names:
            raise TargetKeysError(table=table, problem=f"it has no key column {key.name!r}")
        if not type_fits(key.type, schema.field(key.name).type):
            raise TargetKeysError(table=table, problem=f"its key column {key.name!r} is "
                                  f"{schema.field(key.name).type}, the changes' {key.type}")
    if found is not None and found.job == wanted.job and (
            not found.source or not wanted.source or found.source == wanted.source):
        return False
    if adopt or (found is None and written_by_job):
        return True
    if found is None:
        problem = "it carries no marker of tablestore-cdc (this job did not create it)"
    elif found.job == wanted.job:
        problem = f"it belongs to source {found.source!r}, not {wanted.source!r}"
    elif wanted.source and found.source == wanted.source:
        problem = f"it is written by another query of the same source ({found.describe()})"
    else:
        problem = f"it is written by {found.describe()}"
    raise ForeignTargetError(table=table, problem=problem, job=wanted.job)
