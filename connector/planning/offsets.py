"""The offsets this source hands Spark, and the UUIDs of initial offsets (pure functions).

An offset is the JSON object Spark writes to its offset log: ``{"uuid", "source"}``, the
batch's totals when limits apply: ``"maxRows"`` (``maxOffsetsPerTrigger``) and ``"maxBytes"``
(``maxBytesPerTrigger``), and ``"metaStore"``, the meta store the batch is recorded in (its URI
with secrets removed; offsets written before it lack it). ``source`` names the source
(``connector.identity``) and is the meta namespace the batch lives in. ``StreamProtocol``
builds and checks them on the driver (docs/protocol.md, "Why the offset is a random UUID").
"""

from __future__ import annotations

import uuid as uuid_lib
from typing import Any

from connector.errors import CheckpointMismatchError, MalformedOffsetError
from connector.identity import SourceIdentity, namespace_of_offset


def offset_json(namespace: str, uuid: str, max_rows: int | None = None,
                max_bytes: int | None = None, meta_store: str | None = None) -> dict[str, Any]:
    """The offset Spark logs. ``maxRows`` / ``maxBytes`` carry the batch's read limits, so a
    replay plans the same caps even if the minted row was collected, whatever the options say
    by then (older offsets lack them); ``metaStore`` lets a restart with another ``meta.store``
    say which one it was."""
    offset: dict[str, Any] = {"uuid": uuid, "source": namespace}
    if max_rows is not None:
        offset["maxRows"] = max_rows
    if max_bytes is not None:
        offset["maxBytes"] = max_bytes
    if meta_store is not None:
        offset["metaStore"] = meta_store
    return offset


def offset_namespace(offset: Any, identity: SourceIdentity) -> str:
    """The namespace an offset from Spark's log lives in, once it is an offset of this source
    (``CheckpointMismatchError`` saying what changed, ``MalformedOffsetError`` for one this
    source did not write)."""
    if not isinstance(offset, dict) or "source" not in offset:
        raise MalformedOffsetError(offset=offset, problem="not an offset of this source: "
                                   "it has no 'source'")
    return namespace_of_offset(offset.get("source"), identity)


def uuid_of(offset: Any, identity: SourceIdentity, namespace: str) -> str:
    """The UUID of an offset from Spark's log; refuses an offset of another source
    (``CheckpointMismatchError``), of another namespace of this one (a checkpoint written
    with another spelling while this process started from one of an earlier version's) and
    one this source did not write (``MalformedOffsetError``)."""
    found = offset_namespace(offset, identity)
    if found != namespace:
        raise CheckpointMismatchError(
            expected=namespace, found=found,
            change="the same source, but its batches are in another meta namespace than this "
            "run of the query started in",
            remedy="restart the query: it uses the namespace its checkpoint names")
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
