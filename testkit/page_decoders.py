"""The compiled page decoder held to the pure-Python one: the same outcome for the same page.

``assert_same(records, base_offset, layout, must_compile=...)`` decodes one ReadRecords page
with ``records.decode_columns_python`` and with the compiled decoder (``columnar.
decode_compiled``, handing a page over to the Python path where it must), from protobuf
``Record`` objects and from the scanned bytes of an answer holding them (``read_answer``, the
client's ``read_page`` path), and asserts every outcome is the same: the same batch (floats by
their bits, ``_before`` / ``_extra`` byte for byte) or the same ``MalformedRecordError`` -- and
never another error. Used by tests/test_decoders.py and the decoders' fuzz target
(tests/fuzz/test_fuzz_decoders.py).

``compiled_required``: ``TABLESTORE_CDC_REQUIRE_COMPILED_DECODER=1`` (set by ``make test``)
makes tests/test_decoders.py fail when the extension is missing, so CI tests the compiled one.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pyarrow as pa
from hypothesis import currently_in_test_context, event

from connector.errors import MalformedRecordError
from connector.tunnel.page import PageLayout
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.columnar import RawRecords, decode_compiled
from connector.tunnel.tablestore.read_answer import read_answer
from connector.tunnel.tablestore.records import decode_columns, decode_columns_python

#: set to 1 where the compiled decoder must be there (``make test``, CI)
REQUIRE_COMPILED_ENV = "TABLESTORE_CDC_REQUIRE_COMPILED_DECODER"


def compiled_required() -> bool:
    """Whether this run must test the compiled decoder (``REQUIRE_COMPILED_ENV`` set)."""
    return os.environ.get(REQUIRE_COMPILED_ENV, "") not in ("", "0")


def canonical(batch: pa.RecordBatch) -> tuple[Any, ...]:
    """Everything a page batch says, floats by their bits (NaN != NaN in ``equals``), dates
    and times by their integers (a date32 of any int32 is valid Arrow, but Python's ``date``
    ends in the year 9999)."""
    batch.validate(full=True)
    columns = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_temporal(field.type):
            values = column.view(pa.int64() if field.type.bit_width == 64
                                 else pa.int32()).to_pylist()
        else:
            values = column.to_pylist()
        if pa.types.is_floating(field.type):
            values = [None if v is None else struct.pack("<d", v).hex() for v in values]
        columns.append((field.name, column.null_count, values))
    return batch.schema, batch.num_rows, columns


def outcome(decode: Any, records: Any, base_offset: int | None,
            layout: PageLayout) -> tuple[Any, ...]:
    try:
        batch = decode(records, "ch-1", "tok-1", base_offset, layout)
    except Exception as exc:  # noqa: BLE001 -- whatever it is, both must raise it
        if isinstance(exc, MalformedRecordError):
            assert exc.fields["channel_id"] == "ch-1" and exc.fields["token"] == "tok-1"
        return "error", type(exc), str(exc)
    assert batch is not None
    return ("batch", *canonical(batch))


def assert_same(records: list[Any], base_offset: int | None, layout: PageLayout, *,
                must_compile: bool) -> tuple[Any, ...]:
    """The compiled decoder's outcome equals the Python one's; ``must_compile``: the page is
    one the compiled decoder fills itself (no hand-over to the Python path)."""
    handed_over = []

    def compiled(*args: Any) -> pa.RecordBatch:
        batch = decode_compiled(*args)
        if batch is None:
            handed_over.append(True)
            return decode_columns(*args)  # the Python path (protobuf Records for RawRecords)
        return batch

    expected = outcome(decode_columns_python, records, base_offset, layout)
    # input from the service ends in a batch or the typed error, never a raw one
    assert expected[0] == "batch" or expected[1] is MalformedRecordError, expected
    got = outcome(compiled, records, base_offset, layout)
    if handed_over:
        assert not must_compile, "the compiled decoder handed a well-typed page over"
    if currently_in_test_context():  # hypothesis statistics (pytest --hypothesis-show-statistics)
        event(f"outcome: {expected[0]}{', handed to the Python path' if handed_over else ''}")
    assert got == expected
    # the client's read_page path: the same records sent in an answer, scanned, decoded from
    # its bytes (tests/test_read_answer.py holds the scan itself to the protobuf runtime's)
    answer = read_answer(m.ReadRecordsResponse(records=records, next_token="t")
                         .SerializeToString(), scan=True)
    assert isinstance(answer.records, RawRecords)
    handed_over.clear()
    assert outcome(compiled, answer.records, base_offset, layout) == expected
    assert not (handed_over and must_compile), "a scanned well-typed page was handed over"
    return got


__all__ = ["assert_same", "canonical", "outcome"]
