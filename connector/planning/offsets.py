"""The offsets this source hands Spark, and the UUIDs of initial offsets (pure functions).

An offset is the JSON object Spark writes to its offset log: ``{"uuid", "source"}`` and the
batch's totals when limits apply: ``"maxRows"`` (``maxOffsetsPerTrigger``) and ``"maxBytes"``
(``maxBytesPerTrigger``). ``StreamProtocol`` builds and checks them on
the driver (docs/protocol.md, "Why the offset is a random UUID").
"""

from __future__ import annotations

import uuid as uuid_lib
from typing import Any

from connector.errors import CheckpointMismatchError, MalformedOffsetError


def offset_json(namespace: str, uuid: str, max_rows: int | None = None,
                max_bytes: int | None = None) -> dict[str, Any]:
    """The offset Spark logs. ``maxRows`` / ``maxBytes`` carry the batch's read limits, so a
    replay plans the same caps even if the minted row was collected, whatever the options say
    by then (older offsets lack them)."""
    offset: dict[str, Any] = {"uuid": uuid, "source": namespace}
    if max_rows is not None:
        offset["maxRows"] = max_rows
    if max_bytes is not None:
        offset["maxBytes"] = max_bytes
    return offset


def uuid_of(offset: Any, namespace: str) -> str:
    """The UUID of an offset from Spark's log; refuses an offset of another source
    (``CheckpointMismatchError``) and one this source did not write
    (``MalformedOffsetError``)."""
    if not isinstance(offset, dict) or "source" not in offset:
        raise MalformedOffsetError(offset=offset, problem="not an offset of this source: "
                                   "it has no 'source'")
    found = offset.get("source")
    if found != namespace:
        raise CheckpointMismatchError(expected=namespace, found=found)
    uuid = offset.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise MalformedOffsetError(offset=offset, problem="'uuid' is missing or not a string")
    for key in ("maxRows", "maxBytes"):
        limit = offset.get(key)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise MalformedOffsetError(offset=offset, problem=f"'{key}' is not an integer >= 1")
    return uuid


def initial_uuid(namespace: str, tunnel_id: str, generation: int) -> str:
    """The UUID of the initial offset of ``generation`` (``connector.planning.namespace``):
    derived, so Spark's repeated ``initialOffset`` calls get the same one every time."""
    return str(uuid_lib.uuid5(uuid_lib.NAMESPACE_URL, f"{namespace}#{tunnel_id}#{generation}"))
