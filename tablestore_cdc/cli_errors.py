"""How every ``tablestore-cdc`` command reports a problem: one ``error: ...`` line on stderr and
exit code 2, never a traceback unless ``--verbose`` asks for it. Shared by the local-store,
meta, job, emulator and dashboard commands.

- ``fail(message)`` / ``reported_errors()``: the commands' own refusals and the product's
  typed errors (``CdcError``), and an unreadable file;
- ``OneLineErrors``: the top-level command group (``tablestore_cdc/cli.py``); whatever else a
  command raises -- a bug -- also ends in one line naming the exception, and the flag that
  shows its trace;
- ``set_verbose``: ``tablestore-cdc --verbose`` (or ``TABLESTORE_CDC_VERBOSE=1``) prints the
  Python traceback above the ``error:`` line, for a bug report.
"""

from __future__ import annotations

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


class OneLineErrors(TyperGroup):
    """The ``tablestore-cdc`` group: an exception a command lets through (not click's own
    usage errors and exits) is reported by ``fail`` -- one line, exit code 2 -- instead of
    typer's traceback."""

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
