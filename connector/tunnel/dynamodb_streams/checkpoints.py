"""Tunnels and pushed checkpoints of the DynamoDB Streams backend, in one DynamoDB table.

DynamoDB Streams keeps no consumer state, so a "tunnel" is this table's record of a named
position set. Single-table layout, partition key ``pk``, sort key ``sk`` (both strings):

====================  ===============  =====================================================
``pk``                ``sk``           attributes
====================  ===============  =====================================================
``T#<table>``         ``<tunnel>``     ``tunnel_id``, ``tunnel_type``, ``start``, ``created_at``
``I#<tunnel id>``     ``tunnel``       ``table``, ``name`` (lookup by id)
``C#<tunnel id>``     ``P#<shard>``    ``token``, ``seq`` (the pushed checkpoint)
``C#<tunnel id>``     ``E#<shard>``    a read reached the closed shard's end (``FINISHED``)
====================  ===============  =====================================================

Atomicity: a tunnel's two rows are written (and deleted) in one ``TransactWriteItems`` with
``attribute_not_exists`` on its name, so two drivers creating the same tunnel cannot both win;
a checkpoint push is a ``PutItem`` conditioned on ``seq <= :new`` (equal is accepted again,
lower is stale). Every read is strongly consistent.

Who calls it: ``service.DynamoDbStreamsTunnelService`` — the driver for tunnels and pushes,
executors for ``tunnel_by_id`` and ``mark_end`` (one small request each per read).
"""

from __future__ import annotations

import time
from typing import Any

from connector.errors import StaleCheckpointError, TunnelExistsError, TunnelRequestError
from connector.tunnel.base import Checkpoint, StartPosition, TunnelInfo, TunnelType
from connector.tunnel.dynamodb_streams.aws import AwsError, call

_ensured: set[tuple[str | None, str]] = set()


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _checkpoint(item: dict[str, Any]) -> Checkpoint:
    return Checkpoint(item["token"]["S"], int(item["seq"]["N"]))


