"""Reading the daemon's ``/metrics``: every sample summed over its labels, and differences.

A histogram ``h`` gives ``h_sum`` and ``h_count`` (and buckets), a counter ``c`` gives
``c_total``; the difference of two scrapes around a run is what happened during the run.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["MetricsDelta", "scrape"]

_TIMEOUT_S = 10.0


def scrape(url: str) -> dict[str, float]:
    """Sample name → value, summed over label sets (``_bucket`` samples left out).

    Raises:
        OSError: the endpoint did not answer.
    """
    with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
        text = response.read().decode()
    values: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                values[sample.name] += sample.value
    return dict(values)


@dataclass(frozen=True)
class MetricsDelta:
    """The change of every sample between two scrapes."""

    values: dict[str, float]

    @classmethod
    def between(cls, before: dict[str, float], after: dict[str, float]) -> MetricsDelta:
        return cls({name: value - before.get(name, 0.0) for name, value in after.items()})

    def get(self, name: str) -> float:
        """The change of sample ``name``; 0.0 when it is not exported."""
        return self.values.get(name, 0.0)

    def mean(self, histogram: str) -> float | None:
        """Mean of the observations of ``histogram`` during the run; None if there were none."""
        count = self.get(f"{histogram}_count")
        return self.get(f"{histogram}_sum") / count if count > 0 else None
