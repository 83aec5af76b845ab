"""The client's tokens: the service's page tokens, and ``"<page token>~<k>"`` inside a page.

ReadRecords has no limit: a service that ignores the emulator-only ``max_records`` may answer
with a longer page than asked. The client then returns the first ``limit`` records with the
token ``"<page token>~<k>"`` ("k records after that token"); reading from such a token re-reads
the page and skips k records (``TablestoreTunnelService.fetch``). The service's own tokens
are base64 of a ``Token`` message wrapping ``TokenContent(V2)``; a base-data channel's carries
the records before it (``base_offset``). Pure functions, used by the client on the driver and
executors.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from connector.tunnel.base import FINISHED
from connector.tunnel.tablestore import messages as m

#: separates a page token from a record count in a client token (not a base64 character)
SKIP_MARK = "~"


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


__all__ = ["SKIP_MARK", "base_offset", "split_token", "token_content"]
