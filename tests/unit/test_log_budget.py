import gc

import pytest

from streamer.log_budget import LogBudget, logged, take_unreported

S = 1_000_000_000  # ns


@pytest.fixture(autouse=True)
def _no_lines_left_out_before() -> None:
    take_unreported()  # what other tests' budgets left out


def test_lines_beyond_the_budget_are_counted_and_reported_by_the_next_one() -> None:
    budget = LogBudget("test_event", lines=2, interval_s=10)
    assert [budget.take(now_ns=t * S) for t in (0, 1, 2, 3, 9)] == [0, 0, None, None, None]
    assert budget.take(now_ns=10 * S) == 3  # a new interval: the three left out
    assert budget.take(now_ns=11 * S) == 0
    assert budget.take(now_ns=12 * S) is None


def test_what_no_line_reported_is_summed_by_event_and_then_forgotten() -> None:
    first, second = LogBudget("flood_a", lines=1), LogBudget("flood_a", lines=1)
    other = LogBudget("flood_b", lines=1)
    for budget, lines in ((first, 4), (second, 3), (other, 1)):
        for _ in range(lines):
            budget.take(now_ns=0)
    assert take_unreported() == {"flood_a": 5}  # 3 + 2 left out; flood_b left out none
    assert take_unreported() == {}
    assert first.take(now_ns=20 * S) == 0  # already reported in the summary


def test_a_budget_whose_owner_is_gone_still_counts_in_the_summary() -> None:
    """The CURVE authenticator's budget outlives no reference of the daemon's own."""

    def flood() -> None:
        budget = LogBudget("owner_gone", lines=1)
        for _ in range(4):
            budget.take(now_ns=0)

    flood()
    gc.collect()
    assert take_unreported() == {"owner_gone": 3}


def test_a_long_value_is_cut_short_for_the_log() -> None:
    assert logged("cam-1") == "cam-1"
    assert logged("é" * 300) == "é" * 256 + "… (300 characters)"
