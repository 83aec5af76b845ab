"""The names the embedded store takes, checked where they enter its API.

A table, column or tunnel name, a tunnel id or a channel id is stored in (and looked up by)
SQLite as UTF-8 text. A Python ``str`` can hold what UTF-8 cannot (a lone surrogate, as a
non-UTF-8 byte in a command-line argument becomes), and text no name of the service holds (a
control character: a NUL, a tab, a trailing newline pasted with the name). ``LocalTablestore``
(``store``) and ``LocalTunnelService`` (``service``, ``tunnels``, ``channels``) check each name
before it reaches a query, on whichever process calls them (a writer, the Spark driver,
executors, the CLI, the emulator's routes):

- a name being created that is not one: ``InvalidNameError`` (an ``InvalidRowError``: the
  emulator answers 400), naming the field and the offending character;
- a name being looked up that is not one cannot name anything stored: the lookup's own "does
  not exist" error (``UnknownTableError``, ``UnknownTunnelError``, ``UnknownChannelError``, so
  every caller that maps those maps these), with the reason in its message.
"""

from __future__ import annotations

import re
from typing import Any

from connector.errors import (
    CdcError,
    InvalidRowError,
    UnknownChannelError,
    UnknownTableError,
    UnknownTunnelError,
)

#: characters no name may hold: C0 and C1 control characters (NUL, tab, newline, DEL, ...)
#: and lone surrogates (not encodable as UTF-8)
_NOT_IN_NAMES = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class InvalidNameError(InvalidRowError):
    """A name given to create something (a table, a column, a tunnel) is not one."""

    template = "{field} {value!r} is not a valid name: {reason}"


class InvalidTunnelNameError(InvalidNameError, UnknownTunnelError):
    """A tunnel name given to create a tunnel is not one. Also an ``UnknownTunnelError`` (no
    tunnel can have that name): the tunnel API's callers, which map the tunnel errors and not
    the row API's, answer it as they answer a bad tunnel name (the emulator: 400)."""


class InvalidTableNameError(UnknownTableError):
    template = "table {table!r} does not exist in {endpoint}: {reason}"


class InvalidTunnelIdError(UnknownTunnelError):
    template = "tunnel {tunnel!r} does not exist on table {table!r}: {reason}"


class InvalidChannelIdError(UnknownChannelError):
    template = "channel {channel_id!r} does not exist in tunnel {tunnel_id!r}: {reason}"


def name_problem(value: Any) -> str | None:
    """Why ``value`` is not a name (not a non-empty string of UTF-8-encodable characters
    without control characters), else None."""
    if not isinstance(value, str):
        return f"a name is a string, not {type(value).__name__}"
    if not value:
        return "a name is not empty"
    bad = _NOT_IN_NAMES.search(value)
    if bad is None:
        return None
    char = bad.group()
    what = "a lone surrogate (not UTF-8 text)" if "\ud800" <= char <= "\udfff" \
        else "a control character"
    return f"it holds {what} U+{ord(char):04X} at position {bad.start()}"


def _refuse(name: Any, error: type[CdcError], **fields: Any) -> None:
    """Raise ``error`` (with ``fields`` and the reason) if ``name`` is not a name."""
    problem = name_problem(name)
    if problem is not None:
        raise error(reason=problem, **fields)


def check_new_name(field: str, value: Any) -> str:
    """``value`` if it may name a new ``field`` (``"table name"``, ``"column name"``,
    ``"tunnel name"``), else ``InvalidNameError``."""
    _refuse(value, InvalidNameError, field=field, value=value)
    return str(value)


def check_new_tunnel_name(name: Any, table: str) -> str:
    """``name`` if it may name a new tunnel on ``table``, else ``InvalidTunnelNameError``."""
    _refuse(name, InvalidTunnelNameError, field="tunnel name", value=name, tunnel=name,
            table=table)
    return str(name)


def check_table(table: Any, endpoint: str) -> None:
    """A table name being looked up: ``InvalidTableNameError`` if it cannot name one."""
    _refuse(table, InvalidTableNameError, table=table, endpoint=endpoint)


def check_tunnel(tunnel: Any, table: str = "(any table)") -> None:
    """A tunnel id or name being looked up: ``InvalidTunnelIdError`` if it cannot name one."""
    _refuse(tunnel, InvalidTunnelIdError, tunnel=tunnel, table=table)


def check_channel(channel_id: Any, tunnel_id: str) -> None:
    """A channel id being looked up: ``InvalidChannelIdError`` if it cannot name one."""
    _refuse(channel_id, InvalidChannelIdError, channel_id=channel_id, tunnel_id=tunnel_id)


__all__ = ["InvalidChannelIdError", "InvalidNameError", "InvalidTableNameError",
           "InvalidTunnelIdError", "InvalidTunnelNameError", "check_channel", "check_new_name",
           "check_new_tunnel_name", "check_table", "check_tunnel", "name_problem"]
