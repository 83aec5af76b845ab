"""A ReadRecords answer as the client's ``fetch`` reads it: scanned in C, or parsed by protobuf.

``read_answer(data, scan)`` (the client's ``_read_page``, driver and executors) gives a
``ReadAnswer``: the answer's records, ``next_token`` and ``may_more_record`` (``None`` when the
service left it unset). ``fetch`` uses nothing else of the message.

- ``scan=False``, or the compiled extension missing: ``messages.parse`` of a
  ``ReadRecordsResponse``; ``records`` is its repeated field of protobuf ``Record`` objects.
- ``scan=True`` (the client's ``read_page``, the executors' path): ``_columnar.
  scan_read_records`` reads the message's bytes itself and indexes where each record's fields
  lie; ``records`` is then a ``columnar.RawRecords``, a window of that index, and ``records.
  decode_columns`` decodes it straight from the bytes (``_columnar.decode_raw_page``). No
  protobuf object is made per record: the scan and the decode cost about a third of the parse
  and the decode through ``Record`` objects (0.23 against 0.64 us per record at 500 records a
  page; docs/performance.md).

The scanner accepts only a complete, well-formed message with every required field and an
action type the decoder knows; for anything else (bytes cut short, a wrong wire type, an
unknown action, a ``next_token`` that is not UTF-8...) it declines, and the protobuf runtime
parses the bytes as with ``scan=False``, so the errors are its own, as before. Both give the
same answer: ``tests/test_read_answer.py``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from connector.tunnel.tablestore import columnar
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.columnar import RawRecords


class ReadAnswer(NamedTuple):
    records: Any  # protobuf Records (a repeated field), or RawRecords
    next_token: str
    may_more_record: bool | None


def read_answer(data: bytes, scan: bool) -> ReadAnswer:
    """The answer in ``data`` (module docstring); ``messages.MessageError`` when it is not a
    ReadRecordsResponse."""
    compiled = columnar._columnar  # looked up now: None where the extension is not built
    if scan and compiled is not None:
        scanned = compiled.scan_read_records(data)
        if scanned is not None:
            count, next_token, may_more, index = scanned
            return ReadAnswer(RawRecords(data, index, 0, count), next_token,
                              None if may_more < 0 else bool(may_more))
    msg = m.parse(m.ReadRecordsResponse, data)
    return ReadAnswer(msg.records, msg.next_token,
                      msg.may_more_record if msg.HasField("may_more_record") else None)


__all__ = ["ReadAnswer", "read_answer"]
