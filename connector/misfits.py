"""Values that do not fit their output column, placed by the query's ``schema.change.behavior``
(executors, inside ``read()``, after the batch's end is claimed).

Tablestore attributes (and DynamoDB's) have no declared type, while a query's output columns do
(the ``catalog`` option, a ``.schema(...)``). A page never fails on a value: one that does not fit
its column (``connector.tunnel.column_values``) is null in the column and kept in the row's
``_extra`` JSON with its own type, beside the undeclared values. A key of ``_extra`` that is
also an output column is therefore such a value, and ``MisfitPolicy.apply`` finds those keys
per page batch -- one vectorised regular-expression scan of ``_extra`` for every output
column's JSON key, JSON parsed only for the rows that match -- and applies the policy
(``cdc_common.schema_change``):

- ``lenient`` (default), ``try_evolve``: the value stays in ``_extra``; counted, and one warning
  per column per read task;
- ``exception``, ``evolve`` (the output's columns cannot change in a running query):
  ``SchemaChangeError`` naming the table, the column, the change, both types and the value;
- ``ignore``: the value is taken out of ``_extra``; counted, one warning per column.

A key column's value that does not fit fails under every policy (a key is never null), and so
does ``lenient`` when the output has no ``_extra`` column to keep the value in. Because this
runs after ``connector.reader.claim_and_read`` recorded the batch's end, a failed batch replays
exactly after a restart with another policy or schema.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_common.schema_change import IGNORE, keeps_misfits, tablestore_kind
from connector.errors import SchemaChangeError
from connector.tunnel.page import ENCODE_JSON, json_value

log = logging.getLogger("connector.schema")

_REMEDY = ("choose schema.change.behavior=lenient to keep such values in _extra with their own "
           "type (the default), or ignore to drop them; or read the column with a type that "
           "holds them")
_NO_EXTRA = ("the output has no _extra column to keep the value in: add '_extra string' to the "
             "schema, or choose schema.change.behavior=ignore to drop such values")
_KEY = "a key column holds only values of its type: check the catalog or schema that types it"


class MisfitPolicy:
    """One read task's policy for values that do not fit their column (module docstring).

    ``columns``: the output's value columns with their Spark type names (``bigint``, ...);
    ``keys``: the key columns among them; ``keeps_extra``: whether the output has ``_extra``.
    ``kept`` and ``dropped`` count the values per column over the task's batches."""

    def __init__(self, policy: str, table: str, columns: dict[str, str], keys: Iterable[str],
                 keeps_extra: bool) -> None:
        self.policy, self.table, self.columns = policy, table, columns
        self.keys = frozenset(keys)
        self.keeps_extra = keeps_extra
        #: any column's key as ``_extra``'s canonical JSON writes it (one scan for all)
        self._pattern = "|".join(_literal(ENCODE_JSON(name) + ":") for name in columns)
        self.kept: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def apply(self, page: pa.RecordBatch, channel_id: str | pa.Array) -> pa.RecordBatch:
        """``page`` with its misfit values placed by the policy (rewritten only under
        ``ignore``); ``SchemaChangeError`` where the policy refuses one."""
        extra = page.column("_extra")
        if extra.null_count == len(extra) or not self._pattern:
            return page
        found = self._find(extra)
        if not found:
            return page
        for row, _values, misfit in found:
            for name, value in misfit.items():
                if name in self.keys:
                    self._refuse(page, channel_id, row, name, value, _KEY)
                if self.policy == IGNORE:
                    continue
                if not keeps_misfits(self.policy):
                    self._refuse(page, channel_id, row, name, value, _REMEDY)
                if not self.keeps_extra:
                    self._refuse(page, channel_id, row, name, value, _NO_EXTRA)
        counts = Counter(name for _row, _values, misfit in found for name in misfit)
        if self.policy == IGNORE:
            self._note(self.dropped, counts, "dropped (schema.change.behavior=ignore)")
            return self._without(page, extra, found)
        self._note(self.kept, counts, "kept in _extra with its own type")
        return page

    def _find(self, extra: pa.Array) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
        """(row, its ``_extra`` values, those that have an output column) of every row whose
        ``_extra`` holds a value of an output column."""
        hits = pc.match_substring_regex(extra, self._pattern)
        rows = pc.indices_nonzero(pc.fill_null(hits, False)).to_pylist()
        found = []
        for row in rows:  # the JSON says whether a hit is a key (a string value cannot match)
            values = json.loads(extra[row].as_py())
            misfit = {k: json_value(v) for k, v in values.items() if k in self.columns}
            if misfit:
                found.append((row, values, misfit))
        return found

    def _refuse(self, page: pa.RecordBatch, channel_id: str | pa.Array, row: int, name: str,
                value: Any, remedy: str) -> None:
        channel = channel_id if isinstance(channel_id, str) else channel_id[row].as_py()
        raise SchemaChangeError(
            table=self.table, column=name, column_type=self.columns[name],
            channel_id=channel, sequence=page.column("_sequence")[row].as_py(),
            value_type=tablestore_kind(value), value=_shown(value), policy=self.policy,
            remedy=remedy)

    def _note(self, counter: Counter[str], counts: Counter[str], what: str) -> None:
        for name, count in sorted(counts.items()):
            if name not in counter:
                log.warning("table %s: column %r (%s) received a value of another type; such "
                            "values are %s (docs/schema.md)", self.table, name,
                            self.columns[name], what)
            counter[name] += count

    @staticmethod
    def _without(page: pa.RecordBatch, extra: pa.Array,
                 found: list[tuple[int, dict[str, Any], dict[str, Any]]]) -> pa.RecordBatch:
        texts = extra.to_pylist()
        for row, values, misfit in found:
            rest = {k: v for k, v in values.items() if k not in misfit}
            texts[row] = ENCODE_JSON(rest) if rest else None
        index = page.schema.get_field_index("_extra")
        return page.set_column(index, page.schema.field(index), pa.array(texts, pa.string()))


#: the characters RE2 (Arrow's regular expressions) reads as operators
_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def _literal(text: str) -> str:
    """``text`` as an RE2 pattern matching it literally."""
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in text)


def _shown(value: Any) -> Any:
    """A value as an error shows it: long text and bytes cut (the error names the change)."""
    if isinstance(value, str) and len(value) > 60:
        return value[:57] + "..."
    if isinstance(value, bytes) and len(value) > 60:
        return value[:57] + b"..."
    return value


__all__ = ["MisfitPolicy"]
