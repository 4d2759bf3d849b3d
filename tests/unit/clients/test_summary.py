"""Summary: the frames without a result, and a bounded latency sample."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamer.clients import LATENCY_SAMPLE_SIZE, Summary


def _result(source: str, seq: int, run: str | None = "r1", total_ms: float = 5.0) -> dict[str, Any]:
    return {"source": source, "seq": seq, "run": run, "latency_ms": {"total": total_ms}}


def _eos(source: str, seq: int, run: str | None = "r1") -> dict[str, Any]:
    return {"source": source, "seq": seq, "run": run, "eos": True}


def _summary(*results: dict[str, Any]) -> Summary:
    summary = Summary()
    for result in results:
        summary.add(result)
    return summary


def test_missing_counts_the_seqs_of_an_ended_run_without_a_result() -> None:
    """The slow joiner's lost first results, and gaps (frames the daemon dropped), are
    counted per source once its end of stream came; a source still streaming is not."""
    cam = [_result("cam", seq) for seq in (3, 4, 6, 5, 9, 4)]  # 0-2, 7, 8 lost; 4 repeated
    door = [_result("door", seq) for seq in range(5)]
    summary = _summary(*cam, *door, _eos("cam", 10), _eos("door", 4), _result("yard", 7))
    assert summary.as_dict()["missing"] == {"cam": 6, "door": 0}  # 0, 1, 2, 7, 8 and 10


def test_missing_is_counted_per_run_of_a_source() -> None:
    """A run ends while the next one has begun: only the ended run's seqs count, and the
    other run's results are not forgotten by its end of stream."""
    results = [_result("cam", 0, "r1"), _result("cam", 0, "r2"), _result("cam", 2, "r1")]
    results += [_eos("cam", 2, "r1"), _result("cam", 1, "r2"), _eos("cam", 1, "r2")]
    assert _summary(*results).missing == {"cam": 1}


def test_an_end_of_stream_alone_counts_what_it_can() -> None:
    """An eos of seq 5 and no result: 6 frames missing. An eos of seq 0 and no result is
    also what a producer that sent nothing sends: nothing counted."""
    assert _summary(_eos("a", 5), _eos("b", 0), _eos("c", 0, run=None)).missing == {
        "a": 6,
        "b": 0,
        "c": 0,
    }


def test_latencies_are_a_bounded_sample_beyond_its_size() -> None:
    """Every latency was kept (32 MB per million results); now a uniform sample of
    LATENCY_SAMPLE_SIZE, exact below it, with percentiles close to the true ones."""
    values = np.random.default_rng(3).permutation(LATENCY_SAMPLE_SIZE * 3).astype(float)
    summary = Summary()
    for seq, value in enumerate(values[:LATENCY_SAMPLE_SIZE]):
        summary.add(_result("cam", seq, total_ms=float(value)))
    exact = np.percentile(values[:LATENCY_SAMPLE_SIZE], [50, 95, 99]).round(3).tolist()
    assert list(summary.latency_percentiles_ms().values()) == exact

    for seq, value in enumerate(values[LATENCY_SAMPLE_SIZE:], LATENCY_SAMPLE_SIZE):
        summary.add(_result("cam", seq, total_ms=float(value)))
    assert len(summary.latencies_ms) == LATENCY_SAMPLE_SIZE
    assert summary.latency_count == len(values)
    true = np.percentile(values, [50, 95, 99])
    sampled = list(summary.latency_percentiles_ms().values())
    assert all(abs(s - t) < 0.01 * len(values) for s, t in zip(sampled, true, strict=True))
