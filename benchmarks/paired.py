"""Statistics of a paired speed comparison: is B within a given fraction of A's speed?

Each pair is one run of A and one of B, back to back, so that both see the same machine load; the
figure is the median of the per-pair ratios B / A, and its uncertainty a percentile bootstrap
interval of that median (the pairs resampled with replacement). The verdict is read off the interval,
never off the point value, so a noisy machine gives "inconclusive" rather than a wrong answer:

  low >= 1 - tolerance    "within": B costs at most `tolerance` of A's speed (B may also be faster)
  high < 1 - tolerance    "slower": B is slower than A by more than `tolerance`
  otherwise               "inconclusive": the interval straddles the limit; more pairs narrow it

With n pairs even the range of the ratios covers the true median only with probability 1 - 2^(1-n)
(each ratio falls on either side of it with probability 1/2), so below `min_pairs(confidence)` pairs
(6 for 95%) no interval can be trusted and the verdict is "inconclusive" whatever the interval says.

Standard library only, so that it runs in any interpreter and is tested without a framework.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
RESAMPLES = 10_000
TOLERANCE = 0.03
EXIT_CODES = {"within": 0, "slower": 1, "inconclusive": 3}


def pair_ratios(b: list[float], a: list[float]) -> list[float]:
    """b[i] / a[i] for each pair (e.g. harness images/s over standalone images/s)."""
    if len(a) != len(b) or not a:
        raise ValueError(
            f"need the same number of runs on both sides, at least one (got {len(b)} and {len(a)})"
        )
    if min(a) <= 0 or min(b) <= 0:
        raise ValueError("throughputs must be positive")
    return [bi / ai for bi, ai in zip(b, a)]


def bootstrap_medians(
    values: list[float], resamples: int = RESAMPLES, seed: int = 0
) -> list[float]:
    """The median of each of `resamples` resamples (with replacement, same size) of `values`, sorted."""
    rng = random.Random(seed)
    return sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))


def median_interval(
    values: list[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median: the (1-c)/2 and (1+c)/2 quantiles of the resampled medians."""
    medians = bootstrap_medians(values, resamples, seed)
    cut = round((1 - confidence) / 2 * resamples)  # resampled medians left out on each side
    return medians[cut], medians[resamples - 1 - cut]


def min_pairs(confidence: float = CONFIDENCE) -> int:
    """The fewest pairs whose range covers the median with probability >= confidence: 1 - 2^(1-n) >= c."""
    n = 1
    while 1 - 2 * 0.5**n < confidence:
        n += 1
    return n


def verdict(low: float, high: float, tolerance: float = TOLERANCE) -> str:
    """'within', 'slower' or 'inconclusive' for an interval of the ratio B / A (see the module docstring)."""
    limit = 1 - tolerance
    if low >= limit:
        return "within"
    if high < limit:
        return "slower"
    return "inconclusive"


@dataclass(frozen=True)
class Comparison:
    ratios: list[float]
    median: float
    low: float
    high: float
    confidence: float
    tolerance: float
    verdict: str

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def too_few_pairs(self) -> bool:
        return len(self.ratios) < min_pairs(self.confidence)

    def sentence(self, b: str = "B", a: str = "A") -> str:
        percent = f"{100 * self.tolerance:g}%"
        if self.verdict == "within":
            return f"within {percent}: {b} costs at most {percent} of {a}'s speed"
        if self.verdict == "slower":
            return f"slower by more than {percent}: {b} is slower than {a}"
        if self.too_few_pairs:
            return (
                f"inconclusive: {len(self.ratios)} pairs are too few for a {100 * self.confidence:g}% interval; "
                f"run at least {min_pairs(self.confidence)}"
            )
        return f"inconclusive: too noisy, {len(self.ratios)} pairs; run more pairs"


def compare(
    b: list[float],
    a: list[float],
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
    tolerance: float = TOLERANCE,
) -> Comparison:
    """Per-pair ratios b / a, their median, its bootstrap interval and the verdict on that interval."""
    ratios = pair_ratios(b, a)
    low, high = median_interval(ratios, confidence, resamples, seed)
    decided = (
        verdict(low, high, tolerance) if len(ratios) >= min_pairs(confidence) else "inconclusive"
    )
    return Comparison(ratios, statistics.median(ratios), low, high, confidence, tolerance, decided)
