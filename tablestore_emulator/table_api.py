"""Table API routes (in progress)."""

from __future__ import annotations

from tablestore.protobuf import table_store_pb2 as pb

from tablestore_emulator.server import EmulatorContext


def list_table(ctx: EmulatorContext, body: bytes) -> bytes:
    return pb.ListTableResponse(table_names=ctx.store.list_tables()).SerializeToString()


ROUTES = {"/ListTable": list_table}
