"""Option values as Spark hands them over: read as text, and every failure named by its option.

``SourceOptions.from_spark`` (``connector/options.py``, driver) validates the options of a
query. Its parsers (``option_values``, the field validators, the URI checks) raise
``ValueError`` for what they refuse; this module makes sure that whatever else a value can make
them raise -- a lone surrogate that no encoder takes, JSON nested past Python's recursion
limit, a URI ``urlsplit`` cannot read -- also ends in the ``OptionError`` naming the option, its
value and what is allowed, never a raw Python error:

- ``text_problem(value)``: a value that is not text (a lone surrogate, a NUL character) is
  refused before any parser sees it;
- ``blamed(option, value, allowed)``: a block of validation that concerns one option; any
  failure inside it that is not already an ``OptionError`` becomes one naming that option;
- ``uri_problem(uri, schemes)``: what is wrong with a URI option before a backend opens it
  (``meta.store``: the backend refuses the rest with its own typed error when it opens);
- ``shown_key(key)``: an option name as a message may show it (an unknown key may hold
  anything).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from connector.errors import CdcError, OptionError

_SURROGATE = re.compile(r"[\ud800-\udfff]")

#: what a parser may raise on a value it cannot read (anything else is a bug, not input)
PARSER_FAILURES = (ValueError, TypeError, ArithmeticError, RecursionError, LookupError)


def text_problem(value: Any) -> str | None:
    """Why ``value`` is not text an option can hold, or None (non-strings are left to the
    option's own validation)."""
    if not isinstance(value, str):
        return None
    found = _SURROGATE.search(value)
    if found is not None:
        return (f"holds the lone surrogate \\u{ord(found.group()):04x} at position "
                f"{found.start()}: not text (an option value is a UTF-8 string)")
    if "\x00" in value:
        return f"holds a NUL character at position {value.index(chr(0))}"
    return None


def shown_key(key: str) -> str:
    """``key`` as an error may name it: escaped when it holds what a terminal cannot show."""
    return key if key.isprintable() and text_problem(key) is None else repr(key)[1:-1]


@contextmanager
def blamed(option: str, value: Any, allowed: str) -> Iterator[None]:
    """Validation of ``option`` (``value`` as it may be shown): a failure that is not the
    product's typed error becomes an ``OptionError`` naming the option."""
    try:
        yield
    except CdcError:
        raise
    except PARSER_FAILURES as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OptionError(option=option, value=value, problem=f"cannot be read ({detail})",
                          allowed=allowed) from None


def uri_problem(uri: Any, schemes: Collection[str]) -> str | None:
    """Why ``uri`` cannot be the URI of one of ``schemes``' backends, or None: it must be
    text that ``urlsplit`` reads, with a scheme of ``schemes`` and, if it names a port, a port
    number. What each backend requires beyond that it checks when it opens."""
    if not isinstance(uri, str):
        return f"is a {type(uri).__name__}, not a URI"
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
    except ValueError as exc:
        return f"not a URI ({exc})"
    if not parts.scheme:
        return "not a URI (expected scheme://...)"
    if parts.scheme not in schemes:
        return f"unsupported scheme {parts.scheme!r}"
    return None


__all__ = ["PARSER_FAILURES", "blamed", "shown_key", "text_problem", "uri_problem"]
