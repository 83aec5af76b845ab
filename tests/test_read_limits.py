"""Read limits (``connector.planning.read_limits``) on hand-built inputs: backlog figures,
waiting parents and the batch UUID that sets the rotation, without a tunnel. The protocol tests
(tests/test_protocol_exact_or_refused.py) cover the same rules end to end over a local store."""

from __future__ import annotations

import random
import uuid

import pytest

from connector.options import SourceOptions
from connector.planning.read_limits import (
    TriggerLimits,
    byte_budgets,
    holds_back,
    read_caps,
    rotation,
    share,
    trigger_limits,
)


def batch_uuid(rotate_by: int) -> str:
    """A batch UUID whose rotation of three channels starts at index ``rotate_by``."""
    return str(uuid.UUID(int=rotate_by))


def caps(channels, max_rows=None, backlog=None, waiting=frozenset(), per_channel=100,
         rotate_by=0):
    return read_caps(channels, per_channel=per_channel, max_rows=max_rows,
                     batch_uuid=batch_uuid(rotate_by), backlog=backlog, waiting_parents=waiting)


def test_rotation_starts_where_the_batch_uuid_says():
    assert rotation(["a", "b", "c"], batch_uuid(0)) == ["a", "b", "c"]
    assert rotation(["a", "b", "c"], batch_uuid(1)) == ["b", "c", "a"]
    assert rotation(["a", "b", "c"], batch_uuid(5)) == ["c", "a", "b"]


def test_share_is_max_min_fair_and_gives_remainders_in_rotation_order():
    assert share(10, {"a": 2, "b": 10, "c": 10}) == {"a": 2, "b": 4, "c": 4}
    assert share(5, {"a": 10, "b": 10}) == {"a": 3, "b": 2}
    assert share(5, {"b": 10, "a": 10}) == {"b": 3, "a": 2}
    assert share(2, {"a": 5, "b": 5, "c": 5}) == {"a": 1, "b": 1, "c": 0}
    assert share(3, {"a": 0, "b": 5}) == {"a": 0, "b": 3}
    assert share(100, {"a": 1, "b": 2}) == {"a": 1, "b": 2}  # nobody gets more than it asks


def test_share_gives_out_the_total_without_exceeding_an_ask_max_min_fairly():
    rng = random.Random(0)
    for _ in range(500):
        asks = {f"ch{i}": rng.choice([0, 1, 2, 5, 50, 1000]) for i in range(rng.randint(1, 12))}
        total = rng.randint(0, 300)
        got = share(total, asks)
        case = f"share({total}, {asks}) = {got}"
        assert list(got) == list(asks), case
        assert sum(got.values()) == min(total, sum(asks.values())), case
        assert all(0 <= got[ch] <= asks[ch] for ch in asks), case
        # max-min fair: a channel held below its ask has at least any other's share less one
        for ch, cap in got.items():
            if cap < asks[ch]:
                assert all(cap >= other - 1 for other in got.values()), case


def test_without_a_total_every_unfinished_channel_gets_its_per_channel_cap():
    assert caps(["b", "a"], per_channel=7) == {"a": 7, "b": 7}
    assert caps([], max_rows=10) == {}


def test_without_backlog_figures_the_total_is_split_evenly_in_rotation_order():
    assert caps(["a", "b", "c"], max_rows=4, rotate_by=0) == {"a": 2, "b": 1, "c": 1}
    assert caps(["a", "b", "c"], max_rows=4, rotate_by=1) == {"a": 1, "b": 2, "c": 1}
    assert caps(["a", "b", "c"], max_rows=400, per_channel=100) == {"a": 100, "b": 100, "c": 100}


def test_the_total_goes_where_the_backlog_is():
    backlog = {"a": 0, "b": 400, "c": 0}
    assert caps(["a", "b", "c"], max_rows=8, backlog=backlog) == {"a": 0, "b": 8, "c": 0}


def test_a_channel_the_tunnel_cannot_tell_about_asks_for_its_per_channel_cap():
    backlog = {"a": 0, "b": None}  # c is missing from the figures
    assert caps(["a", "b", "c"], max_rows=8, backlog=backlog) == {"a": 0, "b": 4, "c": 4}


