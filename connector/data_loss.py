"""``onDataLoss=resnapshot`` (executor): a read that passes over trimmed records records a
resnapshot signal for its table in the meta table, so the ``replicate`` job repairs its target
from the source (``tablestore_cdc.resnapshot``; docs/resnapshot.md). A multi-table query's
partition carries its table's own namespace and name (``connector.multiplex``: each table's
protocol), so a ``--tables`` job finds the signal where a single table's would.

Called by ``connector.reader.fetch_pages`` through ``resume_after_trim``'s ``on_gap``. The
signal is added with ``meta_store.signals.SignalBoard.add``, which keeps one pending signal per
table: a read replayed after a failure, or several channels losing records at once, ask once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from connector.clients import executor_clients
from connector.errors import TrimmedDataError
from connector.partition import ChannelPartition
from meta_store.signals import Signal, SignalBoard

log = logging.getLogger("connector.reader")


def resnapshot_on_gap(p: ChannelPartition) -> Callable[[TrimmedDataError], None] | None:
    """What a read of ``p`` does when it passes over trimmed records: record a resnapshot
    signal (``onDataLoss=resnapshot``), or nothing (None)."""
    table = p.resnapshot_table
    if table is None:
        return None

    def record(lost: TrimmedDataError) -> None:
        store = executor_clients().meta_store(p.meta_uri, dict(p.meta_credentials) or None)
        signal = SignalBoard(store, p.namespace).add(Signal(
            table=table, origin="data-loss",
            note=f"channel {p.channel_id}: {str(lost).splitlines()[0]}"))
        log.warning("channel %s of table %s lost trimmed records: resnapshot %s recorded "
                    "(onDataLoss=resnapshot); the replicate job repairs the target from the "
                    "source", p.channel_id, table, signal.id)

    return record
