"""The backend side of the tunnel contract (``tests/contract/tunnel_contract.py``): one harness
per backend, each with a writer (create a table, put, update, delete, split, merge, trim) and the
tunnel ``service`` under test, and the DynamoDB Streams fixtures its harness needs.

- ``LocalHarness``: the embedded store, a writer and a service instance on one file (as a writer
  process and a Spark driver would have);
- ``EmulatorHarness``: the same file served by the emulator over HTTP, the wire client as the
  service;
- ``StreamsHarness``: tables on a moto server in this process (the ``moto_url`` fixture) with
  the shard map of ``StreamsFake`` (``streams_fake``); its boto3 clients read the test
  credentials from the environment (``aws_test_credentials``).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pytest
import requests

from connector.local import LocalTablestore
from connector.tunnel import open_tunnel_service
from connector.tunnel.base import Record, TunnelService
from connector.tunnel.dynamodb_streams import codec
from connector.tunnel.local import LocalTunnelService
from tablestore_emulator.server import EmulatorServer
from testkit.dynamodb_streams_fake import StreamsFake
from testkit.emulator import INSTANCE, KEY_ID, SECRET, service_uri


class LocalHarness:
    """Backend side of the contract for the local store: a writer instance and a separate
    service instance on one file, as a writer process and a Spark driver would have."""

    def __init__(self, path: Path) -> None:
        self.writer = LocalTablestore(path)
        self.service: TunnelService = LocalTunnelService(LocalTablestore(path))

    def create_table(self, name: str, channels: int) -> None:
        self.writer.create_table(
            name, [("id", "STRING")], [("value", "INTEGER")], channels=channels
        )

    def put(self, table: str, key: str, value: int) -> None:
        self.writer.put_row(table, {"id": key}, {"value": value})

    def update(self, table: str, key: str, value: int) -> None:
        self.writer.update_row(table, {"id": key}, {"value": value})

    def delete(self, table: str, key: str) -> None:
        self.writer.delete_row(table, {"id": key})

    def split(self, table: str, channel_id: str) -> tuple[str, str]:
        return self.writer.split_channel(table, channel_id)

    def merge(self, table: str, a: str, b: str) -> str:
        return self.writer.merge_channels(table, a, b)

    def trim(self, table: str) -> None:
        self.writer.trim_history(table, keep_last=0)

    def change_log(self, table: str) -> list[Record]:
        return self.writer.change_log(table)

    def close(self) -> None:
        self.service.close()
        self.writer.close()


class EmulatorHarness(LocalHarness):
    """Backend side of the contract: an emulator serving the store file over HTTP, the wire
    client as the service under test, and a writer on the same file (as a writer process).
    The writer's operations (create_table, put, split, ...) are the local harness's."""

    def __init__(self, path: Path) -> None:  # not the local harness's: no local service here
        self.writer = LocalTablestore(path)
        self.emulator = EmulatorServer(str(path), INSTANCE, KEY_ID, SECRET).start()
        self.service = open_tunnel_service(service_uri(self.emulator.url))

    def close(self) -> None:
        self.service.close()
        self.emulator.stop()
        self.writer.close()


REGION = "us-east-1"


class StreamsHarness:
    """Backend side of the contract: tables on moto written through boto3, the shard map of
    ``StreamsFake``, a fresh checkpoint table per test."""

    def __init__(self, url: str, fake: StreamsFake, view: str = "NEW_AND_OLD_IMAGES",
                 extra: str = "", poll_interval_ms: int = 0) -> None:
        requests.post(f"{url}/moto-api/reset", timeout=10)
        fake.reset()
        self.url, self.fake, self.view = url, fake, view
        self.ddb = boto3.client("dynamodb", endpoint_url=url, region_name=REGION)
        # poll_interval_ms=0 by default: the contract asks has_new_data again right after
        # each write
        self.uri = (f"dynamodb-streams://?checkpoint_table=cdc-{uuid.uuid4().hex[:8]}"
                    f"&region={REGION}&endpoint_url={url}&create_table=true"
                    f"&poll_interval_ms={poll_interval_ms}{extra}")
        self.service = open_tunnel_service(self.uri)

    def create_table(self, name: str, channels: int) -> None:
        self.ddb.create_table(
            TableName=name, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            StreamSpecification={"StreamEnabled": True, "StreamViewType": self.view},
        )
        self.fake.attach(name, channels)

    def put(self, table: str, key: str, value: int) -> None:
        self.ddb.put_item(TableName=table, Item={"id": {"S": key}, "value": {"N": str(value)}})

    def update(self, table: str, key: str, value: int) -> None:
        self.ddb.update_item(TableName=table, Key={"id": {"S": key}},
                             UpdateExpression="SET #v = :v",
                             ExpressionAttributeNames={"#v": "value"},
                             ExpressionAttributeValues={":v": {"N": str(value)}})

    def delete(self, table: str, key: str) -> None:
        self.ddb.delete_item(TableName=table, Key={"id": {"S": key}})

    def split(self, table: str, channel_id: str) -> tuple[str, str]:
        return self.fake.split(table, channel_id)

    def merge(self, table: str, a: str, b: str) -> str:
        pytest.skip("DynamoDB Streams has no merges: a shard has at most one parent")

    def trim(self, table: str) -> None:
        self.fake.trim(table)

    def change_log(self, table: str) -> list[Record]:
        return [codec.decode_record(raw, sid, "") for sid, raw in self.fake.held(table)]

    def close(self) -> None:
        self.service.close()
