"""The stop rule of a channel's read (``connector.stop_rule``), on its own: pages in, steps out.

The rule is pure, so these tests build pages from Arrow batches and feed them to ``decide``:
no tunnel, no meta store. What a whole read does with it against real backends is in
tests/test_reader.py, tests/test_available_now.py, tests/test_batch_sizing.py and
tests/test_starting_timestamp.py.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from connector.stop_rule import (
    MAX_EMPTY_PAGES,
    PAGE_SIZE,
    ReadState,
    StopRule,
    record_sizes,
    records_within,
)
from connector.tunnel import FINISHED, Op, Record
from connector.tunnel.page import Page, PageLayout, records_to_page

LAYOUT = PageLayout((("id", pa.string()),))


def page(seqs: list[int], *, next_token: str = "", may_more: bool = True,
         stamps: list[int] | None = None) -> Page:
    """Records with sequences ``seqs``, committed at ``stamps`` (µs; default seq * 1000);
    ``token_after(n)`` is ``after-<seq of the n-th>``."""
    records = [Record(Op.PUT, {"id": f"k{s}"}, {}, None, f"{s:020d}",
                      stamps[i] if stamps else s * 1000, "c") for i, s in enumerate(seqs)]
    end = next_token or (f"after-{seqs[-1]}" if seqs else "moved")
    return Page(records_to_page(records, LAYOUT), end, may_more,
                tokens=lambda n: f"after-{seqs[n - 1]}")


class _Untouched(Page):
    """A page whose records must not be decoded (the plain read never looks at them)."""

    __slots__ = ()

    @property
    def batch(self) -> pa.RecordBatch:
        raise AssertionError("the rule decoded a page it had no reason to look into")


def test_a_plain_read_keeps_whole_pages_without_looking_into_them() -> None:
    rule = StopRule(max_records=100)
    state = rule.start()
    assert rule.want(state) == 100
    records = page([1, 2, 3])
    plain = _Untouched(records._batch, "after-3", True)  # type: ignore[attr-defined]
    step = rule.decide(state, plain, "start")
    assert (step.skip, step.keep, step.past, step.stop) == (0, 3, 3, False)
    assert rule.want(step.state) == 97
    last = rule.decide(step.state, page([4], may_more=False), "after-3")
    assert (last.keep, last.stop, last.reached) == (1, True, True)  # caught up: the end


def test_the_cap_stops_the_read_short_of_its_end() -> None:
    rule = StopRule(max_records=5)
    step = rule.decide(rule.start(), page([1, 2, 3, 4, 5]), "start")
    assert (step.keep, step.past, step.stop, step.reached) == (5, 5, True, False)
    assert rule.want(ReadState(kept=2)) == 3
    assert StopRule(max_records=10**6).want(ReadState()) == PAGE_SIZE


def test_finished_and_empty_pages() -> None:
    rule = StopRule(max_records=100)
    finished = rule.decide(rule.start(), page([1, 2], next_token=FINISHED, may_more=False),
                           "start")
    assert (finished.keep, finished.stop, finished.reached) == (2, True, True)
    still = rule.decide(rule.start(), page([], next_token="start"), "start")
    assert (still.stop, still.reached, still.past) == (True, True, 0)  # token did not move
    state = rule.start()
    for n in range(1, MAX_EMPTY_PAGES + 1):  # moving empty pages that say more may follow
        step = rule.decide(state, page([], next_token=f"moved-{n}"), f"moved-{n - 1}")
        state = step.state
        assert step.stop is (n == MAX_EMPTY_PAGES) and not step.reached
    bounded = StopRule(max_records=100, available_now_us=10**9)
    state = ReadState(empty_pages=MAX_EMPTY_PAGES - 1)
    assert bounded.decide(state, page([], next_token="x"), "y").reached  # counted as caught up


def test_the_available_now_head_cuts_a_page_after_the_head() -> None:
    rule = StopRule(max_records=100, stop_after_sequence=f"{3:020d}", available_now_us=10**9)
    step = rule.decide(rule.start(), page([1, 2, 3, 4, 5]), "start")
    assert (step.keep, step.past, step.stop, step.reached) == (3, 3, True, True)
    whole = rule.decide(rule.start(), page([1, 2]), "start")  # before the head: read on
    assert (whole.keep, whole.stop) == (2, False)
    beyond = rule.decide(rule.start(), page([7, 8]), "start")  # nothing up to the head
    assert (beyond.keep, beyond.past, beyond.stop, beyond.reached) == (0, None, True, True)


def test_the_available_now_instant_and_its_confirming_read() -> None:
    rule = StopRule(max_records=3, available_now_us=2500)
    cut = rule.decide(rule.start(), page([1, 2, 3, 4]), "start")
    assert (cut.keep, cut.stop, cut.reached) == (2, True, True)
    # a page that catches up without "finished" is confirmed by one more read ...
    caught_up = StopRule(max_records=100, available_now_us=10**9)
    step = caught_up.decide(caught_up.start(), page([1], may_more=False), "start")
    assert (step.keep, step.stop) == (1, False)
    # ... and when the cap came with it, that read asks for one record and keeps none
    capped = StopRule(max_records=3, available_now_us=10**9)
    step = capped.decide(capped.start(), page([1, 2, 3], may_more=False), "start")
    assert (step.keep, step.stop, step.state.confirming) == (3, False, True)
    assert capped.want(step.state) == 1
    at_end = capped.decide(step.state, page([], next_token="after-3", may_more=False),
                           "after-3")
    assert (at_end.keep, at_end.past, at_end.stop, at_end.reached) == (0, 0, True, True)
    more = capped.decide(step.state, page([4]), "after-3")  # a record arrived: next batch
    assert (more.keep, more.past, more.stop, more.reached) == (0, None, True, False)
    # by head sequence, the heads tell the end: no confirming read
    heads = StopRule(max_records=3, available_now_us=10**9, stop_after_sequence=f"{9:020d}")
    assert heads.decide(heads.start(), page([1, 2, 3], may_more=False), "start").stop


def test_the_byte_budget_keeps_the_record_that_crosses_it() -> None:
    records = page([1, 2, 3, 4])
    sizes = record_sizes(records.batch).to_pylist()
    budget = sizes[0] + sizes[1] + 1  # crossed by the third record
    assert records_within(records.batch, budget) == 3
    rule = StopRule(max_records=100, max_bytes=budget)
    step = rule.decide(rule.start(), records, "start")
    assert (step.keep, step.past, step.stop, step.reached) == (3, 3, True, False)
    exact = StopRule(max_records=100, max_bytes=sum(sizes))  # spent at the page's end
    spent = exact.decide(exact.start(), records, "start")
    assert (spent.keep, spent.stop, spent.reached, spent.state.budget) == (4, True, False, 0)


def test_records_before_the_starting_timestamp_are_passed_over() -> None:
    rule = StopRule(max_records=100, skip_before_us=3500)
    old = rule.decide(rule.start(), page([1, 2]), "start")
    assert (old.skip, old.keep, old.past, old.start_moves, old.stop) == (2, 0, 2, True, False)
    assert old.state.skipping  # nothing kept yet: still skipping
    mixed = rule.decide(old.state, page([3, 4, 5]), "after-2")
    assert (mixed.skip, mixed.keep, mixed.past, mixed.start_moves) == (1, 2, 3, True)
    assert not mixed.state.skipping and mixed.state.kept == 2
    later = rule.decide(mixed.state, page([1]), "after-5")  # once kept, never skipped
    assert (later.skip, later.keep) == (0, 1)
    caught_up = rule.decide(rule.start(), page([1], may_more=False), "start")
    assert (caught_up.stop, caught_up.reached) == (True, True)


@pytest.mark.parametrize("skip,keep", [(0, 2), (1, 2), (1, 3), (3, 1)])
def test_a_part_of_a_page_ends_at_the_token_after_its_last_record(skip: int, keep: int) -> None:
    whole = page([1, 2, 3, 4])
    part = whole.part(skip, keep)
    assert part.count == keep
    assert part.next_token == whole.token_after(skip + keep)
    assert part.may_more is (True if skip + keep < 4 else whole.may_more)
    if keep > 1:
        assert part.token_after(1) == whole.token_after(skip + 1)
