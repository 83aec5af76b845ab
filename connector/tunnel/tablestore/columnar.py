"""Which PlainBuffer page decoder runs: the compiled one, or the pure-Python fallback.

``records.decode_columns`` (executors, the client's ``read_page``) asks ``decode_compiled``
first. The compiled decoder is the C extension ``_columnar`` (``_columnar.c``, built by
``setup.py`` when a C compiler is there; optional, so ``pip install`` works without one): it
reads each wire ``Record``'s PlainBuffer straight into the raw buffers of the page's Arrow
columns -- no Python object per value -- and this module wraps them with
``pa.Array.from_buffers``. It makes the same checks in the same order as
``plainbuffer.decode_raw`` and ``records.decode_columns_python``, with the same messages, and
writes the same canonical JSON text; tests/test_decoders.py holds both to identical batches
and errors.

``decode_compiled`` returns ``None`` -- and the caller decodes with the Python path -- when:

- the extension is not installed (one WARNING line per process, at the first decode);
- the layout has a column type the compiled decoder does not fill (anything but int64,
  float64, bool, string, binary: a schema given by the user may ask for others);
- the page holds a value of another type than its declared column's (e.g. an INTEGER in a
  float64 column): the Python path decides whether it fits without loss
  (``connector.tunnel.column_values``: converted, or a ``MalformedRecordError`` naming the
  record and the column), so both decoders agree by construction.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from connector.errors import MalformedRecordError
from connector.tunnel.page import PageLayout, page_schema
from connector.tunnel.tablestore import messages as m

try:
    from connector.tunnel.tablestore import _columnar
except ImportError:  # built without a C compiler: the pure-Python decoder serves
    _columnar = None  # type: ignore[assignment]

log = logging.getLogger("connector.tunnel.tablestore")

#: Arrow type of a layout column -> the kind byte ``_columnar.decode_page`` takes
KINDS: dict[pa.DataType, int] = {
    pa.int64(): 0, pa.float64(): 1, pa.bool_(): 2, pa.string(): 3, pa.binary(): 4,
}

_fallback_noted = False


def compiled_available() -> bool:
    """Whether the C extension is installed."""
    return _columnar is not None


def _note_fallback() -> None:
    global _fallback_noted
    if not _fallback_noted:
        _fallback_noted = True
        log.warning("PlainBuffer pages are decoded by the pure-Python decoder: the compiled "
                    "one (connector.tunnel.tablestore._columnar) is not installed; reinstall "
                    "the package where a C compiler is available to build it "
                    "(docs/performance.md)")


class RawRecords:
    """Records ``start .. stop`` of a scanned ReadRecords answer, still bytes: ``len``, slices
    (another window of the same bytes), and ``messages()``, the protobuf ``Record`` objects for
    a path that wants them (the pure-Python decoder)."""

    __slots__ = ("body", "index", "start", "stop")

    def __init__(self, body: bytes, index: bytes, start: int, stop: int) -> None:
        self.body, self.index, self.start, self.stop = body, index, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, window: slice) -> RawRecords:
        if not isinstance(window, slice) or window.step not in (None, 1):
            raise TypeError("RawRecords takes slices without a step only")
        start, stop, _ = window.indices(len(self))
        return RawRecords(self.body, self.index, self.start + start,
                          self.start + max(start, stop))

    def messages(self) -> list[Any]:
        """These records as protobuf ``Record`` objects (the bytes parsed again)."""
        return list(m.parse(m.ReadRecordsResponse, self.body).records[self.start:self.stop])


@functools.lru_cache(maxsize=64)
def _layout_spec(layout: PageLayout) -> tuple[tuple[bytes, ...], bytes, pa.Schema] | None:
    """(column names as UTF-8, kind bytes, page schema), or None if a column type is not
    one the compiled decoder fills."""
    try:
        names = tuple(name.encode("utf-8") for name, _ in layout.columns)
        kinds = bytes(KINDS[typ] for _, typ in layout.columns)
    except (KeyError, UnicodeEncodeError):
        return None
    return names, kinds, page_schema(layout)


def decode_compiled(records: Sequence[Any], channel_id: str, token: str,
                    base_offset: int | None, layout: PageLayout) -> pa.RecordBatch | None:
    """The page batch of ``records`` (wire ``Record`` messages of one ReadRecords response, or
    a ``RawRecords`` window of its bytes), decoded by the compiled decoder; ``None`` when the
    Python path must decode it (see the module docstring). ``MalformedRecordError`` as
    ``records.decode_columns_python`` raises it."""
    if _columnar is None:
        _note_fallback()
        return None
    spec = _layout_spec(layout)
    if spec is None:
        return None
    names, kinds, schema = spec
    if isinstance(records, RawRecords):
        out = _columnar.decode_raw_page(records.body, records.index, records.start,
                                        records.stop, names, kinds, base_offset)
    else:
        out = _columnar.decode_page(records, names, kinds, base_offset)
    if out is None:
        return None
    if isinstance(out, str):
        raise MalformedRecordError(channel_id=channel_id, token=token, reason=out)
    n, columns = out
    arrays = []
    for field, (null_count, validity, values, data) in zip(schema, columns, strict=True):
        buffers = [None if validity is None else pa.py_buffer(validity), pa.py_buffer(values)]
        if data is not None:
            buffers.append(pa.py_buffer(data))
        arrays.append(pa.Array.from_buffers(field.type, n, buffers, null_count=null_count))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


__all__ = ["KINDS", "RawRecords", "compiled_available", "decode_compiled"]
