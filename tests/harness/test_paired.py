"""The statistics of the overhead benchmark (benchmarks/paired.py), on constructed throughputs."""

from __future__ import annotations

import math

import pytest

from benchmarks import paired

NOISY = [
    0.86,
    1.21,
    0.93,
    1.08,
    0.97,
    1.12,
    0.89,
    1.04,
    0.95,
    1.15,
]  # per-pair ratios seen on a loaded host


def test_ratio_is_b_over_a_per_pair():
    assert paired.pair_ratios([90.0, 110.0], [100.0, 100.0]) == [0.9, 1.1]


@pytest.mark.parametrize("b, a", [([1.0], [1.0, 2.0]), ([], []), ([1.0], [0.0]), ([-1.0], [1.0])])
def test_ratios_refuse_unpaired_or_non_positive_runs(b, a):
    with pytest.raises(ValueError):
        paired.pair_ratios(b, a)


def test_constant_ratio_gives_a_zero_width_interval_at_that_ratio():
    standalone = [80.0, 100.0, 120.0, 64.0, 96.0, 72.0]
    harness = [0.75 * v for v in standalone]  # exact in binary: every ratio is exactly 0.75
    c = paired.compare(harness, standalone)
    assert c.ratios == [0.75] * 6
    assert (c.median, c.low, c.high) == (0.75, 0.75, 0.75)
    assert c.verdict == "slower" and c.exit_code == 1


def test_two_pairs_give_the_exact_bootstrap_interval():
    # Resampling [0.9, 1.1] gives the median 0.9, 1.0 or 1.1 with probabilities 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% quantiles of the resampled medians are the two values themselves.
    assert paired.median_interval([0.9, 1.1]) == (0.9, 1.1)


def test_bootstrap_resamples_with_replacement():
    medians = paired.bootstrap_medians([0.9, 1.1], resamples=10_000, seed=0)
    share = medians.count(0.9) / len(medians)
    sd = math.sqrt(0.25 * 0.75 / len(medians))  # binomial standard deviation of that share
    assert abs(share - 0.25) < 5 * sd
    assert medians == sorted(medians) and len(medians) == 10_000


def test_tight_set_around_one_is_within_three_percent():
    ratios = [0.995, 1.002, 0.998, 1.004, 1.000, 0.997, 1.003, 1.001]
    c = paired.compare(ratios, [1.0] * len(ratios))
    assert min(ratios) <= c.low <= c.median <= c.high <= max(ratios)
    assert c.median == pytest.approx(1.0005, abs=1e-12)
    assert c.verdict == "within" and c.exit_code == 0
    assert (
        c.sentence("harness", "standalone")
        == "within 3%: harness costs at most 3% of standalone's speed"
    )


def test_tight_set_around_point_nine_is_slower():
    ratios = [0.895, 0.902, 0.898, 0.904, 0.900, 0.897, 0.903, 0.901]
    c = paired.compare(ratios, [1.0] * len(ratios))
    assert c.high <= max(ratios) < 0.97
    assert c.verdict == "slower" and c.exit_code == 1


def test_wide_noisy_set_is_inconclusive():
    c = paired.compare(NOISY, [1.0] * len(NOISY))
    assert c.low < 0.97 <= c.high
    assert c.verdict == "inconclusive" and c.exit_code == 3
    assert c.sentence() == "inconclusive: too noisy, 10 pairs; run more pairs"


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (0.97, 1.20, "within"),  # the lower bound may touch the limit
        (1.04, 1.08, "within"),  # faster is also "costs at most 3%"
        (0.90, 0.9699, "slower"),
        (0.90, 0.97, "inconclusive"),  # the upper bound touches the limit: not shown slower
        (0.96, 0.98, "inconclusive"),
    ],
)
def test_verdict_is_read_off_the_interval(low, high, expected):
    assert paired.verdict(low, high, tolerance=0.03) == expected


def test_tolerance_moves_the_limit():
    assert paired.verdict(0.95, 0.98, tolerance=0.05) == "within"
    assert paired.verdict(0.95, 0.98, tolerance=0.03) == "inconclusive"
    assert paired.verdict(0.95, 0.98, tolerance=0.01) == "slower"


def test_same_seed_same_interval_other_seed_other_resamples():
    assert paired.median_interval(NOISY, seed=7) == paired.median_interval(NOISY, seed=7)

    def medians(seed):
        return paired.bootstrap_medians(NOISY, resamples=200, seed=seed)

    assert medians(7) == medians(7)
    assert medians(7) != medians(8)


def test_higher_confidence_gives_a_wider_interval():
    low90, high90 = paired.median_interval(NOISY, confidence=0.90)
    low99, high99 = paired.median_interval(NOISY, confidence=0.99)
    assert low99 <= low90 < high90 <= high99 and (low99, high99) != (low90, high90)


def test_fewest_pairs_whose_range_reaches_the_confidence():
    # n pairs' range misses the median with probability 2 * 0.5^n: 5 pairs 6.25%, 6 pairs 3.1%, 8 pairs 0.8%.
    assert paired.min_pairs(0.95) == 6
    assert paired.min_pairs(0.99) == 8


def test_too_few_pairs_are_inconclusive_even_when_all_are_slower():
    ratios = [
        0.895,
        0.902,
        0.898,
        0.904,
        0.900,
    ]  # the range of 5 pairs misses the median 1 time in 16
    c = paired.compare(ratios, [1.0] * len(ratios))
    assert c.high < 0.97 and paired.verdict(c.low, c.high) == "slower"
    assert c.verdict == "inconclusive" and c.exit_code == 3
    assert c.sentence() == "inconclusive: 5 pairs are too few for a 95% interval; run at least 6"
