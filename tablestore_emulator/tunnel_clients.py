"""The Tunnel service's client state machine: which connected worker owns which channel.

What the official SDKs' tunnel workers expect from ConnectTunnel / Heartbeat / ShutdownTunnel
(Go ``tunnel/worker.go``, ``tunnel/state.go``, ``tunnel/channel.go``; Java
``tunnel/worker/TunnelWorker.java``, ``TunnelStateMachine.java``, ``ChannelConnect.java``):

- Connect hands out a client id and records the client's heartbeat timeout (``ClientConfig
  .timeout``, seconds; 300 when absent, the SDKs' default).
- A heartbeat carries the client's view of its channels, ``(id, version, status)``; the answer
  is the server's view of the channels that client owns. Both sides keep whichever copy of a
  channel has the higher version, so every change the server makes bumps the version.
- Each channel readable now (the store's ``OPEN``) is owned by at most one connected client,
  and channels are balanced: with ``m`` channels and ``n`` clients each gets ``m // n``, the
  first ``m % n`` to ask one more. A client below its share gets free channels at once; when
  none are free the server marks a channel of the most loaded client ``CLOSING`` (that client
  stops it and reports ``CLOSE`` at version + 1, which frees it).
- A client that reports a channel ``CLOSE`` at a higher version gives it up (the SDKs do so
  when a channel's processor failed, or on ``CLOSING``); the channel is free and is handed out
  again, to the same client too, as ``OPEN`` at a still higher version.
- A channel the store shows ``TERMINATED`` (its ``"finished"`` checkpoint was pushed: finished
  parents, base-data channels) becomes ``TERMINATED`` at version + 1 and is owned by nobody
  new. A client reporting ``TERMINATED`` for a channel whose ``"finished"`` was never pushed
  gives it up, as with ``CLOSE`` (the store decides when a channel ends).
- A client that sends no heartbeat for longer than its timeout is dropped, and its channels
  are free (version + 1); ShutdownTunnel drops a client at once. A heartbeat from a client id
  that was never connected, was shut down or was dropped is refused with ``ClientGone``: the
  emulator answers it 410 ``OTSResourceGone``, on which the Go worker reconnects at once and
  the Java worker after its own heartbeat timeout (both treat ``OTSParameterInvalid`` as "the
  tunnel is invalid" and stop for good).

Reads, GetCheckpoint and Checkpoint do not go through this object: they accept any client id,
connected or not (the vendor's Spark connector and this project's client never connect).

State is in memory, per emulator process: after an emulator restart every client is unknown
and reconnects. Time comes from ``clock`` (``time.monotonic`` unless a test passes its own),
so tests move time instead of sleeping out timeouts.

Who calls it: ``tablestore_emulator.tunnel_api`` (connect, heartbeat, shutdown, describe,
getrpo, delete), holding no other lock; this object has its own.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

OPEN, CLOSING, CLOSE, TERMINATED = "OPEN", "CLOSING", "CLOSE", "TERMINATED"
#: the heartbeat timeout of a client whose Connect names none (the SDKs' default, seconds)
DEFAULT_TIMEOUT_S = 300


class ClientGone(Exception):
    """A heartbeat from a client id this tunnel does not know (now)."""

    def __init__(self, tunnel_id: str, client_id: str, reason: str) -> None:
        super().__init__(f"client {client_id} of tunnel {tunnel_id} is gone: {reason}")
        self.tunnel_id, self.client_id, self.reason = tunnel_id, client_id, reason


@dataclass(frozen=True)
class ChannelState:
    """A channel as a heartbeat carries it (``Channel{channel_id, version, status}``)."""

    channel_id: str
    version: int
    status: str


@dataclass
class _Client:
    client_id: str
    timeout_s: float
    last_seen: float


@dataclass
class _Channel:
    version: int = 0
    status: str = CLOSE  # free: nobody owns it
    owner: str | None = None


@dataclass
class _Tunnel:
    clients: dict[str, _Client] = field(default_factory=dict)  # in connect order
    channels: dict[str, _Channel] = field(default_factory=dict)
    #: why a client id that was known is no longer (for the refusal's message)
    gone: dict[str, str] = field(default_factory=dict)


class TunnelClients:
    """Connected clients and channel ownership of every tunnel of one emulator."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._tunnels: dict[str, _Tunnel] = {}

    # --- the RPCs -------------------------------------------------------------------------

    def connect(self, tunnel_id: str, timeout_s: float | None = None, tag: str = "") -> str:
        """A new client of ``tunnel_id``; returns its id."""
        with self._lock:
            tunnel = self._tunnels.setdefault(tunnel_id, _Tunnel())
            self._expire(tunnel)
            client_id = f"{tag or 'client'}-{uuid.uuid4().hex[:16]}"
            timeout = float(timeout_s) if timeout_s and timeout_s > 0 else DEFAULT_TIMEOUT_S
            tunnel.clients[client_id] = _Client(client_id, timeout, self.clock())
            return client_id

    def heartbeat(
        self,
        tunnel_id: str,
        client_id: str,
        reported: Iterable[ChannelState],
        readable: Collection[str],
        terminated: Collection[str],
    ) -> list[ChannelState]:
        """Apply the client's report, rebalance, and return the server's view of the
        channels this client owns (sorted by id). ``readable`` / ``terminated``: the store's
        OPEN and TERMINATED channels of the tunnel now. ``ClientGone`` for an unknown id."""
        with self._lock:
            tunnel = self._tunnels.setdefault(tunnel_id, _Tunnel())
            self._expire(tunnel)
            client = tunnel.clients.get(client_id)
            if client is None:
                reason = tunnel.gone.get(client_id, "it never connected")
                raise ClientGone(tunnel_id, client_id, reason)
            client.last_seen = self.clock()
            self._sync(tunnel, readable, terminated)
            for report in reported:
                self._apply(tunnel, client_id, report)
            self._balance(tunnel)
            return [ChannelState(cid, ch.version, ch.status)
                    for cid, ch in sorted(tunnel.channels.items()) if ch.owner == client_id]

    def shutdown(self, tunnel_id: str, client_id: str) -> None:
        """Drop the client now and free its channels (an unknown id: nothing to do)."""
        with self._lock:
            tunnel = self._tunnels.get(tunnel_id)
            if tunnel is not None and client_id in tunnel.clients:
                self._drop(tunnel, client_id, "it shut down")

    # --- what describe and getrpo show ----------------------------------------------------

    def owners(self, tunnel_id: str) -> dict[str, str]:
        """Channel id -> the id of the client that owns it now (connected clients only)."""
        with self._lock:
            tunnel = self._tunnels.get(tunnel_id)
            if tunnel is None:
                return {}
            self._expire(tunnel)
            return {cid: ch.owner for cid, ch in tunnel.channels.items()
                    if ch.owner is not None}

    def forget(self, tunnel_id: str) -> None:
        """The tunnel was deleted: its clients and channels go with it."""
        with self._lock:
            self._tunnels.pop(tunnel_id, None)

    # --- the rules ------------------------------------------------------------------------

    def _expire(self, tunnel: _Tunnel) -> None:
        now = self.clock()
        for client in list(tunnel.clients.values()):
            if now - client.last_seen > client.timeout_s:
                self._drop(tunnel, client.client_id,
                           f"no heartbeat for more than its {client.timeout_s:g} s timeout")

    def _drop(self, tunnel: _Tunnel, client_id: str, reason: str) -> None:
        del tunnel.clients[client_id]
        tunnel.gone[client_id] = reason
        for ch in tunnel.channels.values():
            if ch.owner == client_id:
                ch.owner = None
                if ch.status != TERMINATED:
                    ch.status, ch.version = CLOSE, ch.version + 1

    @staticmethod
    def _sync(tunnel: _Tunnel, readable: Collection[str], terminated: Collection[str]) -> None:
        """Follow the store: new readable channels are free, finished ones TERMINATED, and
        channels it no longer offers (a deleted table) are dropped."""
        for cid in readable:
            tunnel.channels.setdefault(cid, _Channel())
        for cid in terminated:
            ch = tunnel.channels.get(cid)
            if ch is not None and ch.status != TERMINATED:
                ch.status, ch.version = TERMINATED, ch.version + 1
        for cid in [c for c in tunnel.channels if c not in readable and c not in terminated]:
            del tunnel.channels[cid]

    @staticmethod
    def _apply(tunnel: _Tunnel, client_id: str, report: ChannelState) -> None:
        """A client's newer copy of a channel it owns: CLOSE (or TERMINATED) gives it up."""
        ch = tunnel.channels.get(report.channel_id)
        if ch is None or ch.owner != client_id or report.version <= ch.version:
            return  # not its channel, or an old copy: the server's view stands
        if report.status not in (CLOSE, TERMINATED):
            return  # a client only ever reports closing a channel
        ch.version = report.version
        if ch.status != TERMINATED:
            ch.status, ch.owner = CLOSE, None

    @staticmethod
    def _balance(tunnel: _Tunnel) -> None:
        """Give free channels to clients below their share; ask the most loaded client to
        close one when a client is below its share and nothing is free or closing."""
        clients = list(tunnel.clients)
        if not clients:
            return
        active = {cid: ch for cid, ch in tunnel.channels.items() if ch.status != TERMINATED}
        share, extra = divmod(len(active), len(clients))
        owned = {c: sorted(cid for cid, ch in active.items()
                           if ch.owner == c and ch.status == OPEN) for c in clients}
        free = sorted(cid for cid, ch in active.items() if ch.owner is None)

        def assign(client_id: str) -> None:
            cid = free.pop(0)
            ch = active[cid]
            ch.owner, ch.status, ch.version = client_id, OPEN, ch.version + 1
            owned[client_id].append(cid)

        # everyone up to the share first, then the first `extra` clients one more
        for c in clients:
            while free and len(owned[c]) < share:
                assign(c)
        for c in clients:
            if not free:
                break
            if sum(len(v) > share for v in owned.values()) < extra and len(owned[c]) == share:
                assign(c)
        closing = sum(1 for ch in active.values() if ch.status == CLOSING)
        missing = sum(max(0, share - len(v)) for v in owned.values()) - closing
        while missing > 0:
            donor = max(clients, key=lambda c: len(owned[c]))
            if len(owned[donor]) <= share:
                break
            ch = active[owned[donor].pop()]
            ch.status, ch.version = CLOSING, ch.version + 1
            missing -= 1


__all__ = ["ChannelState", "ClientGone", "DEFAULT_TIMEOUT_S", "TunnelClients"]
