"""Where a request's body ends: the emulator's reading of ``Content-Length``.

The server (``server.py``) asks ``body_length(headers)`` before it reads a POST's body. The
SDKs always send exactly one ``Content-Length`` of ASCII digits and never a
``Transfer-Encoding``; anything else leaves the body's end unknown (a repeated or non-numeric
length is also how one request is smuggled inside another), so it is refused with
``FramingError`` -- the service's 400 ``OTSParameterInvalid`` -- and the server closes the
connection after answering, as the bytes that follow cannot be read as a next request.
"""

from __future__ import annotations

import re
from email.message import Message

from tablestore_emulator.errors import OtsError

#: Largest request body accepted (the service's limit on a request is 5 MB; leave headroom).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
_DIGITS = re.compile(r"[0-9]{1,20}")


class FramingError(OtsError):
    """400 ``OTSParameterInvalid`` for a request whose body's end is unknown; the server
    answers it and closes the connection."""

    def __init__(self, message: str) -> None:
        super().__init__(400, "OTSParameterInvalid", message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message,))


def body_length(headers: Message) -> int:
    """The body's length in bytes (0 without ``Content-Length``); ``FramingError`` for a
    ``Transfer-Encoding``, a ``Content-Length`` given twice or not a decimal number, or a body
    over ``MAX_REQUEST_BYTES``."""
    if headers.get_all("Transfer-Encoding"):
        raise FramingError("Transfer-Encoding is not supported: send Content-Length.")
    given = headers.get_all("Content-Length") or []
    if len(given) > 1:
        raise FramingError("Content-Length is given more than once.")
    if not given:
        return 0
    text = given[0].strip()
    if not _DIGITS.fullmatch(text):
        raise FramingError(f"Content-Length {text[:40]!r} is not a number of bytes.")
    length = int(text)
    if length > MAX_REQUEST_BYTES:
        raise FramingError(f"Request body of {length} bytes is too large.")
    return length


__all__ = ["MAX_REQUEST_BYTES", "FramingError", "body_length"]
