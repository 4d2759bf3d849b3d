from streamer.log_budget import LogBudget

S = 1_000_000_000  # ns


def test_lines_beyond_the_budget_are_counted_and_reported_by_the_next_one() -> None:
    budget = LogBudget(lines=2, interval_s=10)
    assert [budget.take(now_ns=t * S) for t in (0, 1, 2, 3, 9)] == [0, 0, None, None, None]
    assert budget.take(now_ns=10 * S) == 3  # a new interval: the three left out
    assert budget.take(now_ns=11 * S) == 0
    assert budget.take(now_ns=12 * S) is None
