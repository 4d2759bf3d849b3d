"""/metrics text, parsed back with the Prometheus client's own parser."""

from __future__ import annotations

import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamer.errors import FrameError, Reason
from streamer.frames import Batch, Frame, OutcomeSnapshot
from streamer.observability.metrics import PipelineMetrics, PipelineSample

MS = 1_000_000  # ns


def scrape(metrics: PipelineMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}."""
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_and_gauges_are_read_at_scrape_time() -> None:
    metrics = PipelineMetrics()
    outcomes = OutcomeSnapshot(
        20, 12, {"decode_failed": 2, "inference_failed": 1}, {"queue_full": 3}
    )
    sample = PipelineSample(
        outcomes,
        {"batcher": 2, "dequeue": 1, "egress": 0},
        {
            "seq_gaps": 5,
            "source_restarts": 1,
            "active_sources": 2,
            "tracked_sources": 3,
            "new_thing": 7,
        },
        retried={"pnet": 0, "onet": 4},
        recoveries={"pnet": 0, "onet": 2},
    )
    metrics.watch(lambda: sample)
    values = scrape(metrics)
    assert values[("streamer_batches_retried_total", (("model", "pnet"),))] == 0
    assert values[("streamer_batches_retried_total", (("model", "onet"),))] == 4
    assert values[("streamer_replica_recoveries_total", (("model", "pnet"),))] == 0
    assert values[("streamer_replica_recoveries_total", (("model", "onet"),))] == 2
    assert values[("streamer_frames_received_total", ())] == 20
    assert values[("streamer_frames_published_total", ())] == 12
    assert values[("streamer_frames_failed_total", (("reason", "decode_failed"),))] == 2
    assert values[("streamer_frames_failed_total", (("reason", "inference_failed"),))] == 1
    assert values[("streamer_frames_dropped_total", (("reason", "queue_full"),))] == 3
    assert values[("streamer_frames_in_flight", ())] == 20 - 12 - 3 - 3
    assert values[("streamer_queue_depth", (("queue", "batcher"),))] == 2
    assert values[("streamer_queue_depth", (("queue", "dequeue"),))] == 1
    assert values[("streamer_seq_gap_frames_total", ())] == 5
    assert values[("streamer_source_restarts_total", ())] == 1
    assert values[("streamer_sources_tracked", ())] == 3
    assert values[("streamer_sources_active", ())] == 2
    assert values[("streamer_new_thing", ())] == 7
    assert values[("process_resident_memory_bytes", ())] > 0


def frame(seq: int, model: str = "face", received_ms: int = 0) -> Frame:
    f = Frame("cam", seq, received_ms * MS, 0.0, model=model)
    f.infer_start_ns, f.infer_end_ns = (received_ms + 10) * MS, (received_ms + 14) * MS
    return f


def test_latencies_split_queue_inference_and_end_to_end_per_model() -> None:
    metrics = PipelineMetrics()
    good = [frame(0), frame(1, received_ms=2), frame(2, received_ms=4)]
    broken = Frame("cam", 3, 0, 0.0)
    broken.fail(FrameError(Reason.DECODE_FAILED, "cut"))
    metrics.observe_batch(Batch([*good, broken], good, rows=4))
    metrics.observe_batch(Batch([broken]))  # nothing executed
    for f in good:
        metrics.observe_sent(f, f.received_at_ns + 20 * MS)
    metrics.observe_sent(broken, 30 * MS)  # no model ran it
    values = scrape(metrics)
    face = (("model", "face"),)
    assert values[("streamer_batch_size_count", face)] == 1
    assert values[("streamer_batch_size_sum", face)] == 3
    assert values[("streamer_queue_duration_seconds_count", face)] == 3
    assert values[("streamer_queue_duration_seconds_sum", face)] == pytest.approx(0.030)
    assert values[("streamer_inference_duration_seconds_sum", face)] == pytest.approx(0.012)
    assert values[("streamer_end_to_end_duration_seconds_count", face)] == 3
    assert values[("streamer_end_to_end_duration_seconds_sum", face)] == pytest.approx(0.060)
    bucket = (("le", "0.025"), ("model", "face"))
    assert values[("streamer_end_to_end_duration_seconds_bucket", bucket)] == 3
    assert not any(labels == (("model", ""),) for _, labels in values)


def by_reason(metrics: PipelineMetrics, name: str) -> dict[str, float]:
    """The samples of counter ``name`` by their ``reason`` label."""
    return {dict(labels)["reason"]: v for (n, labels), v in scrape(metrics).items() if n == name}


def test_every_reason_is_exported_from_zero_under_the_counter_that_can_carry_it() -> None:
    metrics = PipelineMetrics()
    outcomes = OutcomeSnapshot(5, 1, {"decode_failed": 2, "new_failure": 1}, {"shutdown": 1})
    metrics.watch(lambda: PipelineSample(outcomes, {}, {}))
    failed = by_reason(metrics, "streamer_frames_failed_total")
    dropped = by_reason(metrics, "streamer_frames_dropped_total")
    reasons = {v for k, v in vars(Reason).items() if k.isupper() and isinstance(v, str)}
    assert (set(failed) - {"new_failure"}) | set(dropped) == reasons
    assert not set(failed) & set(dropped)
    assert set(dropped) == {
        "shutdown",
        "egress_blocked",
        "queue_full",
        "superseded",
        "stale_seq",
        "reload_given_up",
    }
    assert failed["decode_failed"] == 2 and failed["new_failure"] == 1 and failed["too_large"] == 0
    assert dropped["shutdown"] == 1 and dropped["queue_full"] == 0


def test_config_gauges_keep_the_time_of_the_last_config_in_force() -> None:
    metrics = PipelineMetrics()
    successful = ("streamer_config_last_reload_successful", ())
    at_s = ("streamer_config_last_reload_success_timestamp_seconds", ())
    metrics.observe_config(True, 1_700_000_000.0)
    assert scrape(metrics)[successful] == 1 and scrape(metrics)[at_s] == 1_700_000_000.0
    metrics.observe_config(False, 1_700_000_060.0)
    assert scrape(metrics)[successful] == 0 and scrape(metrics)[at_s] == 1_700_000_000.0
    metrics.observe_config(True, 1_700_000_120.0)
    assert scrape(metrics)[successful] == 1 and scrape(metrics)[at_s] == 1_700_000_120.0


def test_the_reload_gauge_reads_how_long_the_reload_under_way_has_run() -> None:
    metrics = PipelineMetrics()
    running = ("streamer_reload_in_progress_seconds", ())
    assert scrape(metrics)[running] == 0
    metrics.observe_reload(time.monotonic() - 90.0)
    assert 90.0 <= scrape(metrics)[running] < 3600.0
    metrics.observe_reload(None)
    assert scrape(metrics)[running] == 0


def test_the_reload_counter_counts_reloads_that_ended() -> None:
    """A script compares it before and after a SIGHUP (``systemctl reload`` on systemd < 253
    returns before the reload has even begun) to know the config gauges are the new ones."""
    metrics = PipelineMetrics()
    ended = ("streamer_config_reloads_total", ())
    assert scrape(metrics)[ended] == 0
    metrics.observe_reload(time.monotonic())
    assert scrape(metrics)[ended] == 0
    metrics.observe_reload(None)
    metrics.observe_reload(None)  # nothing was under way
    assert scrape(metrics)[ended] == 1


def models_labelled(metrics: PipelineMetrics) -> set[str]:
    """Every ``model`` label value in a scrape."""
    return {dict(labels)["model"] for _, labels in scrape(metrics) if "model" in dict(labels)}


def test_a_model_out_of_service_loses_its_series_and_one_still_in_it_counts_on() -> None:
    """A reload renames ``face`` to ``face_b`` and keeps ``onet``: ``face``'s series go, and a
    result of it still on its way to egress does not bring them back; ``onet`` counts on."""
    metrics = PipelineMetrics()
    for model in ("face", "onet"):
        f = frame(0, model)
        metrics.observe_batch(Batch([f], [f], rows=2))
        metrics.observe_sent(f, 20 * MS)
    assert models_labelled(metrics) == {"face", "onet"}
    metrics.models_in_service(["face_b", "onet"])
    late, onet, renamed = frame(1, "face"), frame(1, "onet"), frame(1, "face_b")
    for f in (late, onet, renamed):
        metrics.observe_batch(Batch([f], [f], rows=1))
        metrics.observe_sent(f, 20 * MS)
    values = scrape(metrics)
    assert models_labelled(metrics) == {"face_b", "onet"}
    assert values[("streamer_batch_rows_total", (("model", "onet"),))] == 3
    assert values[("streamer_end_to_end_duration_seconds_count", (("model", "onet"),))] == 2
    assert values[("streamer_batch_size_count", (("model", "face_b"),))] == 1
