from structlog.testing import capture_logs

from streamer.reload_progress import ReloadProgress, ReloadStage


def test_a_reload_that_runs_on_is_reported_every_period_once_however_late_the_look() -> None:
    """The first line one period after the start, then one per period; a control loop that
    looks only after three periods (a load that held the GIL) logs one line, not three. The
    read is not reported: it has a bound of its own."""
    progress = ReloadProgress(started_s=100.0, report_every_s=20.0)
    with capture_logs() as logs:
        progress.report(125.0)
        progress.enter(ReloadStage.LOADING)
        for now_s in (125.0, 139.9, 140.0, 145.0):
            progress.report(now_s)
        progress.enter(ReloadStage.SWAPPING)
        for now_s in (215.0, 219.9, 220.0):
            progress.report(now_s)
    assert [(e["event"], e["log_level"], e["running_s"], e["stage"]) for e in logs] == [
        ("reload_in_progress", "warning", 25.0, "loading"),
        ("reload_in_progress", "warning", 40.0, "loading"),
        ("reload_in_progress", "warning", 115.0, "swapping"),
        ("reload_in_progress", "warning", 120.0, "swapping"),
    ]
    assert "cannot be cancelled" in logs[0]["waiting_for"]
    assert not any(e["deferred"] for e in logs)


def test_a_sighup_during_the_reload_is_logged_deferred_and_said_in_the_next_report() -> None:
    progress = ReloadProgress(started_s=0.0, report_every_s=10.0)
    progress.enter(ReloadStage.SWAPPING)
    assert not progress.deferred
    with capture_logs() as logs:
        progress.defer(now_s=4.3)
        progress.report(now_s=10.0)
    assert progress.deferred
    deferred, report = logs
    assert deferred == {
        "event": "reload_deferred",
        "log_level": "info",
        "running_s": 4.3,
        "stage": "swapping",
        "suppressed": 0,
    }
    assert report["event"] == "reload_in_progress" and report["deferred"] is True
    assert progress.describe(now_s=45.4) == "reload swapping for 45 s"
