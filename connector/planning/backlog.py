"""How many records wait beyond a batch's positions, counted up to what a decision needs.

``StreamProtocol`` calls ``records_available`` on the driver for ``minOffsetsPerTrigger``: the
tunnel's ``lag`` counts where the backend can (the embedded store always; Tablestore and
DynamoDB Streams for a channel within one read of its head), and the channels it counts only
a lower bound of are read ahead -- never further than the minimum still missing, so an idle
query reads at most ``minOffsetsPerTrigger`` records per trigger while it waits (and only
until ``maxTriggerDelay``).
"""

from __future__ import annotations

from collections.abc import Mapping

from connector.errors import ChannelNotReadableError, DataLossError, TunnelError
from connector.planning.logs import log
from connector.tunnel import FINISHED, TunnelService

#: records per read when counting ahead
COUNT_PAGE = 1000


def records_available(tunnel: TunnelService, tunnel_id: str, positions: Mapping[str, str],
                      at_least: int) -> int | None:
    """Records readable beyond ``positions`` (channel id -> token), counted until ``at_least``
    are found (the answer is then ``at_least`` or more); ``None`` when it cannot be told (a
    position's records were trimmed: the batch must run and report it)."""
    try:
        lags = tunnel.lag(tunnel_id, positions)
    except TunnelError as exc:
        log.debug("no lag figures (%s): counting records by reading ahead", exc)
        lags = None
    known = 0
    uncounted = [ch for ch, token in sorted(positions.items()) if token != FINISHED]
    if lags is not None:
        uncounted = [ch for ch in uncounted if lags.get(ch) is None or not lags[ch].exact]
        known = sum(lag.records_behind for lag in lags.values() if lag.exact)
    for channel_id in uncounted:
        if known >= at_least:
            break
        counted = _count_ahead(tunnel, tunnel_id, channel_id, positions[channel_id],
                               at_least - known)
        if counted is None:
            return None
        known += counted
    return known


def _count_ahead(tunnel: TunnelService, tunnel_id: str, channel_id: str, token: str,
                 need: int) -> int | None:
    """Records after ``token``, read until ``need`` are seen or the channel has no more now."""
    seen = 0
    while seen < need:
        try:
            result = tunnel.read_records(tunnel_id, channel_id, token,
                                         min(COUNT_PAGE, need - seen))
        except ChannelNotReadableError:
            return seen
        except DataLossError:
            return None
        seen += len(result.records)
        if result.next_token == FINISHED or not result.may_more or not result.records:
            break
        token = result.next_token
    return seen
