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


def with_float64(arrays: dict, model: str, runs, grad_error: float, trace_error: float = 0.0, math_error: float = 0.0):
    """Add what the reference worker writes in float64: the float32 runs are `grad_error` away from it."""
    out = dict(arrays)
    for strategy, k, bn in runs:
        key, f64 = f"{model}|{strategy}|{k}|{bn}", f"{model}|float64|{k}|{bn}"
        out[f"{f64}|loss"] = arrays[f"{key}|loss"]
        out[f"{f64}|losses"] = arrays[f"{key}|losses"] + trace_error
        for name in check._trainable(model):
            out[f"{f64}|grad|{name}"] = arrays[f"{key}|grad|{name}"] * (1 + grad_error)
            out[f"{f64}|first|{name}"] = arrays[f"{key}|first|{name}"]
    out[f"{model}|float64|loss"] = np.float64(2.3 * (1 + math_error))
    for name in check._trainable(model):
        out[f"{model}|float64|grad|{name}"] = np.full(w0_shape(model, name), 0.5) * (1 + math_error)
    return out


def w0_shape(model: str, name: str) -> tuple:
    return next(shape for n, shape, _ in architectures.spec(model) if n == name)


def test_float32_rounding_widens_the_tolerance_but_different_math_still_fails():
    w0 = {"resnet18": weights.initial_weights("resnet18", 0)}
    runs = (("ddp", 1, "local"),)
    torch = with_float64(measurements("resnet18", w0["resnet18"], runs=runs), "resnet18", runs, grad_error=5e-3)
    close = with_float64(measurements("resnet18", w0["resnet18"], scale=8e-3, runs=runs), "resnet18", runs, 0)
    wrong = with_float64(measurements("resnet18", w0["resnet18"], scale=0.2, runs=runs), "resnet18", runs, 0)
    rows = check.compare({"torch": (torch, {}), "jax": (close, {}), "mxnet": (wrong, {})}, w0)
    (grad,) = by(rows, backend="jax", check="gradients")
    # the larger float32 error sets it: jax's own (8e-3 from its float64 gradient) over torch's (5e-3)
    assert grad.status == "ok" and abs(grad.tolerance - 3 * 8e-3) < 1e-9 and "float32-vs-float64" in grad.note
    assert by(rows, backend="mxnet", check="gradients")[0].status == "FAIL"
    assert by(rows, backend="mxnet", check="float32 vs float64")[0].status == "FAIL"   # 0.2: not rounding
    # the float64 rows: the same math to 1e-10
    assert by(rows, backend="jax", check="math (float64)")[0].status == "ok"


def test_float64_row_fails_when_the_math_differs():
    w0 = {"lenet": weights.initial_weights("lenet", 0)}
    runs = (("ddp", 1, "local"),)
    torch = with_float64(measurements("lenet", w0["lenet"], runs=runs), "lenet", runs, 0)
    other = with_float64(measurements("lenet", w0["lenet"], runs=runs), "lenet", runs, 0, math_error=1e-8)
    (row,) = by(check.compare({"torch": (torch, {}), "jax": (other, {})}, w0), check="math (float64)")
    assert row.status == "FAIL" and abs(row.value - 1e-8) < 1e-12


def test_a_chaotic_float32_trace_is_measured_not_judged():
    w0 = {"resnet18": weights.initial_weights("resnet18", 0)}
    runs = (("ddp", 1, "local"),)
    torch = with_float64(measurements("resnet18", w0["resnet18"], runs=runs), "resnet18", runs, 0, trace_error=0.5)
    other = with_float64(measurements("resnet18", w0["resnet18"], scale=0.3, runs=runs), "resnet18", runs, 0)
    rows = check.compare({"torch": (torch, {}), "jax": (other, {})}, w0)
    (trace,) = by(rows, backend="jax", check="3-step loss")
    assert trace.status == "measured" and "chaotic" in trace.note and abs(trace.value - 0.3) < 1e-9
