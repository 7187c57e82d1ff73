"""How the backend tests judge numbers, so that a verdict does not depend on the CPU that ran it.

* Identity of math is proven in float64 (the equivalence API's dtype="float64"): two implementations
  of the same computation agree to rounding of float64, far below IDENTICAL; a real difference (a
  wrong reduction, another BatchNorm convention, a missing division) is many orders above it.
* A float32 claim gets a tolerance measured in the same test: FLOOR_FACTOR x how far float32 is from
  float64 for the computations compared, on this machine's kernels. By the triangle inequality, two
  float32 results that are each that close to the exact value are within 2x of each other; never a
  constant tuned on one CPU.
"""

from __future__ import annotations

import numpy as np

IDENTICAL = 1e-10  # float64: relative difference of two implementations of the same math
FLOOR_FACTOR = 3  # float32 tolerance = FLOOR_FACTOR x the measured float32-vs-float64 distance
# The side of the images the ResNet-18 steps of the tests take (the network pools globally: 8 x 8 leaves 1 x 1 after
# its three halvings). What they prove is the step's math, which no image size changes, and float64 convolutions are
# the slowest part of the backend suites: 28 x 28, Fashion-MNIST's, took 12 times as many.
RESNET18_SIDE = 8


def max_abs_diff(a: dict, b: dict) -> float:
    """The largest |a - b| over every entry (the same keys in both), computed in float64."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(
        float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64))))
        for k in a
    )


def bitwise_equal(a: dict, b: dict) -> bool:
    """The same keys, and every array the same to the last bit: what reordering no sum can give by chance."""
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def scale(a: dict) -> float:
    """The largest |value| in `a`: what a relative figure is relative to."""
    return max(float(np.max(np.abs(np.asarray(v, np.float64)))) for v in a.values())


def relative(a: dict, b: dict) -> float:
    """max |a - b| / max |b|: a difference that does not depend on the size of the numbers."""
    return max_abs_diff(a, b) / scale(b)


def float32_tolerance(*pairs: tuple[dict, dict]) -> float:
    """FLOOR_FACTOR x the largest max |float32 - float64| over the (float32 result, float64 result) pairs,
    each pair the same computation run in both precisions in this test."""
    return FLOOR_FACTOR * max(max_abs_diff(f32, f64) for f32, f64 in pairs)


BF16_EPSILON = 2.0**-7  # bfloat16's spacing at 1 (8 significant bits; float32's is 2 ** -23)


def update_distance(start: dict, a: dict, b: dict) -> float:
    """|update a - update b| / |update b| (L2 over every weight): how far a step from `start` is from another,
    relative to the step's own size."""
    diff = sum(
        float(np.sum(((a[k] - start[k]) - (b[k] - start[k])).astype(np.float64) ** 2))
        for k in start
    )
    norm = sum(float(np.sum((b[k] - start[k]).astype(np.float64) ** 2)) for k in start)
    return float(np.sqrt(diff / norm))
