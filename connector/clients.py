"""The one place the source opens its tunnel and meta-store clients (driver and executors).

Who opens what here:

- the driver's planning process: ``StreamProtocol`` (its tunnel), ``connector.planning.binding``
  (the meta store), the range read's planning and ``TablestoreDataSource.schema`` (a tunnel),
  each through a ``Clients``;
- executors: ``connector.reader`` (a channel's read) and the range read's tasks take their
  clients from the process's ``ExecutorClients`` (``executor_clients()``): Python workers are
  reused across tasks, so a client is opened once per endpoint and kept -- at most
  ``POOL_SIZE`` of each kind, the least recently used closed when one more is needed, every
  one closed when the interpreter exits normally (a PySpark daemon worker leaves with
  ``os._exit``: the system closes its sockets). Pool keys hold no credential: the endpoint
  without secrets and a digest of the secrets keyed with bytes drawn once per process.

Every client is wrapped once, here: bounded retries of transient errors (``connector.retry``)
around the fault hook, when one is set, around the backend's client. The range read gets the
same retries as the rest.

The collaborators tests inject (``ClientHooks``) -- the product path calls no test module:

- ``clock``: seconds since the epoch for the driver's time-based decisions
  (``maxTriggerDelay``, the AvailableNow bound, a manifest's ``planned_at``); ``time.time``, a
  test passes its own;
- ``fault_hook``: a callable wrapping each client as it is opened (the fault harness's
  transient errors, ``testkit/flaky.py``). None in production. A process the harness starts
  names it in ``TABLESTORE_CDC_FAULT_HOOK`` (``module:callable``), which Spark hands on to
  its Python workers; read each time a client is opened.

The crash points are not here: ``connector.crash_hook`` is their seam.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cdc_common.uris import redact_uri
from connector.retry import with_retries
from connector.tunnel import ChannelReader, TunnelEndpoint, TunnelService, open_tunnel_service
from meta_store import MetaStore, open_meta_store

#: names the fault hook (``module:callable``) of a process the fault harness started
FAULT_HOOK_ENV = "TABLESTORE_CDC_FAULT_HOOK"
#: clients of each kind an executor's pool keeps open
POOL_SIZE = 8

Client = TypeVar("Client")


class Clock(Protocol):
    """Seconds since the epoch (``time.time``'s contract)."""

    def __call__(self) -> float: ...


class FaultHook(Protocol):
    """Wraps a client as it is opened (a tunnel or meta-store client; returns it or a proxy)."""

    def __call__(self, client: Any) -> Any: ...


@dataclass(frozen=True)
class ClientHooks:
    """The seam's injected collaborators (module docstring)."""

    clock: Clock = time.time
    fault_hook: FaultHook | None = None

    @classmethod
    def from_environment(cls) -> ClientHooks:
        """The wall clock, and the fault hook ``TABLESTORE_CDC_FAULT_HOOK`` names (none when it
        is unset: production)."""
        target = os.environ.get(FAULT_HOOK_ENV, "").strip()
        if not target:
            return cls()
        module, _, name = target.partition(":")
        hook: FaultHook = getattr(importlib.import_module(module), name)
        return cls(fault_hook=hook)

    def wrap(self, client: Client) -> Client:
        """``client`` as the source uses it: the fault hook's proxy (if any), retried."""
        if self.fault_hook is not None:
            client = self.fault_hook(client)
        return with_retries(client)


class Clients:
    """Opens one query's clients on the driver, each wrapped once (``ClientHooks.wrap``).
    ``hooks``: injected by tests; by default read from the environment at each opening."""

    def __init__(self, hooks: ClientHooks | None = None) -> None:
        self._hooks = hooks

    @property
    def hooks(self) -> ClientHooks:
        return self._hooks if self._hooks is not None else ClientHooks.from_environment()

    @property
    def clock(self) -> Clock:
        return self.hooks.clock

    def tunnel(self, endpoint: TunnelEndpoint | str) -> TunnelService:
        """A client of every role of the tunnel service at ``endpoint``."""
        return self.hooks.wrap(open_tunnel_service(endpoint))

    def meta_store(self, uri: str, credentials: Mapping[str, str] | None = None, *,
                   create: bool = True) -> MetaStore:
        """The meta store at ``uri`` (``meta_store.open_meta_store``)."""
        return self.hooks.wrap(open_meta_store(uri, credentials, create=create))


class ExecutorClients:
    """The clients of one executor process, by endpoint (module docstring). Thread-safe."""

    def __init__(self, size: int = POOL_SIZE, clients: Clients | None = None) -> None:
        self._size = size
        self._clients = clients or Clients()
        self._lock = threading.Lock()
        self._tunnels: OrderedDict[tuple[str, ...], TunnelService] = OrderedDict()
        self._metas: OrderedDict[tuple[str, ...], MetaStore] = OrderedDict()

    def tunnel(self, endpoint: TunnelEndpoint | str) -> TunnelService:
        """The process's client of ``endpoint`` (every role: the range read's tasks)."""
        return self._pooled(self._tunnels, tunnel_key(endpoint),
                            lambda: self._clients.tunnel(endpoint))

    def reader(self, endpoint: TunnelEndpoint | str) -> ChannelReader:
        """The process's client of ``endpoint``, as the streaming read uses it: reading only."""
        return self.tunnel(endpoint)

    def meta_store(self, uri: str, credentials: Mapping[str, str] | None = None) -> MetaStore:
        """The process's client of the meta store at ``uri``."""
        return self._pooled(self._metas, meta_key(uri, credentials),
                            lambda: self._clients.meta_store(uri, credentials or None))

    def _pooled(self, pool: OrderedDict[tuple[str, ...], Any], key: tuple[str, ...],
                open_client: Callable[[], Any]) -> Any:
        with self._lock:
            client = pool.get(key)
            if client is not None:
                pool.move_to_end(key)
                return client
        opened = open_client()  # outside the lock: opening may make a request
        with self._lock:
            client = pool.setdefault(key, opened)
            pool.move_to_end(key)
            evicted = [pool.popitem(last=False)[1] for _ in range(len(pool) - self._size)]
        for extra in ([opened] if client is not opened else []) + evicted:
            extra.close()
        return client

    def close(self) -> None:
        """Close every pooled client (at exit; tests that switch hooks)."""
        with self._lock:
            clients: list[TunnelService | MetaStore] = [*self._tunnels.values(),
                                                        *self._metas.values()]
            self._tunnels.clear()
            self._metas.clear()
        for client in clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best effort at exit
                pass


_POOL: ExecutorClients | None = None
_POOL_LOCK = threading.Lock()


def executor_clients() -> ExecutorClients:
    """This process's pool (made on first use; closed at a normal interpreter exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ExecutorClients()
            atexit.register(_POOL.close)
        return _POOL


# --- keys without credentials ---------------------------------------------------------------

#: the key of the pool's digests: drawn once per process, so a digest means nothing elsewhere
_DIGEST_KEY = os.urandom(32)


def secrets_digest(values: tuple[str, ...]) -> str:
    """A keyed digest standing for ``values`` in a pool key (never the values themselves)."""
    data = "\0".join(values).encode()
    return hashlib.blake2b(data, key=_DIGEST_KEY, digest_size=16).hexdigest()


def tunnel_key(endpoint: TunnelEndpoint | str) -> tuple[str, ...]:
    """The pool key of a tunnel endpoint: its URI without secrets and a digest of them."""
    if isinstance(endpoint, TunnelEndpoint):
        return (type(endpoint).__name__, endpoint.uri, secrets_digest(endpoint.secret_values()))
    return ("uri", redact_uri(endpoint), secrets_digest((endpoint,)))


def meta_key(uri: str, credentials: Mapping[str, str] | None) -> tuple[str, ...]:
    """The pool key of a meta store: its URI (it never holds a secret) and a digest of the
    credentials it is opened with."""
    return (uri, secrets_digest(tuple(f"{k}={v}" for k, v in sorted((credentials or {}).items()))))


__all__ = ["FAULT_HOOK_ENV", "POOL_SIZE", "ClientHooks", "Clients", "Clock", "ExecutorClients",
           "FaultHook", "executor_clients", "meta_key", "secrets_digest",
           "tunnel_key"]
