"""What travels from the driver to executors: one channel of one batch.

``ChannelPartition`` is built by the driver's planner (``connector.protocol.StreamProtocol.plan``)
and pickled by Spark to an executor, where ``connector.reader.claim_and_read`` reads it. It is
plain picklable data only (ids, tokens, URIs, the typed endpoint, limits), never a live client:
executors open their own clients from them (``connector.clients.executor_clients``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql.datasource import InputPartition

from connector.tunnel.endpoint import TunnelEndpoint


@dataclass(frozen=True)
class ChannelPartition(InputPartition):
    """One channel of one batch (built on the driver, read on an executor)."""

    namespace: str
    meta_uri: str
    #: the typed endpoint (``connector.tunnel.endpoint``; a Tablestore one holds its credentials
    #: as ``SecretStr``): kept out of the repr all the same
    endpoint: TunnelEndpoint = field(repr=False)
    tunnel_id: str
    end_uuid: str
    channel_id: str
    start_token: str
    start_sequence_number: int
    start_last_sequence: str | None
    max_records: int
    #: AvailableNow: do not read records whose sequence sorts after this (the channel's head
    #: when the run started, where the backend reports heads)
    stop_after_sequence: str | None
    fail_on_data_loss: bool
    #: credentials for a tablestore:// meta store (the URI never holds them); not shown in repr
    meta_credentials: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    #: the Trigger.AvailableNow bound of the batch (commit time, µs since the epoch): without a
    #: ``stop_after_sequence`` the read stops before the first record committed after it; a read
    #: that reaches it records it in its claim (``EndCheckpoint.bound_reached_us``)
    available_now_us: int | None = None
    #: the read's byte budget (``maxBytesPerTrigger``'s share): the last record may cross it
    max_bytes: int | None = None
    #: ``startingTimestamp`` (µs): records committed before it at the start of the read are
    #: passed over; set only while the query has consumed nothing of the channel
    skip_before_us: int | None = None
    #: ``onDataLoss=resnapshot``: the table a resnapshot signal is recorded for when the read
    #: passes over trimmed records (``connector.data_loss``); None: no signal
    resnapshot_table: str | None = None
