"""The client's tokens: the service's page tokens, and ``"<page token>~<k>"`` inside a page.

ReadRecords has no limit: a service that ignores the emulator-only ``max_records`` may answer
with a longer page than asked. The client then returns the first ``limit`` records with the
token ``"<page token>~<k>"`` ("k records after that token"), and a page tells the same token
after any of its records (``reading.WireRecords.token_after``): a read that stops inside a page
asks nothing again. Reading from such a token re-reads the page and skips k records
(``reading.TablestoreReading.fetch``). The service's own tokens
are base64 of a ``Token`` message wrapping ``TokenContent(V2)``; a base-data channel's carries
the records before it (``base_offset``). Pure functions, used by the client on the driver and
executors.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from connector.errors import MalformedTokenError
from connector.tunnel.base import FINISHED
from connector.tunnel.tablestore import messages as m

#: separates a page token from a record count in a client token (not a base64 character)
SKIP_MARK = "~"


def inside_page(page_token: str, skip: int) -> str:
    """The client token "``skip`` records after ``page_token``" (``skip`` > 0)."""
    return f"{page_token}{SKIP_MARK}{skip}"


@dataclass(frozen=True)
class TokensInPage:
    """``Page.tokens`` of records read from one service page (``reading.read_page``): the
    token after the first ``n`` of them. It holds the page token and the skip alone: a page
    the reader keeps until its read's end is claimed must not keep the service's answer (its
    bytes, as large as the page's columns) alive through it."""

    page_token: str
    skip: int

    def __call__(self, n: int) -> str:
        return inside_page(self.page_token, self.skip + n)


def check_token(channel_id: str, token: Any) -> tuple[str, int]:
    """``(page token, records to skip)`` of a token this backend could have issued, else
    ``MalformedTokenError`` (no request sent)."""
    if not isinstance(token, str) or not token:
        raise MalformedTokenError(channel_id=channel_id, token=token,
                                  reason="a token is a non-empty string")
    if token == FINISHED:
        return token, 0
    try:
        page, skip = split_token(token)
        token_content(page)
    except ValueError as exc:
        raise MalformedTokenError(channel_id=channel_id, token=token, reason=str(exc)) from None
    return page, skip


def split_token(token: str) -> tuple[str, int]:
    """``(page token, records to skip after it)`` of a client token."""
    page, mark, skip = token.partition(SKIP_MARK)
    if not mark:
        return token, 0
    if not skip.isdigit() or int(skip) <= 0:
        raise ValueError(f"bad record count {skip!r}")
    return page, int(skip)


def token_content(token: str) -> Any:
    """The ``TokenContent(V2)`` inside a service token; ``ValueError`` if it is not one."""
    try:
        raw = base64.b64decode(token.encode("ascii"), validate=True)
        envelope = m.parse(m.Token, raw)
        if envelope.version == 2:
            return m.parse(m.TokenContentV2, envelope.content)
        if envelope.version == 1:
            return m.parse(m.TokenContent, envelope.content)
    except (UnicodeError, binascii.Error, m.MessageError) as exc:
        raise ValueError(f"not a tunnel token ({exc})") from None
    raise ValueError(f"unknown token version {envelope.version}")


def base_offset(page_token: str) -> int | None:
    """Records before ``page_token`` in a base-data channel, when the token says so."""
    if page_token == FINISHED:
        return None
    content = token_content(page_token)
    if content.iterator or not content.DESCRIPTOR.fields_by_name.get("total_count"):
        return None
    return int(content.total_count) if content.HasField("total_count") else None


__all__ = ["SKIP_MARK", "TokensInPage", "base_offset", "check_token", "inside_page", "split_token",
           "token_content"]
