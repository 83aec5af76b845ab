"""``startingTimestamp``: where a new query's first batch starts, and when it cannot.

The start itself happens in two places: the tunnel, when the source creates it for the query,
starts at that instant where the backend can (``TunnelService.create_tunnel(start_at_us=...)``:
Tablestore's ``StreamTunnelConfig.startOffset``, the embedded store); and every read of a
channel the query has consumed nothing of yet passes over the records committed before it
(``ChannelPartition.skip_before_us``, ``connector.reader.fetch_pages``) -- so a tunnel that
already existed, a backend without a timestamp start (DynamoDB Streams) and channels that split
off later start at the same first change.

``check_starting_timestamp`` runs on the driver when a query's initial offset is created, and
refuses what the option cannot mean.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from connector.errors import OptionError, StartBeforeTunnelError
from connector.options import SourceOptions
from connector.planning.logs import log
from connector.tunnel import StartPosition, TunnelService
from meta_store import BatchState, ChannelStart, MetaStore


def check_starting_timestamp(options: SourceOptions, tunnel: TunnelService, tunnel_id: str,
                             meta: MetaStore, starts: Sequence[ChannelStart],
                             created_now: bool = False) -> None:
    """Refuse ``startingTimestamp`` where it conflicts with a checkpoint that already says
    where reading goes on: the namespace has committed batches (an earlier query read the
    tunnel), or the tunnel holds checkpoints pushed by a consumer (sequence number above 0; not
    asked of a tunnel this process just created). A LATEST tunnel created after the instant
    cannot hold the changes in between: that is data loss, refused unless
    ``failOnDataLoss=false``."""
    assert options.starting_timestamp is not None
    starting = _iso(options.starting_timestamp)

    def conflict(problem: str) -> OptionError:
        return OptionError(option="startingTimestamp", value=starting, problem=problem,
                           allowed="a new tunnel.name, or leave startingTimestamp out to go "
                           "on from the checkpoints")

    namespace = options.source_identity
    if any(b.prev_uuid is not None and b.state.rank >= BatchState.COMMITTED.rank
           for b in meta.list_batches(namespace)):
        raise conflict(f"applies to a query with no checkpoint, and the meta table holds "
                       f"committed batches of {namespace!r} (an earlier query read tunnel "
                       f"{options.named_tunnel!r})")
    description = tunnel.describe_tunnel(options.table_name, options.named_tunnel)
    by_start = {s.channel_id: s.sequence_number for s in starts}
    for channel in () if created_now else description.channels:
        number = by_start.get(channel.channel_id)
        if number is None:
            number = tunnel.get_checkpoint(tunnel_id, channel.channel_id).sequence_number
        if number > 0:
            raise conflict(f"tunnel {options.named_tunnel!r} holds a checkpoint pushed by a "
                           f"consumer (channel {channel.channel_id!r} at sequence number "
                           f"{number})")
    info = description.tunnel
    if (info.start_position is StartPosition.LATEST
            and options.starting_timestamp / 1000 < info.created_at):
        error = StartBeforeTunnelError(starting=starting, tunnel=options.named_tunnel,
                                       started=_iso(int(info.created_at * 1000)))
        if options.fail_on_data_loss:
            raise error
        log.warning("%s; going on because failOnDataLoss=false", error)


def _iso(millis: int) -> str:
    return dt.datetime.fromtimestamp(millis / 1000, dt.UTC).isoformat(timespec="milliseconds")
