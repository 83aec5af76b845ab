"""Meta-store queries the protocol's hardening and cost work relies on, on every backend:
``successors``, ``reset_namespace``, ``committed_not_pushed`` (a state query, not a listing, on
SQLite and filtered by the service on DynamoDB) and ``get_end_checkpoints_of``.

SQLite on a real file; DynamoDB on moto in-process, with one-item pages so the filtered query
must follow ``LastEvaluatedKey`` across pages that hold no match.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from meta_store import BatchState, MetaStore, open_meta_store
from tests.contract.meta_contract import NS, OTHER_NS, make_end, make_manifest, new_uuid


@pytest.fixture(params=["sqlite", "dynamodb"])
def store(request: Any, tmp_path: Any) -> Iterator[MetaStore]:
    if request.param == "sqlite":
        s = open_meta_store(f"sqlite://{tmp_path}/meta.db")
        yield s
        s.close()
        return
    request.getfixturevalue("aws_env")
    with mock_aws():
        s = open_meta_store("dynamodb://cdc-meta?region=us-east-1&create_table=true&page_size=1")
        yield s
        s.close()


def chain(store: MetaStore, n: int, namespace: str = NS) -> list[str]:
    """n planned batches on one chain, each with one end checkpoint."""
    uuids: list[str] = []
    prev = None
    for i in range(n):
        u = new_uuid()
        store.create_batch(namespace, u, prev, now=1000.0 + i)
        store.put_manifest(namespace, u, prev, make_manifest(2, tag=str(i)))
        store.put_end_checkpoint(namespace, u, make_end(token=f"tok-{i}", seq=i, records=i))
        uuids.append(u)
        prev = u
    return uuids


def test_successors_are_the_batches_minted_after_a_uuid(store: MetaStore) -> None:
    a, b, c = chain(store, 3)
    orphan = new_uuid()
    store.create_batch(NS, orphan, a, now=2000.0)
    assert [x.uuid for x in store.successors(NS, a)] == [b, orphan]
    assert [x.uuid for x in store.successors(NS, c)] == []
    assert store.successors(NS, new_uuid()) == []


def test_committed_not_pushed_in_chain_order(store: MetaStore) -> None:
    uuids = chain(store, 5)
    store.mark_committed(NS, uuids[3])
    store.mark_pushed(NS, uuids[:2])
    assert [b.uuid for b in store.committed_not_pushed(NS)] == uuids[2:4]
    assert all(b.state is BatchState.COMMITTED and b.manifest is not None
               for b in store.committed_not_pushed(NS))
    assert store.committed_not_pushed(OTHER_NS) == []


def test_end_checkpoints_of_several_batches_at_once(store: MetaStore) -> None:
    uuids = chain(store, 4)
    missing = new_uuid()
    got = store.get_end_checkpoints_of(NS, [uuids[2], missing, uuids[0]])
    assert list(got) == [uuids[2], missing, uuids[0]]
    assert got[missing] == {}
    assert got[uuids[2]] == store.get_end_checkpoints(NS, uuids[2])
    assert got[uuids[0]]["ch-00000"].sequence_number == 0


def test_reset_namespace_forgets_batches_and_the_tunnel_binding(store: MetaStore) -> None:
    chain(store, 3)
    kept = chain(store, 2, namespace=OTHER_NS)
    store.set_namespace_info(NS, {"table": "orders", "tunnel_id": "tid-1",
                                  "committed_generation": "0"})
    assert store.reset_namespace(NS) == 3
    assert store.list_batches(NS) == []
    assert store.get_namespace_info(NS) == {"table": "orders"}
    assert [b.uuid for b in store.list_batches(OTHER_NS)] == kept
    assert store.reset_namespace(NS) == 0  # again: nothing to do
