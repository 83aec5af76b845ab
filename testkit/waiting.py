"""The one way tests wait: poll until a condition holds, or fail saying what never happened.

``wait_until(what, probe, until=...)`` calls ``probe()`` every ``interval`` seconds until
``until(value)`` is true and returns that value. On the deadline it raises ``TimeoutError``
naming what was awaited and the last value ``probe`` returned, so a failed wait reads
"timed out after 120s waiting for 90 rows in the sink; last seen: 62", not "condition not
reached". It fails early, with the reason, when a ``process`` it depends on exits or a Spark
``query`` it watches has failed.

Standard library only: also imported by scripts that run in other interpreters (the Spark
Connect client, child processes started from the repository root).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _exited(process: Any) -> int | None:
    """The exit code of a ``subprocess.Popen`` or ``multiprocessing.Process``; None if alive."""
    if hasattr(process, "poll"):
        return process.poll()
    return None if process.is_alive() else process.exitcode


def wait_until(what: str, probe: Callable[[], T], until: Callable[[T], bool] = bool, *,
               timeout: float, interval: float = 0.2, process: Any = None,
               query: Any = None) -> T:
    """Poll ``probe()`` until ``until(value)``; return the value.

    ``what``: what is awaited, as the timeout message shows it ("the first batch in the
    sink"). ``until`` defaults to truthiness, so a boolean probe needs nothing more.
    ``process``: a child process the wait depends on: its exit fails the wait at once.
    ``query``: a Spark ``StreamingQuery``: its ``exception()`` fails the wait at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        if query is not None and query.exception() is not None:
            raise AssertionError(f"query failed while waiting for {what}: {query.exception()}")
        value = probe()
        if until(value):
            return value
        if process is not None and (code := _exited(process)) is not None:
            raise AssertionError(f"process exited with {code} while waiting for {what}; "
                                 f"last seen: {value!r}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; "
                               f"last seen: {value!r}")
        time.sleep(interval)
