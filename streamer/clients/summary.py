"""Statistics over a subscriber's results: counts, order, frames without a result, latency.

Its memory is bounded whatever the number of results: latencies are a fixed-size sample and
the ``seq`` values seen are kept as ranges, per source for its latest runs only.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter
from typing import Any

import numpy as np

from streamer.errors import Reason
from streamer.scheduling.sources import MAX_RUNS

__all__ = ["LATENCY_SAMPLE_SIZE", "Summary"]

LATENCY_SAMPLE_SIZE = 100_000
"""Latencies a :class:`Summary` keeps (0.8 MB): every one below that many results, a
uniform random sample of them above (reservoir sampling, a fixed seed)."""


class Summary:
    """Accumulates statistics over result dicts; feed it with :meth:`add`. Not thread-safe.

    Attributes:
        per_source: results per source (``eos`` results not counted).
        errors: error results by ``error.reason``.
        detections: frames without error by number of detections: ``0``, ``1``, ``2+``.
        out_of_order: results whose ``seq`` is not above every earlier seq of their source's
            ``run`` since its last restart or end of stream. The daemon's rules (README,
            "Wire protocol") decide: ``seq`` counts per run (the latest
            :data:`~streamer.scheduling.sources.MAX_RUNS` of a source), a ``seq`` of 0 is a
            restart, and after an ``eos`` any
            ``seq`` starts the count anew; a ``bad_header`` result, whose ``seq`` nobody
            vouches for, is judged only when it is the next one (``last + 1``). A restart
            with a counter not at 0, which the daemon confirms by a frame it drops, is not
            seen here: its results count until they pass the old ``seq``.
        eos: sources whose ``eos`` result arrived.
        missing: per source whose ``eos`` result arrived, the frames of the ended runs
            without a result: the ``seq`` values 0 to the ``eos`` result's ``seq`` of that
            run that no result had (only the source's latest
            :data:`~streamer.scheduling.sources.MAX_RUNS` runs are followed). Results lost
            by the subscriber (it joined late or fell behind the daemon's PUB high-water
            mark) and frames the daemon dropped by policy (``stale_seq``, ``queue_full``,
            ``shutdown``: no result follows them) both count. An ``eos`` of seq 0 with no
            result of its run counts nothing: it is also what a producer that sent no frame
            sends.
        latencies_ms: ``latency_ms.total`` of the results that have it (ms): every one up
            to :data:`LATENCY_SAMPLE_SIZE`, a uniform sample of that many beyond.
        latency_count: the results that had ``latency_ms.total``.
    """

    def __init__(self) -> None:
        self.per_source: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.detections: Counter[str] = Counter({"0": 0, "1": 0, "2+": 0})
        self.out_of_order = 0
        self.eos: set[str] = set()
        self.missing: Counter[str] = Counter()
        self.latencies_ms: list[float] = []
        self.latency_count = 0
        self._sampler = random.Random(0)
        self._max_seq: dict[str, dict[str | None, int]] = {}
        """Per source, the highest ``seq`` of each of its latest runs, the oldest first."""
        self._seen: dict[str, dict[str | None, _SeqRanges]] = {}
        """Per source, the ``seq`` values with a result of each of its latest runs."""

    def add(self, result: dict[str, Any]) -> None:
        """Count one result dict as yielded by :meth:`Subscriber.results`."""
        source = str(result.get("source", ""))
        run = result.get("run") if isinstance(result.get("run"), str) else None
        if result.get("eos") is True:
            self._end(source, run, result.get("seq"))
            return
        self.per_source[source] += 1
        self._check_order(source, run, result)
        if isinstance(seq := result.get("seq"), int) and seq >= 0:
            self._record_seq(source, run, seq)
        total = (result.get("latency_ms") or {}).get("total")
        if isinstance(total, (int, float)):
            self._sample_latency(float(total))
        if result.get("error"):
            self.errors[str(result["error"].get("reason", "unknown"))] += 1
        else:
            found = len(result.get("detections") or [])
            self.detections["2+" if found >= 2 else str(found)] += 1

    def latency_percentiles_ms(self) -> dict[str, float | None]:
        """p50, p95 and p99 of ``latency_ms.total`` (ms, linear interpolation, over
        :attr:`latencies_ms`); None if empty."""
        if not self.latencies_ms:
            return {"p50": None, "p95": None, "p99": None}
        p50, p95, p99 = (round(float(v), 3) for v in np.percentile(self.latencies_ms, [50, 95, 99]))
        return {"p50": p50, "p95": p95, "p99": p99}

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy of every statistic."""
        return {
            "results": sum(self.per_source.values()),
            "per_source": dict(sorted(self.per_source.items())),
            "errors": dict(sorted(self.errors.items())),
            "detections_per_frame": dict(self.detections),
            "out_of_order": self.out_of_order,
            "eos": sorted(self.eos),
            "missing": dict(sorted(self.missing.items())),
            "latency_ms": self.latency_percentiles_ms(),
        }

    def _end(self, source: str, run: str | None, seq: Any) -> None:
        """An ``eos`` result: count its run's frames without a result, forget the run."""
        self.eos.add(source)
        self._max_seq.pop(source, None)
        seen = self._seen.get(source, {}).pop(run, _SeqRanges())
        self.missing.setdefault(source, 0)
        if isinstance(seq, int) and (seq > 0 or seen):
            self.missing[source] += seq + 1 - seen.count_to(seq)

    def _record_seq(self, source: str, run: str | None, seq: int) -> None:
        runs = self._seen.setdefault(source, {})
        seen = runs.get(run)
        _remember(runs, run, seen if seen is not None else _SeqRanges())
        runs[run].add(seq)

    def _sample_latency(self, value_ms: float) -> None:
        """Keep ``value_ms`` in a uniform sample of :data:`LATENCY_SAMPLE_SIZE` (algorithm R)."""
        self.latency_count += 1
        if len(self.latencies_ms) < LATENCY_SAMPLE_SIZE:
            self.latencies_ms.append(value_ms)
        elif (slot := self._sampler.randrange(self.latency_count)) < LATENCY_SAMPLE_SIZE:
            self.latencies_ms[slot] = value_ms

    def _check_order(self, source: str, run: str | None, result: dict[str, Any]) -> None:
        runs = self._max_seq.setdefault(source, {})
        seq, last = result.get("seq"), runs.get(run)
        refused = (result.get("error") or {}).get("reason") == Reason.BAD_HEADER
        if not isinstance(seq, int) or (refused and (last is None or seq != last + 1)):
            return
        if last is not None and seq != 0 and seq <= last:
            self.out_of_order += 1
            return
        _remember(runs, run, seq)


