"""A Tablestore meta store (``tablestore://``) over the emulator, as tests use it: its instance
and key pair (credentials come from the environment, ``ENV``, as in production), the URI of a
fresh meta table, the official SDK's client, and a raw writer that overwrites a row behind the
store's back (the meta-store contract's corrupt rows)."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable

from tablestore import Condition, OTSClient, Row, RowExistenceExpectation
from tablestore.retry import NoRetryPolicy

from tablestore_emulator.server import EmulatorServer
from testkit.emulator import INSTANCE, KEY_ID, SECRET

ENV = {"ALIBABA_CLOUD_ACCESS_KEY_ID": KEY_ID, "ALIBABA_CLOUD_ACCESS_KEY_SECRET": SECRET}


def table_uri(emulator: EmulatorServer, table: str | None = None, **params: str) -> str:
    table = table or f"cdc_meta_{uuidlib.uuid4().hex[:12]}"
    query = "&".join(f"{k}={v}" for k, v in {"endpoint": emulator.url, **params}.items())
    return f"tablestore://{INSTANCE}/{table}?{query}"


def sdk_client(emulator: EmulatorServer) -> OTSClient:
    return OTSClient(emulator.url, KEY_ID, SECRET, INSTANCE, retry_policy=NoRetryPolicy())


def tablestore_raw_writer(emulator: EmulatorServer, uri: str
                          ) -> Callable[[str, str, str | None, str], None]:
    table = uri.split("?")[0].rsplit("/", 1)[1]

    def write(namespace: str, uuid: str, channel_id: str | None, payload: str) -> None:
        sk = f"B#{uuid}" if channel_id is None else f"E#{uuid}#{channel_id}"
        sdk_client(emulator).update_row(
            table, Row([("ns", namespace), ("sk", sk)], {"put": [("doc", payload)]}),
            Condition(RowExistenceExpectation.EXPECT_EXIST))

    return write
