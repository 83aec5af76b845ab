"""How every ``tablestore-cdc`` command reports a problem: one ``error: ...`` line on stderr and
exit code 2, never a traceback. Shared by the local-store, meta, job and dashboard commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer

from connector.errors import CdcError


def fail(message: object) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn the product's errors (and an unreadable file) into ``error: ...`` + exit code 2."""
    try:
        yield
    except CdcError as exc:
        fail(exc)
    except OSError as exc:
        fail(f"{type(exc).__name__}: {exc}")
