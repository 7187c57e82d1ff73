"""The equivalence table's comparisons, on hand-made measurements (no framework needed)."""

from __future__ import annotations

import numpy as np

from common import architectures, weights
from harness import check


def measurements(model: str, w0: dict, scale: float = 0.0, runs=((("ddp", 1, "local")), ("ddp", 2, "local"))):
    """What a backend's check worker writes; `scale` perturbs everything by that much."""
    rng = np.random.default_rng(1)
    out = {f"{model}|forward|train": np.ones((4, 10)) + scale, f"{model}|forward|eval": np.ones((4, 10))}
    for strategy, k, bn in runs:
        key = f"{model}|{strategy}|{k}|{bn}"
        out[f"{key}|loss"] = np.float64(2.3 * (1 + scale))
        out[f"{key}|losses"] = np.full(3, 2.3) + scale
        for name, shape, kind in architectures.spec(model):
            if kind in ("bn_mean", "bn_var"):
                continue
            out[f"{key}|grad|{name}"] = np.full(shape, 0.5) * (1 + scale)
            out[f"{key}|first|{name}"] = w0[name] - 0.05 * (1 + scale) + (1e-3 if k == 2 and bn == "local" else 0)
    return out


def by(rows, **kw):
    return [r for r in rows if all(getattr(r, k) == v for k, v in kw.items())]


def test_identical_measurements_pass_and_perturbed_ones_fail():
    w0 = {"lenet": weights.initial_weights("lenet", 0)}
    rows = check.compare({"torch": (measurements("lenet", w0["lenet"]), {}),
                          "jax": (measurements("lenet", w0["lenet"]), {}),
                          "mxnet": (measurements("lenet", w0["lenet"], scale=1e-2), {"lenet|scratch|2|sync": "no"})}, w0)
    assert all(r.status == "ok" for r in by(rows, backend="jax") if r.check != "k vs 1 device")
    assert by(rows, backend="mxnet", check="gradients")[0].status == "FAIL"
    assert abs(by(rows, backend="mxnet", check="forward", strategy="(train mode)")[0].value - 1e-2) < 1e-12
    assert by(rows, backend="mxnet", check="forward", strategy="(eval mode)")[0].status == "ok"
    # LeNet k vs 1: the planted 1e-3 difference at 2 devices fails the 1e-5 tolerance
    assert by(rows, backend="jax", check="k vs 1 device")[0].status == "FAIL"
    assert by(rows, backend="mxnet", status="not run")[0].note == "no"


def test_resnet_per_device_batchnorm_difference_is_measured_not_failed():
    w0 = {"resnet18": weights.initial_weights("resnet18", 0)}
    runs = (("ddp", 1, "local"), ("ddp", 2, "local"))
    rows = check.compare({"torch": (measurements("resnet18", w0["resnet18"], runs=runs), {})}, w0)
    (k_vs_1,) = by(rows, check="k vs 1 device")
    assert k_vs_1.status == "measured" and abs(k_vs_1.value - 1e-3) < 1e-8
    assert "| k vs 1 device | resnet18 | torch | ddp | 2 | local | 1.00e-03 | — | measured" in "\n".join(check.table(rows))
