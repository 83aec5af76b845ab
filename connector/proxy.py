"""A transparent proxy around a tunnel or meta-store client, wrapping its public method calls.

Base of the retry layer (``connector.retry``) and the fault harness's transient-error injection
(``testkit/flaky.py``): subclasses decide, per call, what happens around the real method.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class ClientProxy:
    #: method names passed through untouched (housekeeping, not service calls)
    passthrough: frozenset[str] = frozenset({"close"})

    def __init__(self, target: Any) -> None:
        self._target = target

    def _call(self, name: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one call of the target's ``name``; subclasses wrap it."""
        return method(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name.startswith("_") or name in self.passthrough or not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, attr, *args, **kwargs)

        return call

    @property
    def wrapped(self) -> Any:
        """The client underneath (for tests and diagnostics)."""
        return self._target

    def close(self) -> None:
        self._target.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
