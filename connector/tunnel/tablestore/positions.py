"""The Tablestore client's positions role: checkpoints, and where channels stand (driver).

``TablestorePositions`` (``connector.tunnel.base.ChannelPositions``):

- ``get_checkpoint`` / ``checkpoint``: GetCheckpoint and Checkpoint with a fixed client id
  (``CLIENT_ID``) and no Connect/Heartbeat -- what the vendor's Spark connector does. Pushes
  carry the sequence number the official SDKs push, the stored one + 1 (Go ``checkpointer.go``,
  Java ``TunnelStateMachine``: GetCheckpoint's number + 1, then one more per successful push);
  the consumer's own number is not sent. The client remembers the stored number per channel
  (from its last GetCheckpoint or successful push), so a push costs one call; it reads the
  number (GetCheckpoint) only for a channel it has not seen in this process, and when the
  service answers ``OTSSequenceNumberNotMatch`` (another writer pushed in between), then pushes
  once more at the re-read number + 1. A position the tunnel already holds is not pushed again.
  A push still refused after the re-read raises ``StaleCheckpointError``; the protocol never
  lets that pass silently for ``"finished"``. A token inside a service page (``tokens``) pushes
  its page token: the tunnel's stored position may then be up to one page behind the source's
  own, which only matters to a new query without a Spark checkpoint.
- ``checkpoint_many``: the driver's pushes (``connector.planning.pushes``) keep
  ``concurrent_calls`` requests in flight from the calling thread; what it returns is pushed by
  ``checkpoint`` from that many threads (the client's per-channel state is keyed by channel,
  its transport's pool hands each call a connection).
- ``has_new_data`` and ``lag``: reads at each channel's position, and DescribeTunnel for the
  channel list (``channel_probes``: the service has no cheaper way to tell).
- ``head_sequences``: ``None`` (the service reports no channel head): Trigger.AvailableNow
  bounds the run by commit time instead (``connector.planning.tracker.AvailableNowBound``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from connector.errors import InvalidCheckpointError, StaleCheckpointError
from connector.tunnel.base import ChannelLag, ChannelPositions, Checkpoint
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.admin import TablestoreAdministration
from connector.tunnel.tablestore.calls import CLIENT_ID
from connector.tunnel.tablestore.channel_probes import ChannelProbes
from connector.tunnel.tablestore.tokens import check_token
from connector.tunnel.tablestore.transport import PendingCall, ServiceError

#: the driver's per-channel calls at once: checkpoint pushes (``concurrent_calls``) and the
#: probes of ``has_new_data``; each waits a round trip, so 16 hide 16 of them per round
DRIVER_CONCURRENCY = 16
_CHECKPOINT_PATH = "/tunnel/checkpoint"


class _SequenceNotMatch(Exception):
    """Internal: the service refused a push's sequence number (``checkpoint`` re-reads)."""


def _checkpoint_request(tunnel_id: str, channel_id: str, page: str, sequence: int) -> Any:
    """The Checkpoint request pushing ``page`` at ``sequence`` (the stored number + 1)."""
    return m.CheckpointRequest(tunnel_id=tunnel_id, client_id=CLIENT_ID, channel_id=channel_id,
                               checkpoint=page, sequence_number=sequence)