class CheckpointTable:
    """The checkpoint table of one endpoint (see the module docstring)."""

    def __init__(self, client: Any, name: str, uri: str, endpoint_url: str | None,
                 create: bool) -> None:
        self.client = client
        self.name = name
        self.uri = uri
        if create and (endpoint_url, name) not in _ensured:
            self._ensure()
            _ensured.add((endpoint_url, name))

    def _call(self, operation: str, method: str, **kwargs: Any) -> Any:
        try:
            return call(self.uri, f"DynamoDB {operation} on {self.name}",
                        getattr(self.client, method), **kwargs)
        except AwsError as exc:
            if exc.code == "ResourceNotFoundException":
                raise TunnelRequestError(
                    endpoint=self.uri, operation=operation,
                    reason=f"checkpoint table {self.name!r} does not exist (create it, or add "
                    "create_table=true to the endpoint URI)") from None
            raise

    def _ensure(self) -> None:
        """Create the table (on demand billing) when missing and wait until it is active."""
        try:
            self._call("DescribeTable", "describe_table", TableName=self.name)
            return
        except TunnelRequestError as exc:
            if "does not exist" not in str(exc):
                raise
        try:
            self._call(
                "CreateTable", "create_table", TableName=self.name,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                      {"AttributeName": "sk", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"},
                           {"AttributeName": "sk", "KeyType": "RANGE"}],
            )
        except AwsError as exc:
            if exc.code != "ResourceInUseException":  # another process created it
                raise
        self.client.get_waiter("table_exists").wait(
            TableName=self.name, WaiterConfig={"Delay": 1, "MaxAttempts": 300})

    # --- tunnels ------------------------------------------------------------------------

    @staticmethod
    def _info(table: str, name: str, item: dict[str, Any]) -> TunnelInfo:
        return TunnelInfo(
            tunnel_id=item["tunnel_id"]["S"], tunnel_name=name, table_name=table,
            tunnel_type=TunnelType(item["tunnel_type"]["S"]),
            start_position=StartPosition(item["start"]["S"]),
            created_at=float(item["created_at"]["N"]),
        )

    def create_tunnel(self, info: TunnelInfo) -> None:
        """Write both rows of a new tunnel; ``TunnelExistsError`` if the name is taken."""
        try:
            self._call("TransactWriteItems", "transact_write_items", TransactItems=[
                {"Put": {
                    "TableName": self.name,
                    "Item": {**_key(f"T#{info.table_name}", info.tunnel_name),
                             "tunnel_id": {"S": info.tunnel_id},
                             "tunnel_type": {"S": info.tunnel_type.value},
                             "start": {"S": info.start_position.value},
                             "created_at": {"N": repr(info.created_at)}},
                    "ConditionExpression": "attribute_not_exists(pk)",
                }},
                {"Put": {
                    "TableName": self.name,
                    "Item": {**_key(f"I#{info.tunnel_id}", "tunnel"),
                             "table": {"S": info.table_name}, "name": {"S": info.tunnel_name}},
                }},
            ])
        except AwsError as exc:
            if exc.code in ("TransactionCanceledException", "ConditionalCheckFailedException"):
                raise TunnelExistsError(tunnel=info.tunnel_name, table=info.table_name) from None
            raise

    def tunnel_by_name(self, table: str, name: str) -> TunnelInfo | None:
        item = self._get(f"T#{table}", name)
        return None if item is None else self._info(table, name, item)

    def tunnel_by_id(self, tunnel_id: str) -> TunnelInfo | None:
        ref = self._get(f"I#{tunnel_id}", "tunnel")
        if ref is None:
            return None
        info = self.tunnel_by_name(ref["table"]["S"], ref["name"]["S"])
        # a name re-used by a newer tunnel does not resurrect the old id
        return info if info is not None and info.tunnel_id == tunnel_id else None

    def list_tunnels(self, table: str | None) -> list[TunnelInfo]:
        items = self._query(f"T#{table}") if table is not None else self._items(
            "Scan", "scan", FilterExpression="begins_with(pk, :t)",
            ExpressionAttributeValues={":t": {"S": "T#"}})
        infos = [self._info(i["pk"]["S"][2:], i["sk"]["S"], i) for i in items]
        return sorted(infos, key=lambda t: (t.table_name, t.created_at, t.tunnel_name))

    def delete_tunnel(self, info: TunnelInfo) -> None:
        """Delete the tunnel's rows, then its checkpoints (a crash in between leaves only
        checkpoints of an id nobody can reach)."""
        self._call("TransactWriteItems", "transact_write_items", TransactItems=[
            {"Delete": {"TableName": self.name,
                        "Key": _key(f"T#{info.table_name}", info.tunnel_name)}},
            {"Delete": {"TableName": self.name, "Key": _key(f"I#{info.tunnel_id}", "tunnel")}},
        ])
        keys = [i["sk"]["S"] for i in self._query(f"C#{info.tunnel_id}")]
        for start in range(0, len(keys), 25):
            requests = [{"DeleteRequest": {"Key": _key(f"C#{info.tunnel_id}", sk)}}
                        for sk in keys[start:start + 25]]
            for _ in range(10):
                out = self._call("BatchWriteItem", "batch_write_item",
                                 RequestItems={self.name: requests})
                requests = out.get("UnprocessedItems", {}).get(self.name, [])
                if not requests:
                    break
                time.sleep(0.2)

    # --- checkpoints --------------------------------------------------------------------

    def checkpoints(self, tunnel_id: str) -> tuple[dict[str, Checkpoint], set[str]]:
        """Every pushed checkpoint of the tunnel and the shards a read finished."""
        stored: dict[str, Checkpoint] = {}
        ended: set[str] = set()
        for item in self._query(f"C#{tunnel_id}"):
            sk = item["sk"]["S"]
            if sk.startswith("P#"):
                stored[sk[2:]] = _checkpoint(item)
            elif sk.startswith("E#"):
                ended.add(sk[2:])
        return stored, ended

    def checkpoint(self, tunnel_id: str, shard_id: str) -> Checkpoint | None:
        item = self._get(f"C#{tunnel_id}", f"P#{shard_id}")
        return None if item is None else _checkpoint(item)

    def put_checkpoint(self, tunnel_id: str, shard_id: str, checkpoint: Checkpoint) -> None:
        """Store ``checkpoint`` unless a higher sequence number is stored (then
        ``StaleCheckpointError``); the same sequence number again is accepted."""
        try:
            self._call(
                "PutItem", "put_item", TableName=self.name,
                Item={**_key(f"C#{tunnel_id}", f"P#{shard_id}"), "token": {"S": checkpoint.token},
                      "seq": {"N": str(checkpoint.sequence_number)},
                      "updated_at": {"N": repr(time.time())}},
                ConditionExpression="attribute_not_exists(pk) OR seq <= :seq",
                ExpressionAttributeValues={":seq": {"N": str(checkpoint.sequence_number)}},
            )
        except AwsError as exc:
            if exc.code != "ConditionalCheckFailedException":
                raise
            stored = self.checkpoint(tunnel_id, shard_id)
            raise StaleCheckpointError(
                channel_id=shard_id, tunnel_id=tunnel_id, pushed=checkpoint.sequence_number,
                stored=stored.sequence_number if stored else "?") from None

    def mark_end(self, tunnel_id: str, shard_id: str) -> None:
        """Record that a read of this tunnel reached the closed shard's end (idempotent)."""
        self._call("PutItem", "put_item", TableName=self.name,
                   Item={**_key(f"C#{tunnel_id}", f"E#{shard_id}"), "at": {"N": repr(time.time())}})

    # --- plumbing -----------------------------------------------------------------------

    def _get(self, pk: str, sk: str) -> dict[str, Any] | None:
        return self._call("GetItem", "get_item", TableName=self.name, ConsistentRead=True,
                          Key=_key(pk, sk)).get("Item")  # type: ignore[no-any-return]

    def _query(self, pk: str) -> list[dict[str, Any]]:
        return self._items("Query", "query", KeyConditionExpression="pk = :pk",
                           ExpressionAttributeValues={":pk": {"S": pk}})

    def _items(self, operation: str, method: str, **kwargs: Any) -> list[dict[str, Any]]:
        """Every item of a paginated, strongly consistent ``query`` or ``scan``."""
        items: list[dict[str, Any]] = []
        kwargs.update(TableName=self.name, ConsistentRead=True)
        while True:
            page = self._call(operation, method, **kwargs)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