def _remember(runs: dict[str | None, Any], run: str | None, value: Any) -> None:
    """Set ``runs[run]`` as the latest run (the last key), forgetting the oldest beyond
    :data:`~streamer.scheduling.sources.MAX_RUNS`."""
    runs.pop(run, None)
    if len(runs) >= MAX_RUNS:
        del runs[next(iter(runs))]
    runs[run] = value


class _SeqRanges:
    """Distinct ``seq`` values as sorted, disjoint, non-adjacent ``[first, last]`` ranges:
    one range while they arrive without a gap, so memory grows with the gaps only."""

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def add(self, seq: int) -> None:
        """Record ``seq`` (>= 0); a repeated one changes nothing."""
        at = bisect.bisect_right(self._firsts, seq)
        if at and self._lasts[at - 1] >= seq:
            return
        joins_before = at > 0 and self._lasts[at - 1] == seq - 1
        joins_after = at < len(self._firsts) and self._firsts[at] == seq + 1
        if joins_before and joins_after:
            self._lasts[at - 1] = self._lasts.pop(at)
            del self._firsts[at]
        elif joins_before:
            self._lasts[at - 1] = seq
        elif joins_after:
            self._firsts[at] = seq
        else:
            self._firsts.insert(at, seq)
            self._lasts.insert(at, seq)

    def count_to(self, last: int) -> int:
        """The values recorded in ``0..last``."""
        return sum(
            min(end, last) - first + 1
            for first, end in zip(self._firsts, self._lasts, strict=True)
            if first <= last
        )
