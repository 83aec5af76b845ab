"""Fault injection for the harness (integration/faults). Inert in production.

Two kinds of fault (and a clock the tests move), both switched on only by environment
variables the harness sets on the Spark driver it starts (Spark passes the environment on to
its Python workers and, in ``local-cluster`` mode, to the executor JVMs and their workers):

**Crash points.** ``fault_point(name)`` is called at protocol steps on the driver and on
executors. It does nothing unless ``TABLESTORE_CDC_FAULT_DIR`` names a directory holding a file
``arm-<name>``. Then it consumes that file (an atomic rename to ``fired-<name>``: one process
fires it, once), writes ``hit-<name>`` (the process id) and acts on the armed file's content:

- empty or ``park``: block forever, so the harness can SIGKILL the whole Spark process tree
  while the process is parked exactly at that step;
- ``raise``: raise ``InjectedFault`` (a task failure on an executor; Spark retries the task when
  the master allows retries, e.g. ``local[2,4]``);
- ``hold``: pickle the call's ``context`` (e.g. the input partition being read) to
  ``hit-<name>.pkl`` and block until the harness creates ``release-<name>``, then go on. The
  harness uses the pause to run a concurrent duplicate of the same read.

**Transient errors.** ``inject_transient_errors(client)`` wraps a tunnel-service or meta-store
client so that, when ``TABLESTORE_CDC_FLAKY`` holds a rate (e.g. ``0.1``), about that share of
its calls raise the client's retryable error (``TransientTunnelError`` /
``TransientMetaStoreError``): half of them *before* the real call, half *after* it (the call
took effect but the caller sees an error: the nastiest case for a retry). At most
``MAX_INJECTED_IN_A_ROW`` calls in a row fail, so an error stays transient and the bounded retry
layer (``connector.retry``) always gets through (a rate of 1 fails every call exactly that many
times, then lets it through). ``TABLESTORE_CDC_FLAKY_SEED`` seeds the choice
(mixed with the process id: each process draws its own sequence). Without the variable the client
is returned unchanged. Every injection is appended to ``flaky.log`` in the fault directory, when
one is set, so the harness can count them.

**The planner's clock.** ``clock()`` is ``time.time()``, plus the seconds written in the file
``clock-offset`` of the fault directory when the harness or a test put one there: the driver's
time-based decisions (``maxTriggerDelay``, the AvailableNow bound, manifests' ``planned_at``)
read it, so a test makes time pass without waiting.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import threading
import time
from typing import Any, TypeVar

from connector.errors import CdcError, TransientMetaStoreError, TransientTunnelError
from connector.proxy import ClientProxy

FAULT_DIR_ENV = "TABLESTORE_CDC_FAULT_DIR"
FLAKY_ENV = "TABLESTORE_CDC_FLAKY"
FLAKY_SEED_ENV = "TABLESTORE_CDC_FLAKY_SEED"
FLAKY_LOG = "flaky.log"
#: in the fault directory: seconds added to the planner's clock (``clock``)
CLOCK_OFFSET_FILE = "clock-offset"

#: an injected error never hits more calls in a row than this (the retry layer makes 6 attempts)
MAX_INJECTED_IN_A_ROW = 3
#: how long a ``hold`` waits for its release before going on by itself
HOLD_TIMEOUT_S = 600.0

#: Every named point, for the harness and the docs (where it runs: what is durable there).
POINTS = (
    # driver: the previous batch is in Spark's commit log; the source's commit of it (the
    # catch-up in latestOffset, and Spark's own later commit() call) has not run yet
    "latest_offset_start",
    # driver: end UUID minted, before Spark writes its offset log
    "after_latest_offset",
    # driver: Spark's offset log holds the batch; its manifest may not be written yet
    "plan_start",
    # executor: the channel's records are fetched, its end is not claimed yet
    "read_before_claim",
    # executor: end checkpoint claimed, before rows are handed out
    "mid_read",
    # driver (foreachBatch): batch stored (all its ends recorded), Spark's commit log not written
    "after_sink_write",
    # driver: Spark's commit log holds the batch; nothing of it is pushed to the tunnel yet
    "commit_start",
    # driver: some channels' checkpoints pushed, others not
    "mid_commit_push",
    # driver (the Delta/Iceberg apply sink, tablestore_cdc.lakehouse): the batch's commit is
    # prepared (Iceberg: its data files written) but not committed
    "before_target_commit",
    # driver (the apply sink): the batch committed into the table; Spark's commit log not written
    "after_target_commit",
)

log = logging.getLogger("connector.faults")


class InjectedFault(RuntimeError):
    """Raised by a crash point armed with ``raise``: a failure the harness asked for."""


def fault_point(name: str, context: Any = None) -> None:
    """A crash point (driver or executor); a no-op unless the harness armed ``name``."""
    directory = os.environ.get(FAULT_DIR_ENV)
    if not directory:
        return
    armed = os.path.join(directory, f"arm-{name}")
    fired = os.path.join(directory, f"fired-{name}")
    try:
        os.rename(armed, fired)  # atomic: fires once
    except FileNotFoundError:
        return
    with open(fired) as f:
        mode = f.read().strip() or "park"
    hit = os.path.join(directory, f"hit-{name}")
    if mode == "hold" and context is not None:
        with open(hit + ".pkl.tmp", "wb") as f:
            pickle.dump(context, f)
        os.rename(hit + ".pkl.tmp", hit + ".pkl")
    with open(hit + ".tmp", "w") as marker:  # renamed: the harness never sees it empty
        marker.write(str(os.getpid()))
    os.rename(hit + ".tmp", hit)
    if mode == "raise":
        raise InjectedFault(f"injected fault at {name} (pid {os.getpid()})")
    if mode == "hold":
        release = os.path.join(directory, f"release-{name}")
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    while True:  # parked until the harness kills the process tree
        time.sleep(1)


def clock() -> float:
    """Seconds since the epoch as the driver's planner sees them (module docstring)."""
    now = time.time()
    directory = os.environ.get(FAULT_DIR_ENV)
    if directory:
        try:
            with open(os.path.join(directory, CLOCK_OFFSET_FILE)) as f:
                now += float(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            pass
    return now


# --- transient errors ------------------------------------------------------------------------

Client = TypeVar("Client")

#: methods never made to fail: housekeeping, not service calls
_NEVER_FLAKY = frozenset({"close"})


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
    ``TransientMetaStoreError``. Called where clients are opened (driver and executors)."""
    rate_text = os.environ.get(FLAKY_ENV, "").strip()
    if not rate_text:
        return client
    rate = float(rate_text)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{FLAKY_ENV}={rate_text!r}: expected a rate in [0, 1]")
    if rate == 0.0:
        return client
    from connector.tunnel.base import TunnelService

    error: type[CdcError]
    if isinstance(client, TunnelService):
        error = TransientTunnelError
    else:
        from meta_store.base import MetaStore

        if not isinstance(client, MetaStore):
            raise TypeError(f"cannot inject transient errors into {client!r}")
        error = TransientMetaStoreError
    log.warning("injecting transient errors into %.0f%% of calls of %r", rate * 100, client)
    seed = os.environ.get(FLAKY_SEED_ENV, "0")
    return _FlakyClient(client, error, rate, seed)  # type: ignore[return-value]
