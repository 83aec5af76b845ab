"""Fuzz target: the embedded store's API with hostile names and tokens.

Input: a real store file (a table of two channels with rows, a tunnel); a call of its row API,
channel operations or tunnel service (the calls the emulator's routes and the CLI make) with
one name -- table, column, tunnel, tunnel id, channel id -- or a value replaced by any text (lone
surrogates, control characters, trailing newlines, any character), or with a token that is a
store token mutated byte by byte, base64 of JSON nested deep or of another shape, or any text.

Property: a result or the product's typed error (``CdcError``: what the emulator maps to a 4xx),
its message UTF-8-encodable text of bounded length. Never another error (no
``UnicodeEncodeError`` from SQLite, no ``RecursionError`` from the token's JSON).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from connector.errors import CdcError, MalformedTokenError
from connector.local import LocalTablestore
from connector.tunnel.base import Checkpoint
from connector.tunnel.local import LocalTunnelService
from testkit.fuzzing import fuzz_settings, mostly, mutated

pytestmark = pytest.mark.fuzz

NAMES = st.one_of(
    st.text(st.characters(categories=["Cs", "Cc"]), min_size=1, max_size=3).flatmap(
        lambda bad: st.sampled_from([bad, "t" + bad, bad + "t", "t\n", "ch-0000\n"])),
    st.binary(min_size=1, max_size=6).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.text(max_size=10),
    st.sampled_from(["t", "ch-0000", "base-ch-0000", "", " ", "t" * 10_000]),
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    store = LocalTablestore(tmp_path_factory.mktemp("fuzz-local") / "store.db")
    store.create_table("t", [("id", "INTEGER")], [("v", "STRING")], channels=2)
    store.batch_write("t", [("put", {"id": i}, {"v": str(i)}) for i in range(20)])
    service = LocalTunnelService(store)
    tunnel_id = service.create_tunnel("t", "tun").tunnel_id
    channel = store.list_channels("t")[0].channel_id
    token = service.read_records(tunnel_id, channel, service.get_checkpoint(
        tunnel_id, channel).token, 3).next_token
    yield {"store": store, "service": service, "tunnel_id": tunnel_id, "channel": channel,
           "token": token}
    store.close()


def _nested(opening: bytes, n: int) -> str:
    return base64.b64encode(opening * n).decode("ascii")


@st.composite
def tokens(draw: Any, valid: str) -> str:
    how = draw(st.sampled_from(["mutated", "mutated-json", "nested", "shape", "text"]))
    event(f"token: {how}")
    if how == "mutated":
        return draw(mutated(valid.encode("ascii"))).decode("latin-1")
    body = base64.b64decode(valid)
    if how == "mutated-json":
        return base64.b64encode(draw(mutated(body))).decode("ascii")
    if how == "nested":
        return _nested(draw(st.sampled_from([b"[", b'{"t":', b'{"s":['])),
                       draw(st.sampled_from([3, 5, 100, 5_000])))
    if how == "shape":
        doc = json.loads(body)
        field = draw(st.sampled_from(["t", "c", "s"]))
        doc[field] = draw(st.sampled_from([None, [], {}, [[[[[1]]]]], -1, 2**70, 1.5, True,
                                           "x" * 100_000, "ch-0000\n"]))
        return base64.b64encode(json.dumps(doc).encode()).decode("ascii")
    return draw(mostly(st.text(max_size=20), NAMES))


CALLS = ["create_table", "create_column", "put_row", "put_value", "put_attribute", "get_row",
         "scan", "scan_span", "list_channels",
         "split", "create_tunnel", "describe_tunnel", "get_checkpoint_tunnel",
         "get_checkpoint_channel", "read_channel", "read_token", "lag_token", "lag_channel",
         "has_new_data_token", "checkpoint_token", "checkpoint_channel"]


def _call(world: dict[str, Any], call: str, name: str, token: str) -> Any:
    store, service = world["store"], world["service"]
    tid, ch = world["tunnel_id"], world["channel"]
    return {
        "create_table": lambda: store.create_table(name, [("id", "INTEGER")]),
        "create_column": lambda: store.create_table("u", [("id", "INTEGER")], [(name, "STRING")]),
        "put_row": lambda: store.put_row(name, {"id": 1}, {"v": "x"}),
        "put_value": lambda: store.put_row("t", {"id": 1}, {"v": name}),
        "put_attribute": lambda: store.put_row("t", {"id": 1}, {name: name}),
        "get_row": lambda: store.get_row(name, {"id": 1}),
        "scan_span": lambda: store.scan_span("t", "id", name, None),
        "scan": lambda: store.scan(name),
        "list_channels": lambda: store.list_channels(name),
        "split": lambda: store.split_channel("t", name),
        "create_tunnel": lambda: service.create_tunnel("t", name),
        "describe_tunnel": lambda: service.describe_tunnel("t", name),
        "get_checkpoint_tunnel": lambda: service.get_checkpoint(name, ch),
        "get_checkpoint_channel": lambda: service.get_checkpoint(tid, name),
        "read_channel": lambda: service.read_records(tid, name, world["token"], 5),
        "read_token": lambda: service.read_records(tid, ch, token, 5),
        "lag_token": lambda: service.lag(tid, {ch: token}),
        "lag_channel": lambda: service.lag(tid, {name: world["token"]}),
        "has_new_data_token": lambda: service.has_new_data(tid, {ch: token}),
        "checkpoint_token": lambda: service.checkpoint(tid, ch, Checkpoint(token, 1)),
        "checkpoint_channel": lambda: service.checkpoint(tid, name, Checkpoint(
            world["token"], 4)),
    }[call]()


@given(call=st.sampled_from(CALLS), name=NAMES, data=st.data())
@fuzz_settings(default=400)
def test_hostile_names_and_tokens_end_in_results_or_typed_errors(
        world: dict[str, Any], call: str, name: str, data: st.DataObject) -> None:
    token = data.draw(tokens(world["token"])) if "token" in call else world["token"]
    try:
        _call(world, call, name, token)
    except CdcError as exc:
        message = str(exc)
        message.encode("utf-8")
        if isinstance(exc, MalformedTokenError):  # a token is shown cut, whatever its length
            assert len(message) < 1_000 + len(name), message[:300]
        event(f"{call}: {type(exc).__name__}")
    else:
        event(f"{call}: a result")
