"""The channel tracker (``connector.planning.tracker``): lineage, terminated channels and the
AvailableNow bound. The decisions on hand-built channel lists and positions; then the tracker
itself over a real local tunnel through a split (the protocol tests cover the same end to end)."""

from __future__ import annotations

from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.planning.positions import Position
from connector.planning.tracker import (
    AvailableNowBound,
    AvailableNowCheck,
    ChannelTracker,
    available_now_check,
    terminated_finished,
    waiting_parents_of,
)
from connector.tunnel import (
    FINISHED,
    ChannelInfo,
    ChannelStatus,
    Checkpoint,
    TunnelService,
    open_tunnel_service,
)

OPEN, WAIT, TERMINATED = ChannelStatus.OPEN, ChannelStatus.WAIT, ChannelStatus.TERMINATED


def at(token: str = "tok", last_sequence: str | None = None) -> Position:
    return Position(token, 1, last_sequence)


# --- the decisions ---------------------------------------------------------------------------


def test_waiting_parents_are_the_parents_named_by_waiting_channels():
    channels = [ChannelInfo("p", OPEN), ChannelInfo("q", OPEN),
                ChannelInfo("c1", WAIT, parent_ids=("p",)),
                ChannelInfo("c2", WAIT, parent_ids=("p", "q")),
                ChannelInfo("c3", OPEN, parent_ids=("old",))]  # released: nobody waits
    assert waiting_parents_of(channels) == {"p", "q"}
    assert waiting_parents_of([ChannelInfo("p", OPEN)]) == set()


def test_a_waiting_channel_without_named_parents_makes_the_parents_unknown():
    channels = [ChannelInfo("c1", WAIT, parent_ids=("p",)), ChannelInfo("c2", WAIT)]
    assert waiting_parents_of(channels) is None


def test_only_finished_channels_the_tunnel_reports_terminated_leave():
    positions = {"done": at(FINISHED), "pushing": at(FINISHED), "odd": at("tok"),
                 "gone": at(FINISHED)}
    statuses = {"done": TERMINATED, "pushing": OPEN, "odd": TERMINATED}
    assert terminated_finished(positions, statuses) == ["done"]


def with_heads(heads: dict[str, str], at_us: int = 1000) -> AvailableNowBound:
    return AvailableNowBound(at_us, heads)


def tunnel_channels(**statuses: ChannelStatus) -> list[ChannelInfo]:
    return [ChannelInfo(ch, status) for ch, status in statuses.items()]


def test_available_now_is_done_once_every_channel_reached_its_bound():
    bound = with_heads({"a": "0005", "b": "0003", "empty": ""})
    channels = tunnel_channels(a=OPEN, b=OPEN, empty=OPEN)
    assert available_now_check(bound, {"a": at(last_sequence="0005"),
                                       "b": at(last_sequence="0007")}, channels) == (
        AvailableNowCheck(done=True, release=False))
    assert not available_now_check(bound, {"a": at(last_sequence="0004"),
                                           "b": at(last_sequence="0003")}, channels).done
    assert not available_now_check(bound, {"a": at(last_sequence=None)}, channels).done


def test_available_now_waits_for_a_channel_not_read_yet_unless_it_had_nothing_or_ended():
    bound = with_heads({"child": "0002", "empty": ""})
    assert not available_now_check(bound, {}, tunnel_channels(child=WAIT, empty=OPEN)).done
    assert available_now_check(bound, {}, tunnel_channels(child=TERMINATED)).done


def test_available_now_asks_to_release_the_children_of_a_finished_channel():
    bound = with_heads({"parent": "0009", "child": "0002"})
    # the parent is read to its end, its push not confirmed: release, and wait for the child
    assert available_now_check(bound, {"parent": at(FINISHED)},
                               tunnel_channels(parent=OPEN, child=WAIT)) == (
        AvailableNowCheck(done=False, release=True))
    # confirmed: nothing to release; the child (released now, not read yet) still waits
    assert available_now_check(bound, {"parent": at(FINISHED)},
                               tunnel_channels(parent=TERMINATED, child=OPEN)) == (
        AvailableNowCheck(done=False, release=False, untracked=True))
    # a release is asked for whichever channel comes first
    assert available_now_check(bound, {"parent": at(FINISHED)},
                               tunnel_channels(child=WAIT, parent=OPEN)).release


