"""Progress versus a wedge, read from outcome counts with explicit times (s)."""

from __future__ import annotations

from structlog.testing import capture_logs

from streamer.frames import OutcomeSnapshot
from streamer.observability.progress import ProgressMonitor, status_line


def counts(
    received: int, published: int, failed: int = 0, dropped: int = 0, blocked: int = 0
) -> OutcomeSnapshot:
    return OutcomeSnapshot(
        received,
        published,
        {"decode_failed": failed},
        {"superseded": dropped, "egress_blocked": blocked},
    )


def test_an_idle_pipeline_is_healthy() -> None:
    monitor = ProgressMonitor(stall_timeout_s=1.0, now_s=0.0)
    for now_s in (0.5, 5.0, 50.0):
        monitor.update(counts(10, 10), now_s)
        assert not monitor.stalled and monitor.stalled_for_s(now_s) == 0.0
    assert monitor.state(50.0) == "running"


def test_frames_in_flight_with_none_finished_is_a_stall_until_one_finishes() -> None:
    monitor = ProgressMonitor(stall_timeout_s=1.0, now_s=0.0)
    with capture_logs() as logs:
        monitor.update(counts(5, 2), 0.1)
        monitor.update(counts(6, 3), 0.9)  # a frame finished: progress at 0.9
        monitor.update(counts(8, 3), 1.8)
        assert not monitor.stalled
        monitor.update(counts(8, 3), 2.0)
        monitor.update(counts(8, 3), 4.0)
        assert monitor.stalled and monitor.stalled_for_s(4.0) == 3.1
        assert monitor.state(4.0) == "stalled 3 s"
        monitor.update(counts(9, 3, dropped=2), 4.5)  # drops at the door are not progress
        assert monitor.stalled
        monitor.update(counts(9, 3, dropped=2, blocked=1), 5.0)  # egress could not send: out
        assert not monitor.stalled
    assert [e["event"] for e in logs] == ["pipeline_stalled", "pipeline_progressing"]
    assert logs[0]["in_flight"] == 5


def test_rate_counts_frames_out_of_the_pipeline_since_the_previous_reading() -> None:
    monitor = ProgressMonitor(stall_timeout_s=1.0, now_s=0.0)
    assert monitor.rate_per_s(counts(22, 18, failed=1, dropped=2, blocked=1), 2.0) == 10.0
    assert monitor.rate_per_s(counts(27, 23, failed=1, dropped=2, blocked=1), 4.0) == 2.5
    assert monitor.rate_per_s(counts(27, 23, failed=1, dropped=2, blocked=1), 4.0) == 0.0


def test_status_line() -> None:
    line = status_line("running", counts(1200, 1190, failed=2, dropped=4, blocked=1), 29.74)
    assert line == (
        "running: 29.7 frames/s, 3 in flight; received 1200, published 1190, failed 2, dropped 5"
    )
    assert line.isascii()
