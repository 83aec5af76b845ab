"""The key range a re-snapshot is limited to: ``--from`` (inclusive) and ``--to`` (exclusive) on
the table's first key column, as text, turned into that column's type (CLI process; the job
reads them back from the signal). A value that is not of the key's type is a
``KeyRangeError`` naming the flag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connector.errors import CdcError
from connector.tunnel import TableSchema


class KeyRangeError(CdcError):
    """A ``--from`` / ``--to`` value the table's first key column cannot take."""

    template = "{flag} {value!r}: {problem}"


#: declared key type -> (how a text becomes it, what it must look like)
_PARSERS: dict[str, tuple[type, str]] = {
    "INTEGER": (int, "an integer"),
    "DOUBLE": (float, "a number"),
    "STRING": (str, "a string"),
}


@dataclass(frozen=True)
class KeyRange:
    """``[key_from, key_to)`` on ``column`` (None: unbounded on that side)."""

    column: str
    key_from: Any = None
    key_to: Any = None

    def holds(self, key: tuple[Any, ...]) -> bool:
        """Whether a key (its columns in the table's order) is in the range."""
        first = key[0]
        if self.key_from is not None and first < self.key_from:
            return False
        return self.key_to is None or first < self.key_to

    @classmethod
    def parse(cls, schema: TableSchema, key_from: str | None, key_to: str | None) -> KeyRange:
        """The range of ``--from`` / ``--to`` on ``schema``'s first key column."""
        column = schema.primary_key[0]
        parsed: list[Any] = []
        for flag, text in (("--from", key_from), ("--to", key_to)):
            if text is None:
                parsed.append(None)
                continue
            convert, shape = _PARSERS.get(column.type, (None, ""))
            if convert is None:
                raise KeyRangeError(flag=flag, value=text, problem=f"the first key column "
                                    f"{column.name!r} is {column.type}; a range is taken on "
                                    "INTEGER, DOUBLE and STRING keys only")
            try:
                parsed.append(convert(text))
            except ValueError:
                raise KeyRangeError(flag=flag, value=text, problem=f"expected {shape}, the "
                                    f"type of the first key column {column.name!r}") from None
        low, high = parsed
        if low is not None and high is not None and not low < high:
            raise KeyRangeError(flag="--to", value=key_to, problem=f"must be above --from "
                                f"{key_from!r} (the range is [from, to))")
        return cls(column.name, low, high)