def test_a_time_bound_is_reached_by_the_claim_that_recorded_it():
    """Without heads (Tablestore, a resumed run) a channel is done once a read under this
    bound recorded reaching it (``EndCheckpoint.bound_reached_us``), whatever its sequences."""
    bound = AvailableNowBound(at_us=5000)
    channels = tunnel_channels(a=OPEN, b=OPEN)
    reached = Position("tok", 3, "0003", bound_reached_us=5000)
    other_run = Position("tok", 3, "0009", bound_reached_us=4000)
    assert available_now_check(bound, {"a": reached, "b": reached}, channels).done
    assert not available_now_check(bound, {"a": reached, "b": other_run}, channels).done
    # a child released during the run is read too: not done while the tunnel offers it
    check = available_now_check(bound, {"a": reached, "b": reached},
                                [*channels, ChannelInfo("c", OPEN, parent_ids=("x",))])
    assert check == AvailableNowCheck(done=False, release=False, untracked=True)
    # a waiting child's parents stopped at the bound: its changes come after it
    assert available_now_check(bound, {"a": reached, "b": reached},
                               [*channels, ChannelInfo("c", WAIT, parent_ids=("a",))]).done


# --- the tracker over a local tunnel -----------------------------------------------------------


def open_tracker(store: LocalTablestore, refresh_ms: str = "600000"
                 ) -> tuple[TunnelService, str, ChannelTracker]:
    options = SourceOptions.from_spark({
        "endpoint": f"local://{store.path}", "table.name": "t", "tunnel.name": "q",
        "channelRefreshIntervalMs": refresh_ms})
    tunnel = open_tunnel_service(options.endpoint)
    info = tunnel.ensure_tunnel("t", "q", options.tunnel_type, options.starting_position)
    return tunnel, info.tunnel_id, ChannelTracker(tunnel, options, info.tunnel_id)


def test_children_join_only_after_their_parent_is_pushed_finished(store):
    tunnel, tunnel_id, tracker = open_tracker(store)
    positions: dict[str, Position] = {}
    first = tracker.refresh(positions)  # a process's first plan refreshes at once
    parent, other = sorted(first)
    assert set(positions) == {parent, other} and tracker.waiting_parents == set()

    children = store.split_channel("t", parent)
    assert tracker.refresh(positions) == []  # within channelRefreshIntervalMs: no look
    tracker.request_refresh()
    assert tracker.refresh(positions) == []  # the children wait for the parent
    assert tracker.waiting_parents == {parent}

    result = tunnel.read_records(tunnel_id, parent, positions[parent].token, 10)
    assert result.next_token == FINISHED  # the split parent is read to its end
    positions[parent] = Position(FINISHED, 1, None)
    tracker.request_refresh()
    assert tracker.refresh(positions) == []  # not pushed yet: carried as FINISHED, no children
    assert parent in positions

    tunnel.checkpoint(tunnel_id, parent, Checkpoint(FINISHED, 1))
    tracker.request_refresh()
    assert sorted(tracker.refresh(positions)) == sorted(children)
    assert set(positions) == {other, *children}  # the terminated parent left
    assert all(positions[c].parent_ids == (parent,) for c in children)
    assert tracker.waiting_parents == set()
    tunnel.close()


def test_under_available_now_channels_born_after_the_start_wait(store):
    tunnel, tunnel_id, tracker = open_tracker(store)
    positions: dict[str, Position] = {}
    tracker.refresh(positions)
    parent = sorted(positions)[0]
    tracker.prepare_available_now(now_us=1000)  # every channel's head now; forces a refresh
    bound = tracker.bound_for(None, positions)
    assert tracker.available_now and tracker.head(bound.at_us, parent) == ""
    children = store.split_channel("t", parent)
    tunnel.read_records(tunnel_id, parent, positions[parent].token, 10)
    tunnel.checkpoint(tunnel_id, parent, Checkpoint(FINISHED, 1))
    positions[parent] = Position(FINISHED, 1, None)
    assert tracker.refresh(positions) == []  # released, but born after the run started
    assert not set(children) & set(positions)
    assert tracker.head(bound.at_us, children[0]) is None
    tunnel.close()


def test_a_restarted_run_goes_on_to_the_bound_of_the_run_it_continues(store):
    """``bound_for``: the batch a run starts from carries the bound of the run that planned it;
    when that run did not reach it, a restart reads to the same bound (by commit time, the
    heads of that run being gone); when it did, the new run's bound applies."""
    tunnel, _, tracker = open_tracker(store)
    positions: dict[str, Position] = {}
    tracker.refresh(positions)
    tracker.prepare_available_now(now_us=9000)
    earlier = tracker.bound_for(5000, positions)  # nothing was read to 5000 yet
    assert earlier == AvailableNowBound(5000) and tracker.head(5000, sorted(positions)[0]) is None
    tracker.prepare_available_now(now_us=9500)  # the next run of the same query
    done = {ch: Position(p.token, 0, None, bound_reached_us=5000) for ch, p in positions.items()}
    assert tracker.bound_for(5000, done).at_us == 9500
    tunnel.close()
