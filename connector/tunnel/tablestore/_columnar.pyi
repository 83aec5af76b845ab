# The compiled PlainBuffer page decoder (_columnar.c); its Python side is columnar.py.
from collections.abc import Sequence
from typing import Any

#: per page column: (null count, validity bitmap or None, buffer 1, buffer 2 or None)
ColumnBuffers = tuple[int, bytes | None, bytes, bytes | None]
#: (rows, the buffers of every page column in schema order) | a malformed page's reason |
#: None (the Python path decodes this page)
Decoded = tuple[int, tuple[ColumnBuffers, ...]] | str | None

def decode_page(records: Sequence[Any], names: tuple[bytes, ...], kinds: bytes,
                base_offset: int | None, /) -> Decoded: ...
def decode_raw_page(body: bytes, index: bytes, start: int, stop: int, names: tuple[bytes, ...],
                    kinds: bytes, base_offset: int | None, /) -> Decoded: ...

#: (record count, next_token, may_more_record: 1 / 0 / -1 when unset, the index: five int32
#: per record -- action, record offset, length, origin_record offset (-1: unset), length)
Scanned = tuple[int, str, int, bytes]

def scan_read_records(body: bytes, /) -> Scanned | None: ...