def test_what_is_left_over_is_spread_up_to_the_per_channel_cap():
    # a asks 10 and gets it; the 90 left are shared over what each may still take (40, 50)
    assert caps(["a", "b"], max_rows=100, backlog={"a": 10, "b": 0},
                per_channel=50) == {"a": 50, "b": 50}


def test_a_parent_that_children_wait_for_asks_for_at_least_one():
    backlog = {"parent": 0, "busy": 1000}
    assert caps(["parent", "busy"], max_rows=5, backlog=backlog,
                waiting={"parent"}) == {"parent": 1, "busy": 4}
    assert caps(["parent", "busy"], max_rows=5, backlog=backlog,
                waiting=set()) == {"parent": 0, "busy": 5}


def test_unnamed_waiting_parents_give_the_first_channel_in_rotation_at_least_one():
    backlog = {"a": 0, "b": 0, "c": 1000}
    assert caps(["a", "b", "c"], max_rows=3, backlog=backlog, waiting=None,
                rotate_by=1) == {"a": 0, "b": 1, "c": 2}
    assert caps(["a", "b", "c"], max_rows=3, backlog=backlog, waiting=None,
                rotate_by=0) == {"a": 1, "b": 0, "c": 2}


# --- how the limits compose (minOffsetsPerTrigger, maxTriggerDelay, maxBytesPerTrigger) -------


def _options(**extra: str) -> SourceOptions:
    return SourceOptions.from_spark({"endpoint": "local:///d/s.db", "table.name": "t",
                                     "tunnel.name": "q", **extra})


def test_all_available_means_no_limit_whatever_the_options_say():
    """``ReadAllAvailable`` (Trigger.Once) overrides every configured limit."""
    options = _options(maxOffsetsPerTrigger="10", maxBytesPerTrigger="1k",
                       minOffsetsPerTrigger="5")
    assert trigger_limits(options, all_available=True) == TriggerLimits()


def test_any_other_limit_applies_every_configured_one_spark_s_value_standing_for_its_kind():
    options = _options(maxOffsetsPerTrigger="10", maxBytesPerTrigger="1k",
                       minOffsetsPerTrigger="5", maxTriggerDelay="30s")
    assert trigger_limits(options, all_available=False, max_rows=7) == TriggerLimits(
        max_rows=7, max_bytes=1024, min_rows=5, max_delay_s=30.0)
    assert trigger_limits(options, all_available=False, max_bytes=99).max_bytes == 99
    # min rows alone: Kafka's default delay of 15 minutes
    assert trigger_limits(_options(minOffsetsPerTrigger="5"), all_available=False,
                          min_rows=5) == TriggerLimits(min_rows=5, max_delay_s=900.0)


@pytest.mark.parametrize(("available", "waited", "held"), [
    (3, 1.0, True),       # too few, delay not passed: no batch yet
    (5, 1.0, False),      # enough
    (3, 30.0, False),     # the delay passed: a batch with what there is
    (0, 30.0, False),
    (None, 1.0, False),   # nobody can count: never held back for it
])
def test_min_rows_hold_a_batch_back_until_enough_or_the_delay(available, waited, held):
    assert holds_back(5, available, waited, 30.0) is held


def test_byte_budgets_share_the_total_among_the_channels_that_read():
    caps = {"a": 100, "b": 100, "c": 0}
    assert byte_budgets(caps, max_bytes=1000, batch_uuid=batch_uuid(0), backlog=None) == {
        "a": 500, "b": 500}
    # a caught-up channel asks for one byte (one record may arrive and cross it)
    assert byte_budgets(caps, max_bytes=1000, batch_uuid=batch_uuid(0),
                        backlog={"a": 0, "b": 40}) == {"a": 1, "b": 999}
    # fewer bytes than channels: the rotation says who reads this time
    assert byte_budgets({"a": 1, "b": 1, "c": 1}, max_bytes=1, batch_uuid=batch_uuid(1),
                        backlog=None) == {"a": 0, "b": 1, "c": 0}
