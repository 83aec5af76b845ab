"""Transient errors injected into the source's service calls: the fault harness's fault hook.

``inject_transient_errors(client)`` is a fault hook of the product's client seam
(``connector.clients.ClientHooks.fault_hook``): the seam calls it on every tunnel-service and
meta-store client it opens, inside its retries. When ``TABLESTORE_CDC_FLAKY`` holds a rate (e.g.
``0.1``), about that share of the client's calls raise its retryable error
(``TransientTunnelError`` / ``TransientMetaStoreError``): half of them *before* the real call,
half *after* it (the call took effect but the caller sees an error: the nastiest case for a
retry). At most ``MAX_INJECTED_IN_A_ROW`` calls in a row fail, so an error stays transient and
the bounded retry layer (``connector.retry``) always gets through (a rate of 1 fails every call
exactly that many times, then lets it through). ``TABLESTORE_CDC_FLAKY_SEED`` seeds the choice
(mixed with the process id: each process draws its own sequence). Without the rate the client
is returned unchanged. Every injection is appended to ``flaky.log`` in the fault directory
(``TABLESTORE_CDC_FAULT_DIR``), when one is set, so the harness can count them.

How a query's processes get it: ``environment(rate, seed)`` is what the harness adds to the
environment of the Spark driver it starts -- the rate, the seed, and
``TABLESTORE_CDC_FAULT_HOOK`` naming this function -- which Spark hands on to its Python workers
(``PYTHONPATH`` names the checkout, so they import ``testkit``); a test in one process
monkeypatches the same variables.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from pathlib import Path
from typing import Any, TypeVar

from connector.clients import FAULT_HOOK_ENV
from connector.errors import CdcError, TransientMetaStoreError, TransientTunnelError
from connector.proxy import ClientProxy
from connector.tunnel import TunnelService
from meta_store import MetaStore
from testkit.crash_points import FAULT_DIR_ENV

FLAKY_ENV = "TABLESTORE_CDC_FLAKY"
FLAKY_SEED_ENV = "TABLESTORE_CDC_FLAKY_SEED"
FLAKY_LOG = "flaky.log"
#: what ``TABLESTORE_CDC_FAULT_HOOK`` holds to switch this hook on
HOOK = f"{__name__}:inject_transient_errors"
#: an injected error never hits more calls in a row than this (the retry layer makes 6 attempts)
MAX_INJECTED_IN_A_ROW = 3
#: the checkout (``testkit``'s parent): Python workers import this module from there
REPO = Path(__file__).resolve().parent.parent

log = logging.getLogger("testkit.flaky")

Client = TypeVar("Client")

#: methods never made to fail: housekeeping, not service calls
_NEVER_FLAKY = frozenset({"close"})


def environment(rate: float, seed: str) -> dict[str, str]:
    """The variables that switch the injection on in a query's processes (module docstring)."""
    path = os.environ.get("PYTHONPATH", "")
    return {FAULT_HOOK_ENV: HOOK, FLAKY_ENV: str(rate), FLAKY_SEED_ENV: seed,
            "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


class _FlakyClient(ClientProxy):
    """Proxy that makes ~``rate`` of the public calls of ``target`` raise ``error``."""

    passthrough = _NEVER_FLAKY

    def __init__(self, target: Any, error: type[CdcError], rate: float, seed: str) -> None:
        super().__init__(target)
        self._error = error
        self._rate = rate
        self._rng = random.Random(f"{seed}:{os.getpid()}:{error.__name__}")
        self._lock = threading.Lock()
        self._in_a_row = 0
        self._log_dir = os.environ.get(FAULT_DIR_ENV)

    def _draw(self) -> str | None:
        """``before``, ``after`` or ``None`` (no injection) for the next call."""
        with self._lock:
            roll = self._rng.random()
            if self._in_a_row >= MAX_INJECTED_IN_A_ROW or roll >= self._rate:
                self._in_a_row = 0
                return None
            self._in_a_row += 1
            return "before" if roll < self._rate / 2 else "after"

    def _injected(self, when: str, method: str) -> CdcError:
        if self._log_dir:
            try:
                with open(os.path.join(self._log_dir, FLAKY_LOG), "a") as f:
                    f.write(f"{os.getpid()} {self._error.__name__} {when} {method}\n")
            except OSError:
                pass
        return self._error(detail=f"injected {when} {method} (TABLESTORE_CDC_FLAKY)")

    def _call(self, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        when = self._draw()
        if when == "before":
            raise self._injected(when, name)
        result = method(*args, **kwargs)
        if when == "after":
            raise self._injected(when, name)
        return result

    def __repr__(self) -> str:
        return f"<flaky {self._rate:.0%} {self._target!r}>"


def inject_transient_errors(client: Client) -> Client:
    """``client`` itself, or (when ``TABLESTORE_CDC_FLAKY`` is set) a proxy injecting transient
    errors into its calls. Tunnel clients get ``TransientTunnelError``, meta stores
    ``TransientMetaStoreError``. The seam calls it where clients are opened (driver and
    executors)."""
    rate_text = os.environ.get(FLAKY_ENV, "").strip()
    if not rate_text:
        return client
    rate = float(rate_text)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{FLAKY_ENV}={rate_text!r}: expected a rate in [0, 1]")
    if rate == 0.0:
        return client
    error: type[CdcError]
    if isinstance(client, TunnelService):
        error = TransientTunnelError
    elif isinstance(client, MetaStore):
        error = TransientMetaStoreError
    else:
        raise TypeError(f"cannot inject transient errors into {client!r}")
    log.warning("injecting transient errors into %.0f%% of calls of %r", rate * 100, client)
    seed = os.environ.get(FLAKY_SEED_ENV, "0")
    return _FlakyClient(client, error, rate, seed)  # type: ignore[return-value]


__all__ = ["FLAKY_ENV", "FLAKY_LOG", "FLAKY_SEED_ENV", "HOOK", "MAX_INJECTED_IN_A_ROW",
           "environment", "inject_transient_errors"]