class TablestorePositions(TablestoreAdministration, ChannelPositions):
    """Checkpoints and channel probes over the wire (module docstring)."""

    concurrent_calls = DRIVER_CONCURRENCY
    #: (tunnel id, channel id) -> (sequence number, checkpoint) the service holds, as last
    #: seen by this client (GetCheckpoint, or a push it accepted): the next push is + 1
    _stored: dict[tuple[str, str], tuple[int, str]]
    #: ``has_new_data`` and ``lag``
    _probes: ChannelProbes

    def get_checkpoint(self, tunnel_id: str, channel_id: str) -> Checkpoint:
        """The stored checkpoint and the service's sequence number for it (the number of
        pushes the service counted, not a record count)."""
        request = m.GetCheckpointRequest(tunnel_id=tunnel_id, client_id=CLIENT_ID,
                                         channel_id=channel_id)
        response = self._call("/tunnel/getcheckpoint", request, m.GetCheckpointResponse,
                              lambda e: self._channel_error(e, tunnel_id, channel_id, ""))
        stored = Checkpoint(response.checkpoint, int(response.sequence_number))
        self._stored[(tunnel_id, channel_id)] = (stored.sequence_number, stored.token)
        return stored

    def checkpoint(self, tunnel_id: str, channel_id: str, checkpoint: Checkpoint) -> None:
        """Push ``checkpoint.token`` (a mid-page token pushes its page token) at the stored
        sequence number + 1, the SDKs' rule; ``checkpoint.sequence_number`` is checked but not
        sent (module docstring). A position the tunnel already holds is not pushed again."""
        page, _ = check_token(channel_id, checkpoint.token)
        seqno = checkpoint.sequence_number
        if not checkpoint.sequence_is_valid:
            raise InvalidCheckpointError(
                channel_id=channel_id, tunnel_id=tunnel_id,
                reason=f"sequence number must be a non-negative integer, got {seqno!r}")
        key = (tunnel_id, channel_id)
        stored = self._stored.get(key)
        if stored is None:  # a channel this process has not seen: read what the tunnel holds
            got = self.get_checkpoint(tunnel_id, channel_id)
            stored = (got.sequence_number, got.token)

        def on_error(exc: ServiceError) -> Exception | None:
            if exc.code == "OTSSequenceNumberNotMatch":
                return _SequenceNotMatch(exc.message)
            return self._channel_error(exc, tunnel_id, channel_id, checkpoint.token,
                                       push=checkpoint)

        for attempt in (1, 2):
            if stored[1] == page:
                return  # held already (pushed before a crash, or by this process)
            request = _checkpoint_request(tunnel_id, channel_id, page, stored[0] + 1)
            try:
                self._call(_CHECKPOINT_PATH, request, m.CheckpointResponse, on_error)
            except _SequenceNotMatch as refused:
                # another writer pushed in between (or an earlier attempt of ours landed
                # unseen): the SDKs re-read the stored number and go on from it + 1
                pushed = stored[0] + 1
                got = self.get_checkpoint(tunnel_id, channel_id)
                stored = (got.sequence_number, got.token)
                if attempt == 2 and stored[1] != page:
                    raise StaleCheckpointError(
                        channel_id=channel_id, tunnel_id=tunnel_id, pushed=pushed,
                        stored=f"{stored[0]} (refused twice: {refused})") from None
                continue
            self._stored[key] = (stored[0] + 1, page)
            return

    def checkpoint_many(self, tunnel_id: str,
                        pushes: Sequence[tuple[str, Checkpoint]]) -> list[str]:
        """Push several channels' checkpoints from this one thread (driver): up to
        ``concurrent_calls`` requests in flight, each on a connection of its own, their
        answers read in the order sent -- the service works on them at once while this thread
        signs the next, with no thread pool's hand-offs and futures per call. Only the plain
        case is done here: a channel whose stored number this client knows, pushed at it + 1
        and accepted. Any other -- a channel not seen yet, a position not valid, a refusal, a
        network error -- is returned (in order) for ``checkpoint``, which re-reads, retries
        and raises as it always does. A position the tunnel holds already is not pushed."""
        left: list[str] = []
        in_flight: deque[tuple[str, tuple[int, str], str, PendingCall]] = deque()

        def settle(channel_id: str, stored: tuple[int, str], page: str,
                   answer: PendingCall) -> None:
            try:
                m.parse(m.CheckpointResponse, answer.result(again=False))
            except Exception:  # noqa: BLE001 - checkpoint() pushes it again, and meets it
                left.append(channel_id)
                return
            self._stored[(tunnel_id, channel_id)] = (stored[0] + 1, page)

        for channel_id, checkpoint in pushes:
            stored = self._stored.get((tunnel_id, channel_id))
            try:
                page, _ = check_token(channel_id, checkpoint.token)
            except Exception:  # noqa: BLE001 - checkpoint() raises it
                page = None
            if stored is None or page is None or not checkpoint.sequence_is_valid:
                left.append(channel_id)
                continue
            if stored[1] == page:
                continue  # held already
            request = _checkpoint_request(tunnel_id, channel_id, page, stored[0] + 1)
            in_flight.append((channel_id, stored, page, self._transport.send(
                _CHECKPOINT_PATH, request.SerializeToString())))
            if len(in_flight) >= self.concurrent_calls:
                settle(*in_flight.popleft())
        while in_flight:
            settle(*in_flight.popleft())
        order = {channel_id: i for i, (channel_id, _) in enumerate(pushes)}
        return sorted(left, key=order.__getitem__)

    # --- where the channels stand -------------------------------------------------------------

    def has_new_data(self, tunnel_id: str, positions: Mapping[str, str]) -> bool:
        """Driver, ``latestOffset``: a one-record read per OPEN channel from its position,
        stopping at the first that finds a record (``channel_probes.ChannelProbes``)."""
        return self._probes.has_new_data(tunnel_id, positions)

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag]:
        """Per channel not TERMINATED, how far ``positions`` (else the pushed checkpoints) are
        behind, from one read at each position (``channel_probes.ChannelProbes.lag``). Driver:
        progress report, read caps, ``minOffsetsPerTrigger``; ``tablestore-cdc meta lag``;
        the feed."""
        return self._probes.lag(tunnel_id, positions)


__all__ = ["CLIENT_ID", "DRIVER_CONCURRENCY", "TablestorePositions"]
