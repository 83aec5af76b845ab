"""A clock that moves only when the code under test sleeps on it.

Code that waits (retry backoff, deadlines) takes its clock and its sleep as arguments, with the
real ``time.monotonic`` and ``time.sleep`` as defaults. A test passes ``FakeClock().monotonic``
and ``FakeClock().sleep`` instead and asserts on the logical time that passed: how long the
code chose to wait, free of how loaded the machine is.
"""

from __future__ import annotations


class FakeClock:
    """``monotonic()`` reads the logical time; ``sleep(s)`` records ``s`` and advances by it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        #: every sleep asked for, in order
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds)
