"""The offsets this source hands Spark, and the UUIDs of initial offsets (pure functions).

An offset is the JSON object Spark writes to its offset log: ``{"uuid", "source"}`` and, when
Spark passed a ``ReadMaxRows`` limit, ``"maxRows"``. ``StreamProtocol`` builds and checks them on
the driver (docs/protocol.md, "Why the offset is a random UUID").
"""

from __future__ import annotations

import uuid as uuid_lib
from typing import Any

from connector.errors import CheckpointMismatchError, MalformedOffsetError


def offset_json(namespace: str, uuid: str, max_rows: int | None = None) -> dict[str, Any]:
    """The offset Spark logs. ``maxRows`` carries the batch's read limit, so a replay
    plans the same caps even if the minted row was collected (older offsets lack it)."""
    offset: dict[str, Any] = {"uuid": uuid, "source": namespace}
    if max_rows is not None:
        offset["maxRows"] = max_rows
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
    max_rows = offset.get("maxRows")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int)
                                 or max_rows < 1):
        raise MalformedOffsetError(offset=offset, problem="'maxRows' is not an integer >= 1")
    return uuid


def initial_uuid(namespace: str, tunnel_id: str, generation: int) -> str:
    """The UUID of the initial offset of ``generation`` (``connector.planning.namespace``):
    derived, so Spark's repeated ``initialOffset`` calls get the same one every time."""
    return str(uuid_lib.uuid5(uuid_lib.NAMESPACE_URL, f"{namespace}#{tunnel_id}#{generation}"))
