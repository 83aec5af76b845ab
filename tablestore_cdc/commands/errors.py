"""How every ``tablestore-cdc`` command reports a problem: one ``error: ...`` line on stderr and
exit code 2, never a traceback unless ``--verbose`` asks for it. Shared by the local-store,
meta, job, emulator and dashboard commands.

- ``fail(message)`` / ``reported_errors()``: the commands' own refusals and the product's
  typed errors (``CdcError``), and an unreadable file;
- ``OneLineErrors``: the top-level command group (``commands/app.py``); whatever else a
  command raises -- a bug -- also ends in one line naming the exception, and the flag that
  shows its trace; a text argument that is not text (``refuse_bad_text``) is one line naming
  the flag or argument;
- ``set_verbose``: ``tablestore-cdc --verbose`` (or ``TABLESTORE_CDC_VERBOSE=1``) prints the
  Python traceback above the ``error:`` line, for a bug report.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from connector.errors import CdcError

_verbose = False


def set_verbose(on: bool) -> None:
    """Whether errors print their traceback too (the top-level ``--verbose``)."""
    global _verbose
    _verbose = on


def fail(message: object, code: int = 2) -> NoReturn:
    """``error: <message>`` on stderr (the first line of a message that has several) and exit
    ``code`` (2: bad input); with ``--verbose``, the traceback of the exception being handled
    first."""
    if _verbose and sys.exc_info()[1] is not None:
        traceback.print_exc(file=sys.stderr)
    lines = [line for line in str(message).splitlines() if line.strip()] or [""]
    typer.echo(f"error: {lines[0]}", err=True)
    raise typer.Exit(code)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn the product's errors (and an unreadable file) into ``error: ...`` + exit code 2,
    or the error's own ``exit_code`` when its class sets one."""
    try:
        yield
    except CdcError as exc:
        fail(exc, getattr(exc, "exit_code", 2))
    except OSError as exc:
        fail(f"{type(exc).__name__}: {exc}")


#: what a text argument may not hold: lone surrogates (a byte of the command line that is not
#: UTF-8 arrives as U+DC80..U+DCFF) and control characters but tab, LF and CR (a JSON value
#: of ``--option`` may span lines)
_NOT_IN_ARGUMENTS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
#: how many command groups deep ``refuse_bad_text`` follows the command line
_MAX_GROUPS = 8


def argument_problem(text: str) -> str | None:
    """Why a command-line value cannot be taken as text, else None."""
    found = _NOT_IN_ARGUMENTS.search(text)
    if found is None:
        return None
    char, at = found.group(), found.start()
    if "\udc80" <= char <= "\udcff":
        return f"byte 0x{ord(char) - 0xDC00:02X} at position {at} is not UTF-8"
    if "\ud800" <= char <= "\udfff":
        return f"a lone surrogate U+{ord(char):04X} at position {at}"
    return f"a control character U+{ord(char):04X} at position {at}"


def _label(param: Any) -> str:
    if getattr(param, "param_type_name", "") == "option" and param.opts:
        return str(max(param.opts, key=len))
    return f"argument {getattr(param, 'human_readable_name', None) or str(param.name).upper()}"


def refuse_bad_text(command: Any, ctx: Any, args: list[str]) -> None:
    """``fail`` (one line naming the flag or argument) on the first text value of the command
    line that ``argument_problem`` refuses: the line parsed by the commands' own parsers, group
    by group down to the command, before any of them runs (paths too: SQLite and URIs take
    UTF-8 only). Whatever the parsers cannot parse is left to the real parse to report."""
    try:
        problem = _first_bad_text(command, ctx, list(args))
    except Exception:  # noqa: BLE001 - a check ahead of the real parse never breaks it
        problem = None
    if problem is not None:
        fail(problem)


def _first_bad_text(command: Any, ctx: Any, args: list[str]) -> str | None:
    """``refuse_bad_text``'s walk: the first refused value as ``FLAG: problem``, else None."""
    for _ in range(_MAX_GROUPS):
        opts, rest, order = command.make_parser(ctx).parse_args(args=list(args))
        for param in order:
            value = opts.get(param.name) if param.name else None
            for text in value if isinstance(value, list | tuple) else [value]:
                problem = argument_problem(text) if isinstance(text, str) else None
                if problem is not None:
                    return f"{_label(param)}: {problem}"
        if not hasattr(command, "get_command") or not rest:
            return None  # a command (not a group), or a group given no sub-command
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return None
        ctx = type(ctx)(sub, parent=ctx, info_name=rest[0])
        command, args = sub, rest[1:]
    return None


class OneLineErrors(TyperGroup):
    """The ``tablestore-cdc`` group: an exception a command lets through (not click's own
    usage errors and exits) is reported by ``fail`` -- one line, exit code 2 -- instead of
    typer's traceback; a text argument that is not text is refused first
    (``refuse_bad_text``)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:  # not shell completion
            refuse_bad_text(self, ctx, list(args))
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except CdcError as exc:
            fail(exc)
        except Exception as exc:  # noqa: BLE001 - the one place a bug reaches the user
            hint = "" if _verbose else "; rerun with --verbose for the trace"
            fail(f"unexpected {type(exc).__name__}: {_first_line(exc)} (a bug{hint})")
        finally:
            set_verbose(False)  # per invocation (tests invoke the app many times in a process)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"
