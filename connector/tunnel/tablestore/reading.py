"""The Tablestore client's reading role: ReadRecords into pages (executors).

``TablestoreReading`` (``connector.tunnel.base.ChannelReader``):

- ``fetch``: the wire records of up to ``limit`` records after a token, as ``WireRecords``.
  ReadRecords has no limit: the request carries the emulator-only ``max_records``, and a longer
  page from a service that ignores it is cut with a token inside the page (``tokens``);
  ``WireRecords.token_after`` tells the same token after any record of the page, so a read that
  stops inside it (``connector.stop_rule``) asks nothing again;
- ``read_page`` (the reader's path) decodes PlainBuffer straight into the page's Arrow columns
  (``records.decode_columns``), no ``Record`` per record, and sends the next page's request
  before this page is decoded, used only by the read that asks for exactly it (``prefetch``);
  requests share the client's pool of kept-alive connections (``http``; executors keep one
  client per endpoint, ``connector.clients``);
- ``read_records`` (``Record`` objects) serves the contract suite, ``has_new_data`` and tools.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from connector.errors import MalformedTokenError
from connector.tunnel.base import FINISHED, ChannelReader, ReadResult
from connector.tunnel.page import Page, PageLayout, empty_page_batch
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.admin import TablestoreAdministration
from connector.tunnel.tablestore.calls import CLIENT_ID
from connector.tunnel.tablestore.prefetch import PrefetchedReads
from connector.tunnel.tablestore.read_answer import ReadAnswer, read_answer
from connector.tunnel.tablestore.records import BASE_PREFIX, decode_columns, decode_page
from connector.tunnel.tablestore.tokens import (
    TokensInPage,
    base_offset,
    check_token,
    inside_page,
)

_READ_PATH = "/tunnel/readrecords"


@dataclass(frozen=True)
class WireRecords:
    """Up to ``limit`` records after a token, as the wire gave them (``fetch``)."""

    #: protobuf ``Record`` messages, or a ``columnar.RawRecords`` when the compiled scanner
    #: read the answer (``scan``)
    records: Sequence[Any]
    #: records before the first in a base-data channel (``None``: unknown)
    first_offset: int | None
    next_token: str
    may_more: bool
    #: the service page the records are in, and how many of its records come before them
    page_token: str
    skip: int

    def token_after(self, n: int) -> str:
        """The token after the first ``n`` records (``0 < n < len(records)``)."""
        return self.tokens()(n)

    def tokens(self) -> TokensInPage:
        """``token_after`` without the records (what a ``Page`` keeps)."""
        return TokensInPage(self.page_token, self.skip)


class TablestoreReading(TablestoreAdministration, ChannelReader):
    """ReadRecords over the wire (module docstring)."""

    #: False makes reads behave as against a service without the emulator's page limit
    send_max_records: bool
    #: send a channel's next ReadRecords request ahead (``read.prefetch``)
    prefetch: bool
    #: the next page's request per channel, sent ahead by ``read_page``
    _prefetches: PrefetchedReads

    @property
    def prefetch_stats(self) -> dict[str, int]:
        """Prefetched answers used / sent and not used (tests and benchmarks read them)."""
        return self._prefetches.stats

    def _read_request(self, tunnel_id: str, channel_id: str, page_token: str,
                      want: int) -> tuple[int | None, bytes]:
        """(max_records sent or ``None``, the serialized ReadRecords request)."""
        request = m.ReadRecordsRequest(tunnel_id=tunnel_id, client_id=CLIENT_ID,
                                       channel_id=channel_id, token=page_token)
        max_records = None
        if self.send_max_records:
            max_records = request.max_records = max(1, min(want, 2**31 - 1))
        return max_records, request.SerializeToString()

    def _read_page(self, tunnel_id: str, channel_id: str, page_token: str, want: int,
                   token: str, ahead: bool = False, scan: bool = False) -> ReadAnswer:
        """One ReadRecords answer (``read_answer``; ``scan``: its records left as bytes for
        the compiled decoder); ``ahead``: the prefetched one when it answers this request
        (module docstring)."""
        max_records, body = self._read_request(tunnel_id, channel_id, page_token, want)
        prefetched = (self._prefetches.take((tunnel_id, channel_id), page_token) if ahead
                      else None)
        on_error = lambda e: self._channel_error(e, tunnel_id, channel_id, token)  # noqa: E731
        parse = lambda data: read_answer(data, scan)  # noqa: E731
        if prefetched is not None:
            response = self._send(_READ_PATH, body, m.ReadRecordsResponse, on_error,
                                  prefetched.answer, parse)
            # asked with a higher limit: a page no longer than this one's limit answers it too
            if prefetched.answer.body == body or len(response.records) <= (max_records or 0):
                self.prefetch_stats["used"] += 1
                return response
            self.prefetch_stats["unused"] += 1
        return self._send(_READ_PATH, body, m.ReadRecordsResponse, on_error, parse=parse)

    def _send_ahead(self, tunnel_id: str, channel_id: str, page_token: str, want: int) -> None:
        """Send the request for the page after this one now; its answer is read by the read
        that asks for it (``prefetch``)."""
        _, body = self._read_request(tunnel_id, channel_id, page_token, want)
        self._prefetches.hold((tunnel_id, channel_id), page_token,
                              self._transport.send(_READ_PATH, body))

    def fetch(self, tunnel_id: str, channel_id: str, token: str, limit: int,
              ahead: bool = False, scan: bool = False) -> WireRecords | None:
        """The wire records of up to ``limit`` records after ``token``; ``None`` for
        ``limit == 0`` (nothing to ask the service). Shared by both read methods and ``lag``
        (``channel_probes``); ``ahead`` (``read_page``): with prefetch (``prefetch``);
        ``scan`` (``read_page``): the records as a ``columnar.RawRecords`` when the compiled
        scanner reads the answer (``read_answer``), else protobuf ``Record`` objects."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        page_token, skip = check_token(channel_id, token)
        if limit == 0 and token != FINISHED:
            return None
        response = self._read_page(tunnel_id, channel_id, page_token, skip + limit, token,
                                   ahead and not skip, scan)
        while skip and len(response.records) <= skip:
            # the service paged differently than when the token was made: skip whole pages
            if response.next_token == FINISHED or not response.records:
                raise MalformedTokenError(
                    channel_id=channel_id, token=token,
                    reason=f"it skips {skip} record(s) but only {len(response.records)} "
                    "follow its page token")
            skip -= len(response.records)
            page_token = response.next_token
            response = self._read_page(tunnel_id, channel_id, page_token, skip + limit, token,
                                       scan=scan)
        before = base_offset(page_token)
        wanted = response.records[skip:skip + limit]
        first = None if before is None else before + skip
        if skip + limit < len(response.records):
            return WireRecords(wanted, first, inside_page(page_token, skip + limit), True,
                               page_token, skip)
        may_more = (response.may_more_record if response.may_more_record is not None
                    else len(response.records) >= 500)
        may_more = bool(may_more) and response.next_token != FINISHED
        if ahead and may_more:
            self._send_ahead(tunnel_id, channel_id, response.next_token, limit)
        return WireRecords(wanted, first, response.next_token, may_more, page_token, skip)

    def read_records(self, tunnel_id: str, channel_id: str, token: str, limit: int) -> ReadResult:
        """Up to ``limit`` records after ``token`` as ``Record`` objects (the contract suite,
        ``has_new_data``, tools); see the module docstring for tokens that point inside a
        service page."""
        fetched = self.fetch(tunnel_id, channel_id, token, limit)
        if fetched is None:
            return ReadResult([], token, True)
        return ReadResult(decode_page(fetched.records, channel_id, token, fetched.first_offset),
                          fetched.next_token, fetched.may_more)

    def read_page(self, tunnel_id: str, channel_id: str, token: str, limit: int,
                  layout: PageLayout) -> Page:
        """Up to ``limit`` records after ``token`` as one columnar page (executor, the
        reader's path): PlainBuffer decoded straight into the page's columns
        (``records.decode_columns``), no ``Record`` per record; positions, tokens and errors
        as ``read_records``; the page tells the token after any of its records
        (``WireRecords.token_after``). The next page's request is sent ahead (module
        docstring)."""
        fetched = self.fetch(tunnel_id, channel_id, token, limit, ahead=self.prefetch,
                             scan=True)
        if fetched is None:
            return Page(empty_page_batch(layout), token, True)
        return Page(decode_columns(fetched.records, channel_id, token, fetched.first_offset,
                                   layout), fetched.next_token, fetched.may_more,
                    tokens=fetched.tokens())

    def snapshot_rows(self, channel_id: str, sequences: Any) -> Any:
        """Base data is the records without sequence info: their ``_sequence`` starts with
        ``records.BASE_PREFIX`` (the service's own base channels and the emulator's alike)."""
        return pc.starts_with(sequences, BASE_PREFIX)


__all__ = ["TablestoreReading", "WireRecords"]
